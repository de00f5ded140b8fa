"""The retention forward for serving on torch, written for a GPU (static shapes, SDPA, CUDA graphs).

Imports torch and ``retention_core`` only, never ``training`` or ``service``: the service's torch backend
(``service.backends.torch_backend``) runs it, and the export (``training.export``) checks it against the
ONNX graph before a model directory is written. The serving image without torch never imports it.

- ``weights``: the tensor names of ``weights.safetensors`` and loading them in the serving dtype.
- ``forward``: the math (a ``Plan`` fixes every shape; selection, merging, SDPA).
- ``runner``: shape buckets, plans, one CUDA graph per plan.
"""

"""The retention forward for serving on torch, written for a GPU (static shapes, SDPA, CUDA graphs).

Imports torch and ``retention_core`` only, never ``training`` or ``service``: the service's torch backend
(``service.backends.torch_backend``) runs it, and the export (``training.export.torch_weights``) checks it
against the ONNX graph before a model directory is written. The serving image without torch never imports it.

- ``weights``: the tensor names of ``weights.safetensors`` and loading them in the serving dtype.
- ``forward``: the math (a ``Plan`` fixes every shape; selection, merging, SDPA).
- ``runner``: shape buckets, plans (those a server's runs meet captured at load), one CUDA graph per plan.
- ``capture``: a runner's placement on a device (its guard) and capture with several models in one
  process (one at a time per device, thread-local mode, a stream per runner).
"""

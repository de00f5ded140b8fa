"""Adaptive Retention serving: tokenizers + FastAPI over a backend, onnxruntime by default. torch is imported
only by the torch backend (``service.backends.torch_backend``), and only when ``RETENTION_BACKEND=torch``."""

"""Adaptive Retention serving: onnxruntime + tokenizers + FastAPI. Never imports torch."""

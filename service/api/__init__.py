"""HTTP layer: FastAPI app (``service.api.app.create_app``), routers, dependencies, schemas.

Written against ``service.serving`` only: nothing here but the composition root ``app`` imports
onnxruntime or the modules that hold a session (``tests/test_layering.py``)."""

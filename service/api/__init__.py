"""HTTP layer: FastAPI app, routers, dependencies, schemas."""

from service.api.app import create_app

__all__ = ["create_app"]

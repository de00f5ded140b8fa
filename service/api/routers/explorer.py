"""GET /explorer: the retention explorer, a static page (HTML, JS, CSS shipped in ``service/static``).

The page itself needs no API key (it holds no data; it asks the user for the key and sends it with
its API calls). No CDN and no build step: three files read from the installed package, and the tasks'
own views (``/explorer/views.js``), each read from its task package beside its face.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from service.api.faces import FACES

router = APIRouter(tags=["explorer"])

# name -> media type: the only files served, so no path from the request ever reaches the file system
ASSETS = {
    "explorer.html": "text/html; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
NO_STORE = {"Cache-Control": "no-cache"}  # a redeployed service serves its own page at once


def asset(name: str) -> Response:
    content = resources.files("service").joinpath("static", name).read_bytes()
    return Response(content, media_type=ASSETS[name], headers=NO_STORE)


@router.get("/explorer", include_in_schema=False)
async def explorer_page() -> Response:
    """The explorer page."""
    return asset("explorer.html")


@router.get("/explorer/views.js", include_in_schema=False)
async def explorer_views() -> Response:
    """The tasks' own views (``TaskFace.view``, each its task package's script) in one script that sets
    ``VIEWS``, read before the page's: a task without one gets the page's generic view."""
    views = [face.view.read_text(encoding="utf-8") for face in FACES.values() if face.view is not None]
    content = "\n".join(["const VIEWS = {};", *views])
    return Response(content, media_type=ASSETS["explorer.js"], headers=NO_STORE)


@router.get("/explorer/{name}", include_in_schema=False)
async def explorer_asset(name: str) -> Response:
    """The page's script and style sheet."""
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail="no such explorer file")
    return asset(name)

"""Who may call what: the inference API key, the opt-in admin routes and their own key, and an OpenAPI
document that declares security exactly where the server enforces it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, reload_models, running, settings_for

API_KEY = "api-s3cret"
TEXT = "only the right key opens the door"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def security_of(openapi: dict[str, Any], path: str, method: str = "post") -> list[dict[str, list[str]]]:
    security: list[dict[str, list[str]]] = openapi["paths"][path][method].get("security", [])
    return security


def test_admin_routes_do_not_exist_by_default(models_root: Path) -> None:
    """Model control is opt-in (as in Triton): without an admin key nobody can reload, key or not."""
    for overrides in ({}, {"api_key": API_KEY}):
        with running(settings_for(models_root, **overrides)) as (_, client):
            for headers in ({}, bearer(API_KEY)):
                response = client.post("/admin/reload", headers=headers)
                assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
            openapi = client.get("/openapi.json").json()
            assert not any(path.startswith("/admin") for path in openapi["paths"])
            assert "AdminKey" not in openapi.get("components", {}).get("securitySchemes", {})
            assert 'endpoint="admin/reload"' not in client.get("/metrics").text


def test_admin_key_guards_reload(models_root: Path) -> None:
    settings = settings_for(models_root, api_key=API_KEY, admin_api_key=ADMIN_KEY)
    with running(settings) as (_, client):
        for headers in ({}, bearer("wrong"), bearer(API_KEY), {"Authorization": f"Basic {ADMIN_KEY}"}):
            refused = client.post("/admin/reload", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json()["error"]["code"] == "unauthorized"
            assert refused.headers["www-authenticate"] == "Bearer"
        assert reload_models(client)["status"] == "ok"
        # the admin key is not an inference key
        assert client.post("/classify", json={"text": TEXT}, headers=bearer(ADMIN_KEY)).status_code == 401
        assert client.post("/classify", json={"text": TEXT}, headers=bearer(API_KEY)).status_code == 200
        openapi = client.get("/openapi.json").json()
        assert security_of(openapi, "/admin/reload") == [{"AdminKey": []}]
        assert security_of(openapi, "/classify") == [{"ApiKey": []}]
        assert 'endpoint="admin/reload"' in client.get("/metrics").text


def test_admin_key_alone_leaves_inference_open(models_root: Path) -> None:
    with running(settings_for(models_root, admin_api_key=ADMIN_KEY)) as (_, client):
        assert client.post("/classify", json={"text": TEXT}).status_code == 200
        assert client.post("/admin/reload").status_code == 401
        assert reload_models(client)["status"] == "ok"


def test_openapi_declares_security_only_where_it_is_enforced(client: TestClient, models_root: Path) -> None:
    """No key set: no security scheme anywhere (a client generated from the document sends none)."""
    openapi = client.get("/openapi.json").json()
    assert "securitySchemes" not in openapi.get("components", {})
    assert all(
        "security" not in operation for methods in openapi["paths"].values() for operation in methods.values()
    )
    with running(settings_for(models_root, api_key=API_KEY)) as (_, keyed):
        openapi = keyed.get("/openapi.json").json()
        for path in ("/classify", "/qa", "/summarize", "/models"):
            assert security_of(openapi, path, "get" if path == "/models" else "post") == [{"ApiKey": []}]
        for path in ("/livez", "/readyz", "/metrics"):
            assert security_of(openapi, path, "get") == []

"""/docs and /redoc from local assets, and the bearer scheme in the OpenAPI document.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, so they are
blank on a closed network. The ``fastapi-offline`` package (MIT) ships those
assets; we serve its ``static`` folder ourselves and point FastAPI's own page
builders at it, so no request leaves the server.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
BEARER_SCHEME = "bearer"
# The pages start their bundles with inline scripts and styles; everything else must come from this server.
# ReDoc shows a logo from cdn.redoc.ly and hides it when it fails to load: the policy makes it fail.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
                           "frame-ancestors 'none'")


def install_offline_docs(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets locally; call on an app created with ``docs_url=redoc_url=None``."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")
    oauth2_redirect = "/docs/oauth2-redirect"
    title = f"{app.title} - API"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _local_only(get_swagger_ui_html(
            openapi_url=app.openapi_url, title=title, oauth2_redirect_url=oauth2_redirect,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png"))

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        # with_google_fonts=False: the fonts are a CDN request too
        return _local_only(get_redoc_html(openapi_url=app.openapi_url, title=title, with_google_fonts=False,
                                          redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
                                          redoc_favicon_url=f"{ASSETS_PATH}/favicon.png"))


def _local_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["content-security-policy"] = CONTENT_SECURITY_POLICY
    return page


def declare_bearer_auth(app: FastAPI, *, open_paths: frozenset[str]) -> None:
    """Add the bearer security scheme to the OpenAPI document; every operation outside ``open_paths`` needs it."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER_SCHEME] = {
                "type": "http", "scheme": "bearer", "description": "the server's API key (DENSEHYBRID_API_KEY)"}
            for path, operations in schema.get("paths", {}).items():
                if path not in open_paths:
                    for operation in operations.values():
                        operation["security"] = [{BEARER_SCHEME: []}]
        return app.openapi_schema

    app.openapi = openapi

"""``create_app(settings)``: the FastAPI application of one model and at most one index.

Tests inject an encoder (e.g. ``FakeEncoder``) and an index; the CLI loads
them from the settings first so that a bad model or index stops the process
with a clear message before it listens. Start-up starts the encoder worker and
warms up in the background (``/health`` answers meanwhile, ``/ready`` turns
true after); shutdown lets the worker finish what is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from densehybrid.encoder.base import Encoder
from densehybrid.service import compat_cohere, compat_openai, compat_tei
from densehybrid.service.errors import install_error_handlers
from densehybrid.service.docs_assets import declare_bearer_auth, install_offline_docs
from densehybrid.service.middleware import OPEN_PATHS, ServiceMiddleware
from densehybrid.service.page import install_search_page
from densehybrid.service.routes import build_router
from densehybrid.service import startup
from densehybrid.service.runtime import Runtime
from densehybrid.service.settings import ServiceSettings, log_effective

log = logging.getLogger(__name__)


def create_app(settings: ServiceSettings, *, encoder: Encoder | None = None, index=None) -> FastAPI:
    if encoder is None:
        encoder, loaded_index = startup.load_components(settings)
        index = index if index is not None else loaded_index
    runtime = startup.build_runtime(settings, encoder, index)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        log_effective(settings)
        startup.start(runtime)
        warm_up = asyncio.get_running_loop().run_in_executor(None, _warm_up, runtime)
        try:
            yield
        finally:
            startup.stop(runtime)
            with contextlib.suppress(Exception):
                await warm_up

    app = FastAPI(title="densehybrid", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Dense hybrid retrieval (Aggretriever, DHR, [CLS]): search, encode, explain.")
    app.state.runtime = runtime
    install_error_handlers(app)
    app.include_router(build_router(runtime))
    install_offline_docs(app)
    install_search_page(app, runtime)
    for compat in (compat_openai, compat_tei, compat_cohere):  # client-compatible APIs
        app.include_router(compat.build_router(runtime))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["Server-Timing", "X-Request-ID", "Retry-After"])
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    if api_key is not None:
        declare_bearer_auth(app, open_paths=OPEN_PATHS)
    write_key = settings.write_api_key.get_secret_value() if settings.write_api_key is not None else None
    app.add_middleware(ServiceMiddleware, metrics=runtime.metrics, api_key=api_key,
                       max_body_bytes=settings.max_body_bytes, write_api_key=write_key, routes=app.router.routes,
                       tracing=runtime.tracing)
    return app


def _warm_up(runtime: Runtime) -> None:
    try:
        startup.warm_up(runtime)
    except Exception:  # noqa: BLE001 - a failed warm-up keeps /ready false; it must not kill the server
        runtime.health.status = "warm-up failed (see log)"
        log.exception("warm-up failed; the service stays not ready")

"""``densehybrid serve``: load, check, then run the app under uvicorn.

The model and index are loaded before the server listens, so that a missing,
corrupted or mismatched index stops the command with one clear message
(exit code 2) instead of a traceback. uvicorn handles SIGTERM/SIGINT: it stops
accepting connections, lets in-flight requests finish (up to
``graceful_timeout_s``), then the app's shutdown drains the encoder queue.
"""

from __future__ import annotations

import gc
import logging

import uvicorn

from densehybrid.service import logging as service_logging
from densehybrid.service.app import create_app
from densehybrid.service.startup import StartupError, load_components
from densehybrid.service.settings import ServiceSettings

log = logging.getLogger(__name__)


def settings_from(overrides: dict) -> ServiceSettings:
    """Environment (``DENSEHYBRID_*``) first, then the flags that were given."""
    return ServiceSettings(**{name: value for name, value in overrides.items() if value is not None})


def serve(settings: ServiceSettings, *, graceful_timeout_s: float = 30.0) -> None:
    service_logging.configure(settings.log_level, json_lines=settings.log_json)
    encoder, index = load_components(settings)  # StartupError: the caller prints it and exits
    app = create_app(settings, encoder=encoder, index=index)
    # torch, transformers, the model and the index live as long as the process: moved out of the cyclic
    # collector's reach, so that a full collection under load does not walk them and stall queries
    # (docs/performance.md, "What each change measured")
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=graceful_timeout_s, lifespan="on")
    uvicorn.Server(config).run()


__all__ = ["StartupError", "serve", "settings_from"]

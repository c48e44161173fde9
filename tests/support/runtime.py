"""A service runtime started and stopped around a test, the way the app's lifespan does."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def running(rt):
    """Start ``rt``'s workers; stop them (and close its index) however the block ends."""
    from densehybrid.service import startup

    startup.start(rt)
    try:
        yield rt
    finally:
        startup.stop(rt)


def warmed_up(rt) -> None:
    """Start ``rt``, warm it up, check it is ready, stop it."""
    from densehybrid.service import startup

    with running(rt):
        startup.warm_up(rt)
        assert rt.health.status == "ready"

"""Milvus Lite runs one server process per database file: a module that opens some stops them all at its end,
while pytest's log streams are still open. Import ``stop_lite_servers`` into a test module to use it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def stop_lite_servers():
    yield
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_all()

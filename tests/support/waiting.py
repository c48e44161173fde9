"""Polled conditions instead of fixed sleeps: a test waits for the state it needs, no longer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> T:
    """Call ``predicate`` until it returns something truthy and return that; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:g} s: {what or predicate}")
        time.sleep(interval)

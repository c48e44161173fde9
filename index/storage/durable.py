"""Making written files durable before they are published by a rename."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_files(directory: Path) -> None:
    """fsync every file directly in ``directory`` (a rename publishes names, not the bytes behind them)."""
    for p in Path(directory).iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())

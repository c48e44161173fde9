"""Making written files durable, then publishing the finished directory by a rename."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from densehybrid.index.errors import IndexWriteError


def fsync_files(directory: Path) -> None:
    """fsync every file directly in ``directory`` (a rename publishes names, not the bytes behind them)."""
    for p in Path(directory).iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def publish(staged: Path, target: Path, *, overwrite: bool = False) -> None:
    """Move a finished index directory into place by rename (same file system).

    A new target appears atomically. Replacing an existing index takes two renames
    (old aside, new in); a reader never sees a half-written directory.
    """
    staged, target = Path(staged), Path(target)
    if not target.exists():
        os.rename(staged, target)
        return
    if not overwrite:
        raise IndexWriteError(f"{target}: already exists (pass overwrite to replace it)")
    aside = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.rename(target, aside)
    os.rename(staged, target)
    shutil.rmtree(aside, ignore_errors=True)

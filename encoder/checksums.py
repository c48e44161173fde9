"""The one file checksum of the project: sha256, streamed (model wheels, weights, index files)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks (files may be larger than memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

"""Helpers shared by the index build tests."""

import json
from pathlib import Path


def index_files(directory) -> dict[str, bytes]:
    """An index directory's files by name, the manifest without its creation time."""
    out = {}
    for p in sorted(Path(directory).iterdir()):
        data = p.read_bytes()
        if p.name == "manifest.json":
            manifest = json.loads(data)
            del manifest["created"]
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.name] = data
    return out

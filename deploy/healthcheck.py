#!/usr/bin/env python3
"""Container health probe: GET a route of the local server, exit 0 on HTTP 200.

    densehybrid-healthcheck [PATH]     (default /health; the Compose stack uses /ready)

Images carry no curl; this needs only the standard library. The port comes from
``DENSEHYBRID_PORT`` like the server's own, so a changed port needs no second edit.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def probe(path: str, port: str, timeout_s: float = 3.0) -> int:
    """0 when ``http://127.0.0.1:{port}{path}`` answers 200, else 1 (the HEALTHCHECK contract)."""
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        sys.stderr.write(f"{url}: {exc}\n")
        return 1


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "/health"
    return probe(path, os.environ.get("DENSEHYBRID_PORT", "8000"))


if __name__ == "__main__":
    sys.exit(main())

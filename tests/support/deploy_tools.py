"""The tools the deploy tests (and the wrk load of tests/test_encode_peers.py) need: present, or the
test fails naming the installer.

The README's test command installs them (``bash deploy/ci/install-validators.sh .venv``), so a
missing tool is a broken setup, not a reason to skip: CI and a developer's run test the same things.
"""

from __future__ import annotations

import pytest

INSTALL_COMMAND = "bash deploy/ci/install-validators.sh .venv"


def require_tool(name: str, found: str | None) -> str:
    """``found`` (the tool's path), or fail the test saying how to install ``name``."""
    if found:
        return found
    pytest.fail(f"{name} is not installed: run `{INSTALL_COMMAND}` (as root for the Debian tools), "
                "as the README's test command does", pytrace=False)

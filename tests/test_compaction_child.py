"""How the server starts a compaction's fold child: niced, and without a ``preexec_fn`` (which would make
Python fork the whole server while holding the GIL, stalling every request thread)."""

import os
import subprocess
import sys

import pytest

from densehybrid.index import compaction
from densehybrid.index.errors import IndexWriteError

# stands in for the fold: waits until its niceness changes (or 10 s pass) and fails reporting it
REPORT_NICENESS = """
import os, sys, time
start = os.getpriority(os.PRIO_PROCESS, 0)
deadline = time.monotonic() + 10
while os.getpriority(os.PRIO_PROCESS, 0) == start and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(f"niceness {os.getpriority(os.PRIO_PROCESS, 0)}")
"""


@pytest.mark.slow  # starts a real fold child and waits for its nice value
def test_the_fold_child_is_niced_from_the_server_and_started_without_preexec_fn(tmp_path, monkeypatch):
    real_popen = subprocess.Popen
    started = {}

    def popen(command, **kwargs):
        started.update(command=command, kwargs=kwargs)
        return real_popen([sys.executable, "-c", REPORT_NICENESS], **kwargs)

    monkeypatch.setattr(compaction.subprocess, "Popen", popen)
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)
    with pytest.raises(IndexWriteError, match=f"niceness {expected}"):
        compaction.fold_in_subprocess(tmp_path / "index", tmp_path / "wal", 3, 42, niceness=7)
    assert "preexec_fn" not in started["kwargs"]
    # the child learns the server's pid, to exit if the server is gone before PR_SET_PDEATHSIG took hold
    assert started["command"][-1] == str(os.getpid())
    assert started["command"][-5:-1] == [str(tmp_path / "index"), str(tmp_path / "wal"), "3", "42"]

"""How the server runs a compaction's fold child: niced, started without a ``preexec_fn`` (which would
make Python fork the whole server while holding the GIL, stalling every request thread), kept for the
next folds, and started anew when it died."""

import json
import os
import subprocess
import sys

import pytest

from densehybrid.index import compaction
from densehybrid.index.errors import IndexWriteError

# stands in for the fold child: waits until its niceness changes (or 10 s pass) and fails reporting it
REPORT_NICENESS = """
import os, sys, time
start = os.getpriority(os.PRIO_PROCESS, 0)
deadline = time.monotonic() + 10
while os.getpriority(os.PRIO_PROCESS, 0) == start and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(f"niceness {os.getpriority(os.PRIO_PROCESS, 0)}")
"""

# stands in for the fold child: answers every job with its own pid and the job, fails the job named "bad",
# and exits (as if killed) on the job named "die"
ECHO_JOBS = """
import json, os, sys
for line in sys.stdin:
    job = json.loads(line)
    if job["path"].endswith("die"):
        sys.exit("killed mid-fold")
    ok = not job["path"].endswith("bad")
    print(json.dumps({"ok": ok, "error": f"{os.getpid()} {line.strip()}"}), flush=True)
"""


def fake_child(monkeypatch, script):
    real_popen = subprocess.Popen
    started = []

    def popen(command, **kwargs):
        started.append({"command": command, "kwargs": kwargs})
        return real_popen([sys.executable, "-c", script], **kwargs)

    monkeypatch.setattr(compaction.subprocess, "Popen", popen)
    return started


@pytest.mark.slow  # starts a child and waits for its nice value
def test_the_fold_child_is_niced_from_the_server_and_started_without_preexec_fn(tmp_path, monkeypatch):
    started = fake_child(monkeypatch, REPORT_NICENESS)
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)
    worker = compaction.FoldWorker(niceness=7)
    with pytest.raises(IndexWriteError, match=f"niceness {expected}"):
        worker.fold(tmp_path / "index", tmp_path / "wal", 3, 42)
    worker.close()
    assert "preexec_fn" not in started[0]["kwargs"]
    # the child learns the server's pid, to exit if the server is gone before PR_SET_PDEATHSIG took hold
    assert started[0]["command"][-1] == str(os.getpid())


def test_one_child_serves_the_folds_and_a_dead_one_is_replaced(tmp_path, monkeypatch):
    started = fake_child(monkeypatch, ECHO_JOBS)
    worker = compaction.FoldWorker()
    worker.start()
    pids = []
    for through, name in ((3, "first-bad"), (4, "second-bad")):
        with pytest.raises(IndexWriteError, match="compaction of .* failed") as failed:
            worker.fold(tmp_path / name, tmp_path / "wal", through, 40 + through)
        pid, job = str(failed.value).split(": ", 1)[1].split(" ", 1)
        assert json.loads(job) == {"path": str(tmp_path / name), "log_dir": str(tmp_path / "wal"),
                                   "through_segment": through, "applied_seq": 40 + through}
        pids.append(pid)
    assert len(started) == 1 and pids[0] == pids[1]  # a failed fold leaves the child serving
    worker.fold(tmp_path / "good", tmp_path / "wal", 5, 45)
    with pytest.raises(IndexWriteError, match="exited with 1.*killed mid-fold"):
        worker.fold(tmp_path / "die", tmp_path / "wal", 6, 46)
    worker.fold(tmp_path / "good", tmp_path / "wal", 7, 47)  # a new child
    assert len(started) == 2
    worker.close()

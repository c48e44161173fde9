"""How the server runs a compaction's fold child: niced, started without a ``preexec_fn`` (which would
make Python fork the whole server while holding the GIL, stalling every request thread), kept for the
next folds, and started anew when it died."""

import json
import os
import subprocess
import sys

import pytest

from densehybrid.index.writes import compaction
from densehybrid.index.errors import IndexWriteError

from support.waiting import wait_until

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
    # the child learns the server's pid, to exit when the server is gone
    assert started[0]["command"][-1] == str(os.getpid())


def test_one_child_serves_the_folds_and_a_dead_one_is_replaced(tmp_path, monkeypatch):
    started = fake_child(monkeypatch, ECHO_JOBS)
    worker = compaction.FoldWorker(share=0.25, max_pause_s=3.0)
    worker.start()
    pids = []
    for through, name in ((3, "first-bad"), (4, "second-bad")):
        with pytest.raises(IndexWriteError, match="compaction of .* failed") as failed:
            worker.fold(tmp_path / name, tmp_path / "wal", through, 40 + through)
        pid, job = str(failed.value).split(": ", 1)[1].split(" ", 1)
        assert json.loads(job) == {"path": str(tmp_path / name), "log_dir": str(tmp_path / "wal"),
                                   "through_segment": through, "applied_seq": 40 + through,
                                   "pacing": {"share": 0.25, "max_pause_s": 3.0}}  # the child's FoldPacer
        pids.append(pid)
    assert len(started) == 1 and pids[0] == pids[1]  # a failed fold leaves the child serving
    worker.fold(tmp_path / "good", tmp_path / "wal", 5, 45)
    with pytest.raises(IndexWriteError, match="exited with 1.*killed mid-fold"):
        worker.fold(tmp_path / "die", tmp_path / "wal", 6, 46)
    worker.fold(tmp_path / "good", tmp_path / "wal", 7, 47)  # a new child
    assert len(started) == 2
    worker.close()


# a server stand-in: a thread that ends right after starts the real fold child and has it fold an index that
# does not exist (the child is past its start-up then); the main thread asks for the same fold again,
# prints the child's pid and the answer, and lives until its stdin closes
SERVER = """
import sys, threading
from densehybrid.index.writes.compaction import FoldWorker
from densehybrid.index.errors import IndexWriteError
worker = FoldWorker()

def fold():
    try:
        worker.fold(sys.argv[1], sys.argv[1], 1, 1)
    except IndexWriteError as exc:
        return str(exc)

starter = threading.Thread(target=fold)
starter.start()
starter.join()
print(worker._child.pid, fold(), flush=True)
sys.stdin.read()
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow  # a real fold child: its imports take seconds
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_fold_child_outlives_the_thread_that_started_it_and_exits_with_the_server(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "missing")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        child, answer = server.stdout.readline().split(" ", 1)
        # the child answered after its starting thread had ended: the fold failed, the child did not die
        assert "compaction of" in answer and "exited" not in answer
        assert not gone(int(child))
    finally:
        server.kill()
        server.wait()
    wait_until(lambda: gone(int(child)), timeout=30, what="the fold child exiting after its server")

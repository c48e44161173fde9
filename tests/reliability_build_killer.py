"""Driver for tests/test_reliability_build.py: builds an index many times and SIGKILLs each build somewhere.

Run as ``python tests/reliability_build_killer.py CORPUS ROOT PLAN_JSON``; prints one JSON line per
plan item. Imports happen once here; every build runs in a forked child, so each kill costs a fork,
not a fresh interpreter. This process itself never runs torch or Faiss code (forking after OpenMP
has started is unsafe), only the children do.

Plan items:
- ``{"event": n}``: the child kills itself (SIGKILL) just before its n-th file-system operation
  (rename, replace, fsync, np.save, open_memmap, faiss.write_index, rmtree, sqlite connect,
  Path.write_text) - every step where an interrupted build could leave something behind;
- ``{"after_s": t}``: the parent kills the child ``t`` seconds after forking it (a random point);
- ``{"count": true}``: run the whole build and report how many file-system operations it made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.building.build import BuildOptions, build_index

from support.fake_encoder import FakeEncoder

OPTIONS = BuildOptions(batch_size=4, shard_size=8, progress=False, name="same", resume=True)
FS_OPERATIONS = [(os, "rename"), (os, "replace"), (os, "fsync"), (np, "save"), (np.lib.format, "open_memmap"),
                 (faiss, "write_index"), (shutil, "rmtree"), (sqlite3, "connect"), (Path, "write_text")]


def install_kill_switch(kill_at: int) -> list[int]:
    """Count file-system operations; SIGKILL this process just before operation number ``kill_at``."""
    seen = [0]

    def wrap(owner, name):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            seen[0] += 1
            if seen[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        setattr(owner, name, counted)

    for owner, name in FS_OPERATIONS:
        wrap(owner, name)
    return seen


def child(corpus: str, out: Path, kill_at: int, delay_s: float, report: Path) -> None:
    seen = install_kill_switch(kill_at)
    build_index(FakeEncoder("dhr", delay_s=delay_s), corpus, out, OPTIONS)
    report.write_bytes(str(seen[0]).encode())  # bytes: not counted (write_text is hooked)


def run(corpus: str, out: Path, item: dict) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    report = out.parent / "operations"
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child(corpus, out, int(item.get("event", 0)), float(item.get("delay_s", 0.0)), report)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - report any failure through the exit code
            os._exit(3)
    if "after_s" in item:
        time.sleep(item["after_s"])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    result = {**item, "out": str(out), "seconds": round(time.monotonic() - started, 3),
              "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
              "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}
    if report.exists():
        result["operations"] = int(report.read_bytes())
    return result


def main() -> None:
    corpus, root, plan = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    for number, item in enumerate(plan):
        result = run(corpus, root / f"run{number:03d}" / "index", item)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

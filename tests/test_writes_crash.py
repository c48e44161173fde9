"""kill -9 a server while writes stream in: after a restart every acknowledged change is there and
no unacknowledged batch is half applied (a real server subprocess, SIGKILL mid-stream)."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from densehybrid.bench.servers.start import free_port, stop_process, wait_for_process_ready
from densehybrid.bench.servers.toy_index import build_toy_index

from support.fake_encoder import FakeEncoder
from support.waiting import wait_until

HELPER = Path(__file__).with_name("writes_server.py")
BATCH = 3


def start(index: Path, port: int, compact_after: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(HELPER), str(index), str(port), str(compact_after)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_process_ready(f"http://127.0.0.1:{port}", proc)
    return proc


def writer(url: str, worker: int, acked: list, sent: list, stop: threading.Event, unanswered: dict) -> None:
    """Stream batches of ``BATCH`` new documents, now and then deleting one already acknowledged, until
    ``stop`` or the server dies: ``sent`` gets every batch, ``acked`` each change the server acknowledged, and
    ``unanswered[worker]`` the change out when the server died (applied or not: its answer was lost)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(10_000):
            if stop.is_set():
                return
            ids = [f"w{worker}-{i}-{j}" for j in range(BATCH)]
            docs = [{"id": d, "text": f"passage {d} about topic {worker} number {i}"} for d in ids]
            sent.append(ids)
            try:
                if i % 4 == 3:  # now and then delete one of our own acknowledged documents
                    victim = f"w{worker}-{i - 1}-0"
                    unanswered[worker] = ("delete", victim)
                    if client.delete(f"/documents/{victim}").status_code == 200:
                        acked.append(("delete", victim))
                unanswered[worker] = ("add", ids)
                if client.post("/documents", json={"documents": docs}).status_code == 200:
                    acked.append(("add", ids))
                del unanswered[worker]
            except httpx.TransportError:
                return  # the server died under us


@pytest.mark.slow
def test_every_acknowledged_write_survives_kill_9(tmp_path):
    index = build_toy_index(FakeEncoder("dhr"), tmp_path, count=40)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(index, port, compact_after=25)  # compactions run (and get killed) mid-stream too
    acked: list = []
    sent: list = []
    stop = threading.Event()
    unanswered: dict = {}
    threads = [threading.Thread(target=writer, args=(url, w, acked, sent, stop, unanswered)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 120, timeout=60, what="120 writes acknowledged before the kill")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stop.set()
        for t in threads:
            t.join()

    proc = start(index, port, compact_after=10_000)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            present = lambda d: client.get(f"/documents/{d}").status_code == 200  # noqa: E731
            deleted = {d for op, d in acked if op == "delete"}
            # a delete the kill cut off may have been applied before its answer was lost: either is right
            maybe_deleted = {d for op, d in unanswered.values() if op == "delete"} - deleted
            added = [ids for op, ids in acked if op == "add"]
            for ids in added:  # every acknowledged batch is there, minus acknowledged deletes
                for d in ids:
                    if d not in maybe_deleted:
                        assert present(d) == (d not in deleted), d
            acked_ids = {tuple(ids) for ids in added}
            for ids in sent:  # an unacknowledged batch is there whole or not at all
                if tuple(ids) not in acked_ids:
                    assert len({present(d) for d in ids if d not in deleted | maybe_deleted}) <= 1, ids
            some = added[-1][1]
            hits = client.post("/search", json={"query": f"passage {some} about", "k": 3}).json()["results"]
            assert some in [h["id"] for h in hits]
    finally:
        stop_process(proc)

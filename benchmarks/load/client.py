"""The closed-loop HTTP load client of the benchmarks: keep-alive connections of the standard library, one
thread each, each sending its next request as soon as its last answer is in, spread over client processes
when one Python's interpreter lock would cap them below what the server answers. A level sends a fixed
list of requests (:func:`drive_level`), or runs until told to stop (:func:`drive_samples` with ``stop``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import itertools
import json
import multiprocessing
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from densehybrid.bench.timing import summarize

WORK_STAGES = ("tokenize_ms", "encode_ms", "search_ms", "rerank_ms")


@dataclass
class Samples:
    """One client's requests: latencies and the server's own times (ms) of the answered ones, every answer's
    status, and when it ran."""

    latencies: list[float] = field(default_factory=list)
    server_total: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)  # client latency minus the server's work stages
    statuses: Counter = field(default_factory=Counter)
    began: float = 0.0  # wall-clock seconds (time.time), comparable across processes
    ended: float = 0.0


class Connection:
    """One keep-alive HTTP/1.1 connection of the standard library: a tenth of httpx's client time per
    request on the loopback (0.6 against 1.6 ms for a do-nothing handler here), so a level measures the
    server rather than the client."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)

    def send(self, route: str, body: dict) -> tuple[int, bytes]:
        """POST ``body`` as JSON -> (status, the answer's bytes)."""
        self.http.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        reply = self.http.getresponse()
        return reply.status, reply.read()

    def post(self, route: str, body: dict) -> dict:
        """POST ``body`` -> the JSON answer; RuntimeError for any status but 200."""
        status, payload = self.send(route, body)
        if status != 200:
            raise refused(route, status, payload)
        return json.loads(payload)


def refused(route: str, status: int, payload: bytes) -> RuntimeError:
    return RuntimeError(f"POST {route} answered {status}: {payload[:300]!r}")


def drive_samples(url: str, route: str, bodies: Iterable[dict], concurrency: int,
                  start_at: float | None = None, stop: threading.Event | None = None) -> Samples:
    """``concurrency`` closed-loop clients, a thread and a connection each, taking the next of ``bodies`` as
    soon as their last answer is in (each connection warmed with one of the first two first): until the
    bodies run out (any answer but 200 raises), or, with ``stop``, until it is set (every status counted)."""
    samples = Samples()
    pending = iter(bodies)
    first = list(itertools.islice(pending, 2))
    pending = itertools.chain(first, pending)
    lock = threading.Lock()
    connections = [Connection(url) for _ in range(concurrency)]
    for connection, body in zip(connections, itertools.cycle(first)):  # warm connections and caches
        connection.post(route, body)

    def worker(connection: Connection) -> None:
        while stop is None or not stop.is_set():
            with lock:
                body = next(pending, None)
            if body is None:
                return
            start = time.perf_counter()
            status, payload = connection.send(route, body)
            latency = (time.perf_counter() - start) * 1000.0
            if status != 200 and stop is None:
                raise refused(route, status, payload)
            timing = json.loads(payload)["timing"] if status == 200 else None
            with lock:
                samples.statuses[status] += 1
                if timing is not None:
                    samples.latencies.append(latency)
                    samples.server_total.append(timing["total_ms"])
                    samples.overhead.append(latency - sum(timing.get(stage, 0.0) for stage in WORK_STAGES))

    if start_at is not None:  # every client process starts at once
        time.sleep(max(0.0, start_at - time.time()))
    samples.began = time.time()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as threads:
        list(threads.map(worker, connections))
    samples.ended = time.time()
    for connection in connections:
        connection.http.close()
    return samples


def summary(parts: list[Samples], requests: int) -> dict:
    latencies = [x for part in parts for x in part.latencies]
    wall = max(part.ended for part in parts) - min(part.began for part in parts)
    t = summarize(latencies)
    return {"p50_ms": round(t.p50, 3), "p95_ms": round(t.p95, 3), "rps": round(requests / wall, 2),
            "server_total_p50_ms": round(float(np.median([x for p in parts for x in p.server_total])), 3),
            "overhead_p50_ms": round(float(np.median([x for p in parts for x in p.overhead])), 3),
            "client_processes": len(parts)}


def drive(url: str, route: str, bodies: list[dict], concurrency: int) -> dict:
    """One level from this process's own client."""
    return summary([drive_samples(url, route, bodies, concurrency)], len(bodies))


def drive_level(url: str, route: str, bodies: list[dict], concurrency: int, pool, processes: int) -> dict:
    """One level, its connections spread over the pool's client processes when there is a pool: one
    Python process's clients share one interpreter lock, which caps them below what a GPU server answers."""
    processes = 1 if pool is None else min(processes, concurrency)
    if processes == 1:
        return drive(url, route, bodies, concurrency)
    start_at = time.time() + 1.0  # after every process has warmed its connections
    shares = [(bodies[i::processes], concurrency // processes + (i < concurrency % processes))
              for i in range(processes)]
    futures = [pool.submit(drive_samples, url, route, share, connections, start_at) for share, connections in shares]
    return summary([f.result() for f in futures], len(bodies))


@contextlib.contextmanager
def client_pool(processes: int):
    if processes <= 1:
        yield None
        return
    # spawn: the parent may hold a CUDA context, which a forked child must not inherit
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool

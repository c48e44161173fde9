"""Latency of /search and /encode on a live server at several concurrencies, and the batch sizes reached.

Starts ``densehybrid serve --index DIR`` as a subprocess on a free loopback
port, drives it with a bounded number of requests from asyncio httpx clients,
prints p50/p95/p99 per route and concurrency, and the encoder batch sizes read
back from ``/metrics``. Stops the server at the end.

    python -m densehybrid.bench.service_latency --index ~/.cache/densehybrid/demo/index
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from densehybrid.bench.servers import ServerNotReady, free_port, stop_process, wait_for_process_ready
from densehybrid.bench.timing import percentile

QUERIES = ["parse command line arguments", "read a csv file", "send an email message", "compress data with zlib",
           "regular expression matching", "start a thread pool", "format a date and time", "open a network socket",
           "serialize objects to json", "compute a hash digest", "walk a directory tree", "sort a list in place"]


def start_server(index: Path, port: int, extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "densehybrid", "serve", "--index", str(index), "--port", str(port),
                             "--log-level", "WARNING", *extra])


async def drive(url: str, route: str, concurrency: int, requests: int) -> np.ndarray:
    """Latencies (ms) of ``requests`` requests sent by ``concurrency`` clients in closed loops."""
    latencies: list[float] = []
    counter = iter(range(requests))

    def body(i: int) -> dict:
        q = QUERIES[i % len(QUERIES)]
        return {"query": q, "k": 10} if route == "/search" else {"texts": [q], "role": "query"}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for i in counter:
                start = time.perf_counter()
                r = await c.post(route, json=body(i))
                r.raise_for_status()
                latencies.append((time.perf_counter() - start) * 1000)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return np.asarray(latencies)


def batch_sizes(url: str) -> tuple[float, float, int]:
    """(forwards, texts, largest bucket bound reached) of the encoder worker so far."""
    family = next(f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                  if f.name == "densehybrid_batch_size")
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    count, total = samples[("densehybrid_batch_size_count", None)], samples[("densehybrid_batch_size_sum", None)]
    buckets = sorted((float(le), v) for (name, le), v in samples.items() if name.endswith("_bucket") and le != "+Inf")
    largest = next((int(le) for le, v in buckets if v == count), -1)
    return count, total, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200, help="requests per route and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for serve (repeat)")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args.index, port, args.server_arg)
    try:
        try:
            wait_for_process_ready(url, proc, timeout_s=300)
        except ServerNotReady as exc:
            raise SystemExit(str(exc)) from None
        print(f"{'route':8} {'conc':>4} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>7} "
              f"{'forwards':>8} {'mean batch':>10} {'max batch <=':>12}")
        for route in ("/search", "/encode"):
            for concurrency in args.concurrency:
                asyncio.run(drive(url, route, concurrency, min(20, args.requests)))  # warm
                before = batch_sizes(url)
                start = time.perf_counter()
                lat = asyncio.run(drive(url, route, concurrency, args.requests))
                elapsed = time.perf_counter() - start
                after = batch_sizes(url)
                forwards, texts = after[0] - before[0], after[1] - before[1]
                p50, p95, p99 = (percentile(lat, q) for q in (50, 95, 99))
                print(f"{route:8} {concurrency:>4} {len(lat):>5} {p50:>8.1f} {p95:>8.1f} {p99:>8.1f} "
                      f"{len(lat) / elapsed:>7.1f} {forwards:>8.0f} {texts / max(forwards, 1):>10.2f} {after[2]:>12}")
    finally:
        stop_process(proc, timeout_s=60)


if __name__ == "__main__":
    main()

"""Latency of /search and /encode on a live server at several concurrencies, and the batch sizes reached.

Starts ``densehybrid serve --index DIR`` as a subprocess on a free loopback
port, drives it with a bounded number of requests from the closed-loop client
(``load.client``), prints p50/p95/p99 per route and concurrency, and the encoder
batch sizes read back from ``/metrics``. Stops the server at the end. (The
``service`` section of ``densehybrid bench`` measures the same over a random
model and index, beside the same work in process.)

    python -m densehybrid.bench.load.latency --index ~/.cache/densehybrid/demo/index
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from densehybrid.bench.load.client import drive_samples
from densehybrid.bench.load.workloads import QUERIES
from densehybrid.bench.servers.start import ServerNotReady, serve_command, start_server, stop_process
from densehybrid.bench.timing import percentile

def bodies(route: str, requests: int) -> list[dict]:
    """``requests`` request bodies of ``route``, cycling through :data:`QUERIES`."""
    texts = [QUERIES[i % len(QUERIES)] for i in range(requests)]
    return [{"query": q, "k": 10} if route == "/search" else {"texts": [q], "role": "query"} for q in texts]


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
    try:
        proc, url = start_server(serve_command("--index", str(args.index), *args.server_arg), ready_timeout_s=300)
    except ServerNotReady as exc:
        raise SystemExit(str(exc)) from None
    try:
        print(f"{'route':8} {'conc':>4} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>7} "
              f"{'forwards':>8} {'mean batch':>10} {'max batch <=':>12}")
        for route in ("/search", "/encode"):
            for concurrency in args.concurrency:
                drive_samples(url, route, bodies(route, min(20, args.requests)), concurrency)  # warm
                before = batch_sizes(url)
                samples = drive_samples(url, route, bodies(route, args.requests), concurrency)
                after = batch_sizes(url)
                lat, elapsed = samples.latencies, samples.ended - samples.began
                forwards, texts = after[0] - before[0], after[1] - before[1]
                p50, p95, p99 = (percentile(lat, q) for q in (50, 95, 99))
                print(f"{route:8} {concurrency:>4} {len(lat):>5} {p50:>8.1f} {p95:>8.1f} {p99:>8.1f} "
                      f"{len(lat) / elapsed:>7.1f} {forwards:>8.0f} {texts / max(forwards, 1):>10.2f} {after[2]:>12}")
    finally:
        stop_process(proc, timeout_s=60)

if __name__ == "__main__":
    main()

"""What tracing costs: /search under load with ``--otlp-endpoint`` and without, and the spans' cost per request.

Runs the ``search`` workload of :mod:`densehybrid.bench.peers.encode` (wrk closed-loop clients on a
fresh ``densehybrid serve --index`` per round) alternately without and with tracing, the traces going
to an OTLP/HTTP sink on this machine that answers every export and discards it (a collector elsewhere
would decode them on its own CPU). Prints each round, then the median round's req/s and p50 with
tracing on over off. Then, in this process, the event-loop time that making one request's spans
takes (request span and six stage spans, handed to the batch exporter), as microseconds per request.

    python -m densehybrid.bench.parts.tracing --rounds 3 --clients 32 --duration 10
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import median

from densehybrid.bench.load.wrk import wrk_executable
from densehybrid.bench.peers.encode import DEFAULT_DATA, INDEX_CACHE, Load, measure_densehybrid, search_index


class OtlpSink:
    """An OTLP/HTTP endpoint that accepts every export (an empty ExportTraceServiceResponse) and counts them."""

    def __init__(self):
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.exports += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://{}:{}".format(*self._server.server_address[:2])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def span_cost_us(endpoint: str, requests: int = 2000) -> float:
    """Event-loop microseconds per traced /search: the request span and its six stages made and queued."""
    from densehybrid.service.tracing import RequestTrace, configure

    tracing = configure(endpoint, "densehybrid-bench")
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    try:
        started = time.perf_counter()
        for _ in range(requests):
            at = time.perf_counter()
            trace: RequestTrace = tracing.begin(headers, at)
            for name in ("tokenize", "queue", "encode", "first_stage", "rerank"):
                trace.stage(name, at, at + 1e-4, **{"densehybrid.k": 10})
            trace.annotate(index="bench", k=10, hits=10)
            trace.responded = at + 6e-4
            tracing.finish(trace, method="POST", route="/search", path="/search", status=200, request_id="r",
                           ended=at + 7e-4)
        return (time.perf_counter() - started) / requests * 1e6
    finally:
        tracing.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per round")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of unmeasured load before each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating off and on")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--corpus-limit", type=int)
    parser.add_argument("--index-cache", type=Path, default=INDEX_CACHE)
    args = parser.parse_args(argv)

    wrk_executable()
    index = search_index(args.data, args.model, args.index_cache, args.corpus_limit)
    load = Load(args.duration, args.warmup)
    sink = OtlpSink()
    rounds: dict[str, list[dict]] = {"off": [], "on": []}
    try:
        for _ in range(args.rounds):
            for mode, extra in (("off", []), ("on", ["--otlp-endpoint", sink.url])):
                result = measure_densehybrid(args.model, index, extra, ["search"], [args.clients], load)
                rounds[mode].append(result["search"][args.clients])
        spans_us = span_cost_us(sink.url)
    finally:
        sink.close()

    print(f"\n/search, one query, k=10, {args.clients} clients, {args.rounds} rounds each (alternating)")
    for mode, summaries in rounds.items():
        cells = ", ".join(f"{s['req_s']:.0f} req/s p50 {s['p50_ms']:.0f} ms" for s in summaries)
        print(f"  tracing {mode:>3}: {cells}")
    off = sorted(rounds["off"], key=lambda s: s["req_s"])[len(rounds["off"]) // 2]
    on = sorted(rounds["on"], key=lambda s: s["req_s"])[len(rounds["on"]) // 2]
    print(f"median round, on / off: req/s {on['req_s'] / off['req_s']:.3f}x, "
          f"p50 {on['p50_ms'] / off['p50_ms']:.3f}x; median of per-round req/s ratios "
          f"{median(a['req_s'] / b['req_s'] for a, b in zip(rounds['on'], rounds['off'])):.3f}x")
    print(f"exports received by the sink: {sink.exports} ({sink.bytes / 1e6:.1f} MB)")
    print(f"spans of one traced request (7 spans, made and queued on the event loop): {spans_us:.0f} us")


if __name__ == "__main__":
    main()

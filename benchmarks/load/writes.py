"""Search latency while writes stream in: read p99 with writes / read-only p99, from one run.

``python -m densehybrid.bench.load.writes [--documents N] [--seconds S] [--readers R]`` builds a toy
index (HashEncoder, the benchmarks' weightless encoder), starts a server process on loopback with writes on and a low compaction
threshold (so compactions run during the measurement too), then runs two phases of equal length:

1. read only: ``readers`` clients search in a closed loop;
2. the same readers while one writer streams ``POST /documents`` batches (and some deletes).

``--rows N`` serves a flat index of N seeded 768-dim rows instead (``bench.scale.fold.make_index``, written
straight in the index format; the HashEncoder's plain ``cls`` kind at 768 dims encodes the queries and the
written documents): at a million rows each fold copies the whole index, which is what its readers then
share the cores with.

It prints one JSON report: per phase the search p50/p99, answered searches per second and statuses,
the writes acknowledged, compactions finished, and ``p99_ratio`` (target <= 2).

The writer sends its next batch as soon as the last one is acknowledged, so a server that writes
faster also takes more writes in the same phase (its readers share the cores with that much more
work). ``--write-rate N`` paces it to at most N batches a second instead, to compare two servers
at the same write load. ``--write-share S`` sets the server's ``write_share``: while searches are
being served, writes wait their turn so that they keep the server busy at most that share of the
time (1: writes never wait), which is what bounds the readers' slowdown under such a writer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from densehybrid.bench.load import client
from densehybrid.bench.load.loadtest import percentile_ms, queries
from densehybrid.bench.servers import hash_server
from densehybrid.bench.servers.start import start_server, stop_process
from densehybrid.service.settings import ServiceSettings

DEFAULT_WRITE_SHARE = ServiceSettings.model_fields["write_share"].default
SCALED_DIM = 768


def _start(index: Path, compact_after: int, write_share: float, scaled: bool) -> tuple[subprocess.Popen, str]:
    """``servers.hash_server`` over ``index`` with writes on -> (the process, its URL)."""
    shape = ["--kind", "cls", "--dense-dim", str(SCALED_DIM)] if scaled else []
    return start_server(hash_server.command(index, "--writes", "--compact-after-changes", str(compact_after),
                                            "--write-share", str(write_share), *shape))


def _writer(url: str, batch: int, stop: threading.Event, statuses: Counter, rate: float | None = None) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        next_at = time.perf_counter()
        while not stop.is_set():
            if rate:
                if stop.wait(max(0.0, next_at - time.perf_counter())):
                    break
                next_at = max(next_at + 1 / rate, time.perf_counter())  # behind: no burst to catch up
            docs = [{"id": f"w{i}-{j}", "text": f"written passage {i} {j} dense retrieval"} for j in range(batch)]
            statuses[http.post("/documents", json={"documents": docs}).status_code] += 1
            if i % 5 == 4:
                statuses[http.delete(f"/documents/w{i - 1}-0").status_code] += 1
            i += 1


def _phase(url: str, readers: int, seconds: float, write_batch: int | None, write_rate: float | None = None) -> dict:
    """``readers`` closed-loop searchers for ``seconds``, beside one writer when ``write_batch`` is given."""
    stop = threading.Event()
    writes: Counter = Counter()
    writer = threading.Thread(target=_writer, args=(url, write_batch, stop, writes, write_rate)) if write_batch else None
    timer = threading.Timer(seconds, stop.set)
    for t in filter(None, (writer, timer)):
        t.start()
    reads = client.drive_samples(url, "/search", queries(0), readers, stop=stop)
    if writer is not None:
        writer.join()
    lat = sorted(reads.latencies)
    return {"search_p50_ms": percentile_ms(lat, 50), "search_p99_ms": percentile_ms(lat, 99),
            "searches_per_s": round(len(lat) / seconds, 1), "search_statuses": dict(reads.statuses),
            "write_statuses": dict(writes), "write_requests_per_s": round(sum(writes.values()) / seconds, 1)}


def _metric(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def _index(documents: int, rows: int | None, work: Path) -> Path:
    if rows is None:
        from densehybrid.bench.servers.hash_encoder import HashEncoder
        from densehybrid.bench.servers.toy_index import build_toy_index

        return build_toy_index(HashEncoder("dhr"), work, count=documents)
    from densehybrid.bench.scale.fold import make_index

    return make_index(work / "index", rows, SCALED_DIM)


def run(documents: int, seconds: float, readers: int, write_batch: int, compact_after: int,
        write_rate: float | None = None, write_share: float = DEFAULT_WRITE_SHARE, rows: int | None = None,
        work: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="densehybrid-write-load-", dir=work) as tmp:
        index = _index(documents, rows, Path(tmp))
        proc, url = _start(index, compact_after, write_share, rows is not None)
        try:
            _phase(url, readers, min(2.0, seconds), None)  # warm-up
            read_only = _phase(url, readers, seconds, None)
            with_writes = _phase(url, readers, seconds, write_batch, write_rate)
            compactions = _metric(url, "densehybrid_compactions_total")
            pending = _metric(url, "densehybrid_pending_changes")
        finally:
            stop_process(proc)
    ratio = (with_writes["search_p99_ms"] / read_only["search_p99_ms"]
             if read_only["search_p99_ms"] and with_writes["search_p99_ms"] else None)
    return {"documents": documents if rows is None else rows, "readers": readers, "seconds_per_phase": seconds, "write_batch": write_batch,
            "compact_after_changes": compact_after, "write_rate": write_rate, "write_share": write_share,
            "read_only": read_only, "with_writes": with_writes,
            "compactions": compactions, "pending_changes_at_end": pending,
            "p99_ratio": None if ratio is None else round(ratio, 2), "target_p99_ratio": 2.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--write-batch", type=int, default=8)
    parser.add_argument("--compact-after", type=int, default=200)
    parser.add_argument("--write-rate", type=float, default=None,
                        help="write batches a second at most (default: the next as soon as one is acknowledged)")
    parser.add_argument("--write-share", type=float, default=DEFAULT_WRITE_SHARE,
                        help="the server's write_share: the most of the time writes keep it busy while searches "
                             "run (1: writes never wait; default: the server's default)")
    parser.add_argument("--rows", type=int, default=None,
                        help="serve a flat index of this many seeded 768-dim rows instead of the toy index (the scale "
                             "a fold's cost shows at; ~1.6 GB of disk at a million rows)")
    parser.add_argument("--work", type=Path, default=None,
                        help="the folder the index is made in (default: the system's temporary folder)")
    args = parser.parse_args(argv)
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args.documents, args.seconds, args.readers, args.write_batch, args.compact_after,
                         args.write_rate, args.write_share, args.rows, args.work), indent=2))


if __name__ == "__main__":
    main()

"""/encode and /search under many clients, side by side with infinity-emb, and where the time goes.

Starts ``densehybrid serve --model minilm`` (encode-only) on a free loopback port and drives ``/encode``
with wrk (``wrk_closed_loop.lua``): ``-c N`` connections are N closed-loop clients, each sending its next
request as soon as the previous one is answered. wrk is C: the load generator stays off the Python
interpreter whose server it measures. Workloads: ``query`` (one short query per request), ``passages``
(16 passages per request) and ``search`` (``/search`` with one query, k=10, on a fresh server started
with ``--index``: a MiniLM [CLS] index of msmarco-dl-5k, built once into ``--index-cache``). For every
client count it prints req/s and p50/p99, and, from the ``Server-Timing`` header of each 2xx answer, the
mean time per stage the server reports and ``other``: client latency minus the server's own time (its
``total`` when it sends one, else the sum of its stages), i.e. HTTP, validation, JSON serialization.

With ``--infinity`` it also creates a virtual environment for infinity-emb (never a dependency of this
project), serves the same model directory with it and drives it with the same load generator, then
prints the ratio table. infinity has no search: its ``search`` workload is ``/embeddings`` of the same
single query, an upper bound for infinity plus any vector store. Rounds are interleaved (densehybrid,
peer, densehybrid, ...) on fresh servers and the median round is reported, because this machine is
shared and absolute numbers drift. ``--infinity-engine optimum`` runs infinity on ONNX Runtime (its fastest
CPU engine) over an ``optimum-cli export onnx`` of the model, in a virtual environment of its own.

    python -m densehybrid.bench.peers.encode --rounds 3 --infinity
    python -m densehybrid.bench.peers.encode --rounds 3 --infinity --infinity-engine optimum --workloads query passages
    python -m densehybrid.bench.peers.encode --workloads search --data DIR --corpus-limit 200

Needs wrk (``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from densehybrid.bench.load.workloads import BODIES, WORKLOADS, densehybrid_request, workload_texts
from densehybrid.bench.load.wrk import run_wrk, wrk_executable
from densehybrid.bench.peers.infinity import ENGINES, InfinityPeer
from densehybrid.bench.servers.start import serve_command, start_server, stop_process
from densehybrid.encoder.zoo import resolve

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "msmarco-dl-5k"
INDEX_CACHE = Path.home() / ".cache" / "densehybrid" / "bench-indexes"


@dataclass(frozen=True)
class Load:
    """Each cell's load: ``duration_s`` measured, after ``warmup_s`` of the same load unmeasured."""

    duration_s: int
    warmup_s: int


def infinity_request(workload: str, model: str) -> tuple[str, list[dict]]:
    """infinity-emb has no search: its ``search`` workload embeds the same single query."""
    return "/embeddings", [{"input": workload_texts(workload, i), "model": model} for i in range(BODIES)]


def measure(start, request_for, workloads: list[str], clients: list[int], load: Load) -> dict:
    """``start(workload)`` gives a fresh server for each workload (a server that does not shed load would
    otherwise still be working off the previous workload's backlog); every client count on it.
    {workload: {clients: summary}}."""
    results: dict = {}
    for workload in workloads:
        proc, url = start(workload)
        try:
            path, bodies = request_for(workload)
            for count in clients:
                if load.warmup_s > 0:
                    run_wrk(url, path, bodies, count, load.warmup_s)
                summary = run_wrk(url, path, bodies, count, load.duration_s)
                results.setdefault(workload, {})[count] = summary
                print(f"{url} {workload} {count} clients: {summary}", flush=True)  # partial results survive a kill
        finally:
            stop_process(proc, timeout_s=60)
    return results


def search_index(data: Path, model: str, cache: Path, limit: int | None = None) -> Path:
    """The index the search workload serves: ``model`` over ``data/corpus.jsonl`` (its first ``limit``
    passages when given), built once into ``cache`` and reused."""
    out = cache / f"{data.name}-{Path(model).name}{f'-first{limit}' if limit else ''}"
    if out.exists():  # `index build` publishes atomically: a directory there is a whole index
        return out
    corpus = data / "corpus.jsonl"
    if not corpus.is_file():
        raise SystemExit(f"{corpus}: no corpus for the search workload (point --data at a folder with corpus.jsonl)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if limit:
            with corpus.open() as full:
                corpus = Path(tmp) / "corpus.jsonl"
                corpus.write_text("".join(islice(full, limit)))
        print(f"building the search workload's index {out} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "densehybrid", "index", "build", "--model", model,
                        "--max-passage-length", "256", "--corpus", str(corpus), "--out", str(out), "--resume"],
                       check=True)
    return out


def measure_densehybrid(model: str, index: Path | None, extra: list[str], workloads: list[str], clients: list[int],
                        load: Load) -> dict:
    """The encode workloads on an encode-only ``--model`` server, search on an ``--index`` server."""
    def start(workload: str):
        served = ["--index", str(index)] if workload == "search" else ["--model", model]
        return start_server(serve_command(*served, *extra), ready_timeout_s=600)

    return measure(start, densehybrid_request, workloads, clients, load)


def median_round(rounds: list[dict]) -> dict:
    """Per workload and client count, the round with the median req/s."""
    out: dict = {}
    for workload in rounds[0]:
        for count in rounds[0][workload]:
            ordered = sorted((r[workload][count] for r in rounds), key=lambda s: s["req_s"])
            out.setdefault(workload, {})[count] = ordered[len(ordered) // 2]
    return out


TITLES = {"query": "/encode, query (1 text per request)", "passages": "/encode, passages (16 texts per request)",
          "search": "/search, one query, k=10 ([CLS] index of the served model)"}
PEER_TITLES = {"search": "; infinity: /embeddings of the same query (it has no search: encode-only, "
                         "an upper bound for infinity plus any vector store)"}


def print_table(ours: dict, peer: dict | None) -> None:
    for workload, by_clients in ours.items():
        print(f"\n{TITLES[workload]}{PEER_TITLES.get(workload, '') if peer else ''}")
        header = f"{'clients':>7} | {'densehybrid req/s':>17} | {'p50 / p99 ms':>13}"
        if peer:
            header += f" | {'infinity req/s':>14} | {'p50 / p99 ms':>13} | {'req/s ratio':>11}"
        print(header)
        for count, s in by_clients.items():
            line = f"{count:>7} | {s['req_s']:>17} | {s['p50_ms']:>6.0f} / {s['p99_ms']:<4.0f}"
            if peer:
                p = peer[workload][count]
                ratio = s["req_s"] / p["req_s"] if p["req_s"] else float("nan")
                line += f" | {p['req_s']:>14} | {p['p50_ms']:>6.0f} / {p['p99_ms']:<4.0f} | {ratio:>10.2f}x"
            print(line)
        print("where the time goes (mean ms per answered request; 'other' only where every answer was a 2xx):")
        for count, s in by_clients.items():
            stages = s.get("stages", {})
            refused = sum(n for code, n in s["statuses"].items() if not 200 <= int(code) < 300)
            print(f"{count:>7} clients: " + ", ".join(f"{k.removesuffix('_ms')} {v}" for k, v in stages.items())
                  + (f"; {refused} answers not 2xx {dict(s['statuses'])}" if refused else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="zoo name or model directory served by both")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per workload and client count")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of unmeasured load before each measurement")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="search workload: folder with corpus.jsonl")
    parser.add_argument("--corpus-limit", type=int, help="search workload: index only the first N passages")
    parser.add_argument("--index-cache", type=Path, default=INDEX_CACHE, help="where the search index is built once")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for densehybrid serve (repeat)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "int8"),
                        help="densehybrid's encoder precision; several: each measured in every round (search: with "
                             "--allow-precision-mismatch against the fp32 index)")
    parser.add_argument("--infinity", action="store_true", help="also run infinity-emb on the same model directory")
    parser.add_argument("--infinity-engine", choices=ENGINES, default="torch", help="infinity-emb's engine")
    parser.add_argument("--infinity-venv", type=Path, help="its virtual environment (default: one per engine in the "
                        "user cache)")
    parser.add_argument("--batch-size", type=int, default=32, help="infinity-emb batch size")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    wrk_executable()  # before any server starts or index builds
    load = Load(args.duration, args.warmup)
    model_dir = Path(resolve(args.model))
    index = (search_index(args.data, args.model, args.index_cache, args.corpus_limit)
             if "search" in args.workloads else None)
    ours_rounds: dict[str, list] = {precision: [] for precision in args.precision}
    peer_rounds = []
    peer = InfinityPeer.prepare(args.infinity_engine, model_dir, args.infinity_venv) if args.infinity else None
    for _ in range(args.rounds):
        for precision, rounds in ours_rounds.items():
            extra = [*args.server_arg, "--precision", precision, "--allow-precision-mismatch"]
            rounds.append(measure_densehybrid(args.model, index, extra, args.workloads, args.clients, load))
        if peer is not None:
            peer_rounds.append(measure(lambda workload: peer.start(args.batch_size),
                                       lambda w: infinity_request(w, peer.model_name), args.workloads, args.clients,
                                       load))
    ours = {precision: median_round(rounds) for precision, rounds in ours_rounds.items()}
    peer_results = median_round(peer_rounds) if peer_rounds else None
    for precision, results in ours.items():
        print(f"\n== densehybrid {precision}" + (f" vs infinity {args.infinity_engine}" if peer else ""))
        print_table(results, peer_results)
    if args.json:
        args.json.write_text(json.dumps({"densehybrid": ours, "infinity": peer_results, "rounds": args.rounds,
                                         "infinity_engine": args.infinity_engine if peer else None}, indent=1))


if __name__ == "__main__":
    main()

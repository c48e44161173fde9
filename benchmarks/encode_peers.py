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

    python -m densehybrid.bench.encode_peers --rounds 3 --infinity
    python -m densehybrid.bench.encode_peers --rounds 3 --infinity --infinity-engine optimum --workloads query passages
    python -m densehybrid.bench.encode_peers --workloads search --data DIR --corpus-limit 200

Needs wrk (``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from itertools import islice
from pathlib import Path

from densehybrid.bench.infinity_peer import ENGINES, InfinityPeer
from densehybrid.bench.servers import free_port, stop_process, wait_for_process_ready
from densehybrid.bench.service_latency import QUERIES
from densehybrid.encoder.zoo import resolve

PASSAGE = ("Dense retrieval maps queries and passages to vectors and ranks passages by inner product; "
           "a lexical part keeps exact term matches that a dense vector alone blurs.")
WORKLOADS = ("query", "passages", "search")
BODIES = 64  # distinct request bodies per workload; wrk cycles through them
WRK_SCRIPT = "wrk_closed_loop.lua"
WRK_MARKER = "WRK_JSON "
WRK_TIMEOUT = "30s"
STAGE_ORDER = ("queue", "tokenize", "encode", "search", "rerank", "total", "serialize")
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "msmarco-dl-5k"
INDEX_CACHE = Path.home() / ".cache" / "densehybrid" / "bench-indexes"


@dataclass(frozen=True)
class Load:
    """Each cell's load: ``duration_s`` measured, after ``warmup_s`` of the same load unmeasured."""

    duration_s: int
    warmup_s: int


def wrk_executable() -> str:
    """The wrk on PATH, or stop saying how to install it."""
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk (the HTTP load generator this benchmark drives the servers with) is not installed: "
                         "`apt-get install wrk` (Debian/Ubuntu; `brew install wrk` on macOS)")
    return found


def parse_wrk_output(stdout: str) -> dict:
    """The one ``WRK_JSON {...}`` line ``wrk_closed_loop.lua`` prints at the end of a run."""
    for line in stdout.splitlines():
        if line.startswith(WRK_MARKER):
            return json.loads(line.removeprefix(WRK_MARKER))
    raise RuntimeError(f"no {WRK_MARKER.strip()} line in wrk's output:\n{stdout}")


def _stage_rank(name: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(name) if name in STAGE_ORDER else len(STAGE_ORDER), name)


def summarize(result: dict) -> dict:
    """A parsed wrk result -> requests, req_s (2xx answers per second), latency ms, statuses, errors, stages.

    ``stages`` are the server's mean ms per 2xx answer plus ``other_ms``: the mean client latency minus the
    server's own time (its ``total`` stage when it sends one, else the sum of its stages; plus ``serialize``,
    which the server times after its ``total``)."""
    latency, seconds = result["latency_ms"], result["duration_us"] / 1e6
    statuses = {int(code): count for code, count in result["statuses"].items()}
    answered = sum(count for code, count in statuses.items() if 200 <= code < 300)
    out = {"requests": result["requests"], "req_s": round(answered / seconds, 1) if seconds else 0.0,
           "p50_ms": round(latency["p50"], 1), "p90_ms": round(latency["p90"], 1),
           "p99_ms": round(latency["p99"], 1), "max_ms": round(latency["max"], 1),
           "statuses": statuses, "errors": {kind: n for kind, n in result["errors"].items() if n}}
    server = result["stages_ms"]
    stages = {f"{name}_ms": round(server[name], 2) for name in sorted(server, key=_stage_rank)}
    if stages and answered == result["requests"]:  # wrk's mean latency counts every answer, 429s too
        server_ms = (stages["total_ms"] + stages.get("serialize_ms", 0.0) if "total_ms" in stages
                     else sum(stages.values()))
        stages["other_ms"] = round(latency["mean"] - server_ms, 2)
    if stages:
        out["stages"] = stages
    return out


def run_wrk(url: str, path: str, bodies: list[dict], clients: int, duration_s: int) -> dict:
    """``clients`` closed-loop connections POSTing ``bodies`` (cycled) to ``url + path`` for ``duration_s``;
    the summary of what wrk measured."""
    wrk = wrk_executable()
    script_file = resources.files("densehybrid.bench") / WRK_SCRIPT
    with tempfile.TemporaryDirectory() as tmp, resources.as_file(script_file) as script:
        bodies_file = Path(tmp) / "bodies.jsonl"
        bodies_file.write_text("".join(json.dumps(body) + "\n" for body in bodies))
        done = subprocess.run([wrk, "-t", "1", "-c", str(clients), "-d", f"{duration_s}s", "--timeout", WRK_TIMEOUT,
                               "-s", str(script), url, "--", str(bodies_file), path], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return summarize(parse_wrk_output(done.stdout))


def workload_texts(workload: str, i: int) -> list[str]:
    if workload == "passages":
        return [f"{PASSAGE} ({i}.{j})" for j in range(16)]
    return [QUERIES[i % len(QUERIES)]]


def densehybrid_request(workload: str) -> tuple[str, list[dict]]:
    """The route and request bodies of ``workload`` for densehybrid."""
    texts = [workload_texts(workload, i) for i in range(BODIES)]
    if workload == "search":
        return "/search", [{"query": t[0], "k": 10} for t in texts]
    role = "passage" if workload == "passages" else "query"
    return "/encode", [{"texts": t, "role": role} for t in texts]


def infinity_request(workload: str, model: str) -> tuple[str, list[dict]]:
    """infinity-emb has no search: its ``search`` workload embeds the same single query."""
    return "/embeddings", [{"input": workload_texts(workload, i), "model": model} for i in range(BODIES)]


def start_densehybrid(serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "densehybrid", "serve", *serve_args, "--port", str(port),
                             "--log-level", "WARNING"])
    url = f"http://127.0.0.1:{port}"
    wait_for_process_ready(url, proc, "/ready", timeout_s=600)
    return proc, url


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
        return start_densehybrid([*served, *extra])

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

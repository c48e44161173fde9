"""The live recall on a real index served over HTTP: what sampling costs an answer, and whether the recall it
reports is the recall the answers had.

    python -m densehybrid.bench.scale.live_recall INDEX --queries NAME=FILE[:N] [--queries ...]
        [--rate 0.01] [--repeat 4] [--narrow '{"margin": 0, "rescore": 50}'] [--serve-args "..."] [--out live.json]

Two measurements, each against ``densehybrid serve`` processes of the same index:

- **Cost.** One server samples at ``--rate``, the other not at all; every query goes to both in turn
  (alternating which goes first), one client, so both see the same machine. It prints the ``/search``
  p50/p99 of each and their ratio, and the sampling thread's busy time as a share of the run's wall clock
  (its ``/info`` ``busy_s``: the CPU time the exact scans took). A control run of two servers that both do not
  sample gives the ratios the machine's noise alone makes.
- **Truth.** A server samples every query (rate 1, a window larger than the run). Each query is sent once,
  with the index's default breadth and again with ``--narrow`` (a breadth that loses rows, so that the
  comparison can tell), without the rerank (``"rerank": false``: the hits of a gated kind are then the
  first stage's own top 10, which the live recall measures), after its vector was asked for alone (``/encode``, as ``/search`` encodes a lone
  request). After the server stops, the exact top 10 of each vector over the stored rows is computed here
  and compared with the ids each answer held: the live recall in ``/info`` should equal that mean.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import read_queries
from densehybrid.bench.servers.start import serve_command, start_server, stop_process
from densehybrid.bench.timing import summarize
from densehybrid.index.building.calibrate import exact_top
from densehybrid.index.served.loading import load_index

K = 10
WARM_UP = 5
DEFAULT_NARROW = {"margin": 0, "rescore": 50}
# the truth's answers are the first stage's own top 10: a gated kind's GIP rerank reorders the hits, and the live
# recall is the first stage's (a kind without gates ignores the field)
FIRST_STAGE_ORDER = {"rerank": False}


def _serve(index_dir: Path, *flags: str, serve_args=()):
    return start_server(serve_command("--index", str(index_dir), *flags, *serve_args), ready_timeout_s=600,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _search_ms(client, text: str, extra: dict | None = None) -> tuple[float, dict]:
    started = time.perf_counter()
    response = client.post("/search", json={"query": text, "k": K, **(extra or {})})
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000.0, response.json()


def cost(index_dir: Path, texts: list[str], rate: float, serve_args=(), control: bool = False) -> dict:
    """/search latency with and without sampling at ``rate``, interleaved, and the sampling thread's busy share;
    ``control``: both servers at rate 0 (an A/A run: the ratios the machine's noise alone gives)."""
    import httpx

    (sampling, sampling_url), (plain, plain_url) = (_serve(index_dir, "--recall-sample-rate", str(r),
                                                           serve_args=serve_args)
                                                    for r in ((0.0 if control else rate), 0.0))
    try:
        with httpx.Client(base_url=sampling_url, timeout=120) as a, httpx.Client(base_url=plain_url, timeout=120) as b:
            for text in texts[:WARM_UP]:
                _search_ms(a, text), _search_ms(b, text)
            busy_before = a.get("/info").json()["index"]["first_stage"]["live_recall"]["busy_s"]
            with_ms, without_ms = [], []
            started = time.perf_counter()
            for i, text in enumerate(texts):
                pair = [(a, with_ms), (b, without_ms)]
                for client, times in pair if i % 2 == 0 else pair[::-1]:
                    times.append(_search_ms(client, text)[0])
            wall_s = time.perf_counter() - started
            time.sleep(1.0)  # the last sample's scan
            live = a.get("/info").json()["index"]["first_stage"]["live_recall"]
    finally:
        stop_process(sampling)
        stop_process(plain)
    sampled_ms, plain_ms = summarize(with_ms).to_dict(), summarize(without_ms).to_dict()
    busy_s = live["busy_s"] - busy_before
    return {"rate": 0.0 if control else rate, "queries": len(texts), "sampled": live["measured"], "dropped": live["dropped"],
            "search_ms_sampling": sampled_ms, "search_ms_not_sampling": plain_ms,
            "p50_ratio": round(sampled_ms["p50"] / plain_ms["p50"], 3),
            "p99_ratio": round(sampled_ms["p99"] / plain_ms["p99"], 3),
            "sampling_busy_s": round(busy_s, 3), "wall_s": round(wall_s, 2),
            "sampling_cpu_share_of_one_core": round(busy_s / wall_s, 4),
            "exact_scan_cpu_ms_per_sample": round(1000 * live["busy_s"] / max(1, live["measured"]), 2)}


def metrics_sums(client) -> tuple[float, float]:
    """(sum, count) of the unfiltered recall histogram on ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name == "densehybrid_first_stage_recall":
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[-1]
                if kind in totals and sample.labels.get("filtered") == "false":
                    totals[kind] += sample.value
    return totals["sum"], totals["count"]


def truth(index_dir: Path, groups: dict[str, list[str]], narrow: dict, serve_args=()) -> dict:
    """The live recall of a server that samples every query against an offline exact comparison of its answers;
    ``narrow`` None measures the index's default breadth alone (a flat first stage has no other)."""
    import httpx

    breadths = {"default": None} | ({} if narrow is None else {"narrow": narrow})
    total = sum(len(t) for t in groups.values())
    proc, url = _serve(index_dir, "--recall-sample-rate", "1", "--recall-window", str(4 * total),
                       "--recall-sample-queue", str(4 * total), serve_args=serve_args)
    answered: dict[str, dict[str, list[set]]] = {breadth: {} for breadth in breadths}
    live = {}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            vectors = {name: np.asarray([client.post("/encode", json={"texts": [t]}).json()["vectors"][0]
                                         for t in texts], np.float32) for name, texts in groups.items()}
            for breadth, extra in breadths.items():
                before = client.get("/info").json()["index"]["first_stage"]["live_recall"]
                sum_before, count_before = metrics_sums(client)
                asked = FIRST_STAGE_ORDER | (extra or {})
                for name, texts in groups.items():
                    answered[breadth][name] = [{h["id"] for h in _search_ms(client, t, asked)[1]["results"]}
                                               for t in texts]
                deadline = time.monotonic() + 300
                while (now := client.get("/info").json()["index"]["first_stage"]["live_recall"])["measured"] \
                        < before["measured"] + total:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the sampled queries were not all measured in 5 minutes")
                    time.sleep(0.2)
                # the mean of this breadth's samples alone, from the window's running sums
                live[breadth] = {"live_recall_at_10": round((now["recall_at_10"] * now["count"]
                                                            - (before["recall_at_10"] or 0) * before["count"])
                                                           / (now["count"] - before["count"]), 4),
                                 "samples": now["count"] - before["count"], "dropped": now["dropped"]}
                sum_now, count_now = metrics_sums(client)
                live[breadth]["metrics_recall_at_10"] = round((sum_now - sum_before) / (count_now - count_before), 4)
    finally:
        stop_process(proc)
    index = load_index(index_dir)
    ids = np.asarray([str(d) for d in index.doc_ids], dtype=object)
    exact = {name: exact_top(xq, index.values, np.full(len(xq), -1), K) for name, xq in vectors.items()}
    for breadth, per_group in answered.items():
        recalls = {name: [len(set(ids[rows]) & got) / K for rows, got in zip(exact[name], per_group[name])]
                   for name in per_group}
        offline = float(np.mean([r for rs in recalls.values() for r in rs]))
        live[breadth] |= {"offline_recall_at_10": round(offline, 4),
                          "offline_by_group": {n: round(float(np.mean(r)), 4) for n, r in recalls.items()},
                          "difference": round(live[breadth]["live_recall_at_10"] - offline, 4),
                          "metrics_difference": round(live[breadth]["metrics_recall_at_10"] - offline, 4)}
    return {"narrow": narrow, "queries": {n: len(t) for n, t in groups.items()}, **live}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--rate", type=float, default=0.01, help="the sampling rate whose cost is measured")
    parser.add_argument("--narrow", type=json.loads, default=DEFAULT_NARROW,
                        help="a breadth that loses rows, as JSON search fields (null: none, for a flat index)")
    parser.add_argument("--repeat", type=int, default=1, help="passes over the queries in the cost measurement")
    parser.add_argument("--no-cost", action="store_true", help="measure the live recall's truth only")
    parser.add_argument("--serve-args", default="", help="more flags for densehybrid serve, as one string")
    parser.add_argument("--out", type=Path, default=Path("live-recall.json"))
    args = parser.parse_args(argv)
    groups = dict(read_queries(spec) for spec in args.queries)
    serve_args = shlex.split(args.serve_args)
    texts = [t for texts in groups.values() for t in texts] * args.repeat
    result = {"index": str(args.index), "rows": load_index(args.index).count}
    if not args.no_cost:
        result |= {"cost": cost(args.index, texts, args.rate, serve_args),
                   "control": cost(args.index, texts, args.rate, serve_args, control=True)}
    result["truth"] = truth(args.index, groups, args.narrow, serve_args)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

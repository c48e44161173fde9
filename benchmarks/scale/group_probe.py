"""A partitioned pqscan, timed: the index's own 4-bit codes in k-means groups, probed in centre order until a slack
rule stops, falling back to the flat scan when too much of the corpus stays in play; against flat pqscan.

    python -m densehybrid.bench.scale.group_probe INDEX --queries NAME=FILE[:N] [--queries ...]
        [--sizes 100000 200000 0] [--groups 1024] [--slack 0.4 0.45] [--fallback 0.4] [--passes 2]
        [--out group-probe.json]

``bench.scale.group_bounds`` measures, on exact scores, how far each probing order and stopping rule must go;
this runs the ``slack`` rule over the codes, as a search would, one query at a time on one thread:

1. score the query against every group's centre and probe the groups in that order, first ``FIRST_GROUPS``, then
   batches that double; each probe is Faiss's fast scan of the chosen groups' codes (the same codes flat pqscan
   scans, no residuals), keeping the best ``KEPT_CODES`` code scores;
2. after each batch, the exact 10th best score of the best ``EXACT_CODES`` codes so far sets the rule: a group is
   probed only while its centre score + slack × |q| reaches it (exact, because a code score runs below its row's
   on the best rows, and a rule on code scores stopped several times later);
3. when the groups the rule still admits, with those probed, exceed ``--fallback`` of the rows, the query is too
   far from the corpus for groups to pay: it is searched by the flat scan instead (the index's margin);
4. the codes kept within the index's margin of the 10th best are rescored exactly, as flat pqscan rescores.

Per query set: recall@10 against the exact top 10, the share of rows probed (p50), the share of queries that fell
back, and the single-query p50 beside flat pqscan's, the variants taking turns query by query. ``--sizes`` runs it
on the first N rows of INDEX too (their codes under the codebooks trained on every row), with about sqrt(N) groups
unless ``--groups`` fixes them, and fits each p50's growth with the rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import faiss
import numpy as np

from densehybrid.bench.scale.group_bounds import grouped
from densehybrid.bench.scale.group_stops import per_set
from densehybrid.bench.scale.real import encoded_queries
from densehybrid.bench.timing import round_robin, summarize
from densehybrid.index.building import calibration
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.building.pqscan import new_codes, set_codes
from densehybrid.index.engines.pqscan_engine import (PQScanConfig, PQScanStore, code_scan, margin_floor, read_codes,
                                                     rescore_kept)
from densehybrid.index.engines.pqscan_shards import code_rows_of, lists_scan
from densehybrid.index.served.loading import load_index
from densehybrid.service.blas import one_thread_for_pooled_blas

log = logging.getLogger(__name__)

K = calibration.K
FIRST_GROUPS = 8
KEPT_CODES = 100
EXACT_CODES = 30


class GroupedCodes:
    """``codes`` (an IndexPQ, code i of row i) as one fast-scan list per group of ``assignment`` (N,)."""

    def __init__(self, codes: faiss.IndexPQ, centres: np.ndarray, assignment: np.ndarray):
        by_group = np.argsort(assignment, kind="stable")
        bounds = np.searchsorted(assignment[by_group], np.arange(len(centres) + 1))
        every = code_rows_of(codes)
        members = [by_group[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
        self.scan = lists_scan(codes, [(rows, every[rows]) for rows in members])
        self.centres, self.sizes, self.rows = centres, np.diff(bounds), len(assignment)

    def best_codes(self, q: np.ndarray, groups: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` code scores (k,) of the rows of ``groups`` for ``q`` (1, dim), and their rows (-1: none)."""
        chosen = np.ascontiguousarray(groups[None], np.int64)
        scores, rows = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
        self.scan.search_preassigned_c(1, faiss.swig_ptr(q), k, faiss.swig_ptr(chosen),
                                       faiss.swig_ptr(np.zeros(chosen.shape, np.float32)), faiss.swig_ptr(scores),
                                       faiss.swig_ptr(rows), False, faiss.SearchParametersIVF(nprobe=len(groups)))
        return np.where(rows[0] >= 0, scores[0], -np.inf), rows[0]


def probed_search(q: np.ndarray, grouped_codes: GroupedCodes, flat: PQScanStore, values: np.ndarray, slack: float,
                  fallback: float, margin: float) -> tuple[np.ndarray, float, bool]:
    """One query ``q`` (1, dim): its top 10 rows, the share of rows whose codes it scanned (above 1 when it fell back
    after probing some groups), and whether it fell back."""
    centre = grouped_codes.centres @ q[0]
    order = np.argsort(-centre)
    reach = slack * float(np.linalg.norm(q))
    scores, rows = np.full(0, -np.inf, np.float32), np.full(0, -1, np.int64)
    start, batch, scanned, kth = 0, FIRST_GROUPS, 0, -np.inf
    while start < len(order):
        chosen = order[start:start + batch]
        chosen = chosen[centre[chosen] + reach >= kth]
        admitted = grouped_codes.sizes[order[start:]][centre[order[start:]] + reach >= kth].sum()
        if kth > -np.inf and scanned + admitted > fallback * grouped_codes.rows:
            return flat.inner_product(q, K)[1][0], 1.0 + scanned / grouped_codes.rows, True
        if not len(chosen):
            break
        more_scores, more_rows = grouped_codes.best_codes(q, chosen, KEPT_CODES)
        scanned += int(grouped_codes.sizes[chosen].sum())
        merged_scores, merged_rows = np.concatenate([scores, more_scores]), np.concatenate([rows, more_rows])
        best = np.argsort(-merged_scores, kind="stable")[:KEPT_CODES]
        scores, rows = merged_scores[best], merged_rows[best]
        kth = rescore_kept(q, values, rows[None, :EXACT_CODES], K)[0][0, -1]
        start, batch = start + batch, 2 * batch
    floor = margin_floor(scores[None], K, np.array([margin * float(np.linalg.norm(q))]), np.array([kth]))[0]
    kept = rows[(scores >= floor) | (np.arange(len(rows)) < flat.rescore)]
    return rescore_kept(q, values, kept[None], K)[1][0], scanned / grouped_codes.rows, False


def first_codes(codes: faiss.IndexPQ, rows: int) -> faiss.IndexPQ:
    """The codes of the first ``rows`` rows, under the same codebooks (trained on every row)."""
    if rows == codes.ntotal:
        return codes
    first = new_codes(codes.d, codes.pq.M)
    first.pq, first.is_trained = codes.pq, True
    set_codes(first, code_rows_of(codes)[:rows])
    return first


def groups_for(groups: int, rows: int) -> int:
    """``groups``, or about sqrt(rows) for 0 (as many groups as rows a group)."""
    return groups or max(1, round(rows ** 0.5))


def one_size(values: np.ndarray, codes: faiss.IndexPQ, sets: dict[str, np.ndarray], groups: int,
             slacks: list[float], fallback: float, config: PQScanConfig, passes: int) -> dict:
    """Recall, rows probed, fall-backs and p50 per query set for flat pqscan and each slack over ``values``."""
    xq = np.concatenate(list(sets.values()))
    exact = calibration.exact_top(xq, values, np.full(len(xq), -1))
    started = time.perf_counter()
    grouped_codes = GroupedCodes(codes, *grouped(values, groups))
    flat = PQScanStore(code_scan(codes, 1), values, None, (), config.rescore, config.margin)
    searches = {"flat pqscan": lambda q: flat.inner_product(q, K)[1][0]}
    size = {"rows": len(values), "groups": groups, "grouped_s": round(time.perf_counter() - started, 1), "slack": {}}
    for slack in slacks:
        outcomes = [probed_search(q[None], grouped_codes, flat, values, slack, fallback, config.margin) for q in xq]
        found = np.stack([rows for rows, _, _ in outcomes])
        by_query = np.stack([calibration.recall_at_k(found, exact), [share for _, share, _ in outcomes],
                             [fell for _, _, fell in outcomes]], 1)
        size["slack"][f"{slack:g}"] = per_set(by_query, sets, lambda part: {
            "recall_at_10": round(float(part[:, 0].mean()), 4), "share_p50": round(float(np.median(part[:, 1])), 4),
            "fell_back": round(float(part[:, 2].mean()), 4)})
        searches[f"slack {slack:g}"] = (lambda s: lambda q: probed_search(
            q, grouped_codes, flat, values, s, fallback, config.margin)[0])(slack)
    flat_found = np.stack([searches["flat pqscan"](q[None]) for q in xq])
    size["flat_recall_at_10"] = per_set(calibration.recall_at_k(flat_found, exact), sets,
                                        lambda part: round(float(part.mean()), 4))
    size["p50_ms"] = per_set(np.arange(len(xq)), sets, lambda part: timed(searches, xq[part], passes))
    log.info("%d rows, %d groups: %s", len(values), groups, json.dumps(size["p50_ms"]))
    return size


def exponents(sizes: list[dict]) -> dict:
    """Per query set and search, the slope of log p50 against log rows from the first size to the last."""
    first, last = sizes[0], sizes[-1]
    if last["rows"] == first["rows"]:
        return {}
    return {name: {search: round(float(np.log(p50 / first["p50_ms"][name][search])
                                       / np.log(last["rows"] / first["rows"])), 3)
                   for search, p50 in last["p50_ms"][name].items()} for name in first["p50_ms"]}


def run(index_dir: Path, query_specs: list[str], sizes: list[int], groups: int, slacks: list[float],
        fallback: float, passes: int) -> dict:
    index = load_index(index_dir)
    first_stage = index.manifest["first_stage"]
    if first_stage.get("type") != "pqscan":
        raise SystemExit(f"{index_dir}: a pqscan first stage is needed, this index has {first_stage.get('type')}")
    config = PQScanConfig(**{name: first_stage[name] for name in ("m", "rescore", "margin", "train_size", "seed")})
    codes = read_codes(index_dir / first_stage["file"], index.count, index.values.shape[1], config)
    sets = encoded_queries(encoder_for_index(index, device="cpu"), query_specs)
    one_thread_for_pooled_blas()
    faiss.omp_set_num_threads(1)  # one query, one thread, as flat pqscan's single-thread figure
    result = {"index": str(index_dir), "rows": index.count, "dim": int(index.values.shape[1]), "fallback": fallback,
              "margin": config.margin, "queries": {name: len(g) for name, g in sets.items()},
              "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(), "sizes": []}
    for size in sizes:
        rows = min(size or index.count, index.count)
        result["sizes"].append(one_size(index.values[:rows], first_codes(codes, rows), sets,
                                        groups_for(groups, rows), slacks, fallback, config, passes))
    result["p50_exponents"] = exponents(result["sizes"])
    result["load_after"] = os.getloadavg()
    return result


def timed(searches: dict, queries: np.ndarray, passes: int) -> dict[str, float]:
    """Each search's single-query p50 over ``queries`` (each ``passes`` times), the searches taking turns."""
    def call(search):
        def one(i: int) -> float:
            started = time.perf_counter()
            search(queries[i % len(queries)][None])
            return (time.perf_counter() - started) * 1000.0
        return one

    samples = round_robin({name: call(search) for name, search in searches.items()}, passes * len(queries), warmup=5)
    return {name: round(summarize(s).p50, 3) for name, s in samples.items()}


def markdown(result: dict) -> str:
    sets = list(result["queries"])
    lines = ["| rows | search | " + " | ".join(f"{s}: recall@10 | {s}: rows probed p50 | {s}: fell back | {s}: p50 ms"
                                               for s in sets) + " |", "|---|---|" + "---|---|---|---|" * len(sets)]
    for size in result["sizes"]:
        lines.append(f"| {size['rows']:,} | flat pqscan | " + " | ".join(
            f"{size['flat_recall_at_10'][s]:.3f} | 1 | – | {size['p50_ms'][s]['flat pqscan']:.2f}" for s in sets) + " |")
        for slack, per in size["slack"].items():
            lines.append(f"| | {size['groups']:,} groups, slack {slack} | " + " | ".join(
                f"{per[s]['recall_at_10']:.3f} | {per[s]['share_p50']:.3f} | {per[s]['fell_back']:.2f} | "
                f"{size['p50_ms'][s][f'slack {slack}']:.2f}" for s in sets) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0], help="the first N rows of INDEX; 0: all")
    parser.add_argument("--groups", type=int, default=0, help="groups at every size; 0: about sqrt(rows)")
    parser.add_argument("--slack", type=float, nargs="+", default=[0.4, 0.45], help="x |q|, as in group_bounds")
    parser.add_argument("--fallback", type=float, default=0.4,
                        help="the share of the rows past which a query is searched by the flat scan instead")
    parser.add_argument("--passes", type=int, default=2, help="times every query is timed per search")
    parser.add_argument("--out", type=Path, default=Path("group-probe.json"))
    args = parser.parse_args(argv)
    if min(args.sizes) < 0 or args.groups < 0 or min(args.slack) < 0 or not 0 < args.fallback <= 1 or args.passes < 1:
        parser.error("--sizes and --groups must be >= 0, --passes >= 1, --slack >= 0 and --fallback in (0, 1]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.queries, args.sizes, args.groups, args.slack, args.fallback, args.passes)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print("p50 growth exponents, first size to last:", result["p50_exponents"])


if __name__ == "__main__":
    main()

"""How much of the rows a partitioned first stage must probe to hold each query's exact top 10: by the order in
which it probes the groups, and by the rule that stops it.

    python -m densehybrid.bench.scale.group_bounds INDEX --queries NAME=FILE[:N] [--queries ...]
        [--groups 128 512 2048] [--reach 0.25 0.5 1] [--patience 4 16 64] [--slack 0 0.05 0.1 0.2]
        [--target 0.95] [--out group-bounds.json]

The rows of INDEX are grouped by k-means (``--groups`` G, trained on a sample, every row assigned to its nearest
centre by L2, as inverted lists are) and each query probes the groups in the order one rule ranks them. What is
measured is the share of the rows probed before each row of the query's exact top 10 is reached, with no code
error: the least any scan probing in that order can read. Two figures per rule and query group follow from it:
the share at which the whole top 10 is in (its p50 and p90 over the queries), and the one share that, probed by
every query alike, gives a mean recall@10 of 0.95.

The rules:

- ``centre``: ``q·c``, the inverted lists' order;
- ``centre + reach·|q|·radius``: a bound from the group's centre and its radius (the farthest row from the
  centre). At reach 1 it is a true upper bound on every row's score; a reach below 1 is the calibrated kind;
- ``mean + 3 sd`` (oracle): the mean and spread of the query's own scores over the group's rows, exactly; no
  index stores them (they depend on the query): the order a bound made from a group's first two moments along
  the query would give, were they known exactly;
- ``group max`` (oracle): the group's best score for the query. Probing in this order is the least any order
  can read, since the groups holding the top 10 are exactly those whose best reaches the 10th score.

A search cannot know where the last of its top 10 lies, so it stops by a rule. Two, applied to the groups in
centre order with exact scores (no code error: a search over codes adds its own), give per query set the mean
recall@10 and the share probed:

- ``patience P``: stop after P groups in a row that left the k-th best score so far where it was;
- ``slack s``: stop at the first group whose centre score plus s × |q| is below the k-th best score so far.

With ``--target`` the slack is also chosen as a build would choose it: the least of ``--slack`` at which both
groups of the queries ``index build`` calibrates on (sentences cut from sampled passages, their rows left out;
docstrings of Python's standard library) reach that mean recall@10. The query sets' figures at that slack then
say whether a calibrated slack holds for queries it never saw.

The rows are read in chunks; the scores of all queries against one chunk are held at a time, and for the rules
each group's 10 best scores per query ((Q, G, 10) floats).
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

from densehybrid.bench.scale.group_stops import calibrated_slack, group_tops, per_set, stopping_rules
from densehybrid.bench.scale.real import encoded_queries
from densehybrid.index.building import calibration, calibration_queries
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.search.widening import as_float32
from densehybrid.index.served.loading import load_index

log = logging.getLogger(__name__)

K = calibration.K
CHUNK_ROWS = 65_536
TRAIN_ROWS_PER_GROUP = 256  # as Faiss's k-means samples by default
SPREAD_SDS = 3.0
MEAN_RECALL = 0.95


def grouped(values: np.ndarray, groups: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(G, dim) k-means centres trained on a sample of ``values`` and (N,) each row's group."""
    rng = np.random.default_rng(seed)
    sample_rows = np.sort(rng.choice(len(values), min(len(values), groups * TRAIN_ROWS_PER_GROUP), replace=False))
    kmeans = faiss.Kmeans(values.shape[1], groups, niter=12, seed=seed)
    kmeans.train(as_float32(np.asarray(values[sample_rows])))
    assignment = np.concatenate([kmeans.index.search(as_float32(values[s:s + CHUNK_ROWS]), 1)[1][:, 0]
                                 for s in range(0, len(values), CHUNK_ROWS)])
    return kmeans.centroids, assignment


def group_statistics(xq: np.ndarray, values: np.ndarray, centres: np.ndarray, assignment: np.ndarray) -> dict:
    """Per group: its row count and radius, and per (query, group) the mean, sd and max of the query's scores."""
    count = np.bincount(assignment, minlength=len(centres))
    total = np.zeros((len(xq), len(centres)), np.float64)
    squares = np.zeros_like(total)
    best = np.full((len(xq), len(centres)), -np.inf, np.float32)
    radius = np.zeros(len(centres), np.float32)
    for s in range(0, len(values), CHUNK_ROWS):
        rows, owner = as_float32(values[s:s + CHUNK_ROWS]), assignment[s:s + CHUNK_ROWS]
        by_group = np.argsort(owner, kind="stable")
        owner, rows = owner[by_group], rows[by_group]
        present, starts = np.unique(owner, return_index=True)
        scores = xq @ rows.T
        total[:, present] += np.add.reduceat(scores, starts, axis=1)
        squares[:, present] += np.add.reduceat(scores.astype(np.float64) ** 2, starts, axis=1)
        best[:, present] = np.maximum(best[:, present], np.maximum.reduceat(scores, starts, axis=1))
        distance = np.linalg.norm(rows - centres[owner], axis=1)
        radius[present] = np.maximum(radius[present], np.maximum.reduceat(distance, starts))
    mean = total / np.maximum(count, 1)
    sd = np.sqrt(np.maximum(squares / np.maximum(count, 1) - mean ** 2, 0.0))
    return {"count": count, "radius": radius, "mean": mean, "sd": sd, "max": best}


def rule_scores(xq: np.ndarray, centres: np.ndarray, stats: dict, reaches: list[float]) -> dict[str, np.ndarray]:
    """(Q, G) the score each rule ranks the groups by, the higher probed first; empty groups last."""
    centre = xq @ centres.T
    norms = np.linalg.norm(xq, axis=1, keepdims=True)
    rules = {"centre": centre}
    for reach in reaches:
        rules[f"centre + {reach:g}·|q|·radius"] = centre + reach * norms * stats["radius"][None]
    rules[f"mean + {SPREAD_SDS:g} sd (oracle)"] = stats["mean"] + SPREAD_SDS * stats["sd"]
    rules["group max (oracle)"] = stats["max"].astype(np.float64)
    empty = stats["count"] == 0
    return {name: np.where(empty[None], -np.inf, score) for name, score in rules.items()}


def arrival_shares(score: np.ndarray, count: np.ndarray, assignment: np.ndarray, top: np.ndarray) -> np.ndarray:
    """(Q, k): the share of the rows probed, groups in descending ``score``, when each top row's group is done."""
    order = np.argsort(-score, axis=1, kind="stable")
    probed = np.cumsum(count[order], axis=1) / count.sum()
    rank = np.argsort(order, axis=1)  # each group's place in the order
    return np.take_along_axis(probed, np.take_along_axis(rank, assignment[top], axis=1), axis=1)


def summary(arrivals: np.ndarray) -> dict:
    """The share probed for the whole top 10 (p50, p90 over queries) and the common share for mean recall 0.95."""
    whole = arrivals.max(axis=1)
    return {"whole_top10_p50": round(float(np.median(whole)), 4),
            "whole_top10_p90": round(float(np.percentile(whole, 90)), 4),
            "share_for_mean_recall_0.95": round(float(np.quantile(arrivals, MEAN_RECALL, method="inverted_cdf")), 4)}


def run(index_dir: Path, query_specs: list[str], group_counts: list[int], reaches: list[float],
        patiences: list[int], slacks: list[float], target: float | None = None) -> dict:
    """``target``: also calibrate the slack on the queries ``index build`` calibrates on (sentences cut from the
    passages, docstrings of Python's standard library) and give the query sets' figures at the slack chosen."""
    index = load_index(index_dir)
    if max(group_counts) > index.count:
        raise SystemExit(f"{index_dir}: {max(group_counts)} groups asked of {index.count} rows")
    encoder = encoder_for_index(index, device="cpu")
    sets = encoded_queries(encoder, query_specs)
    build_queries = None if target is None else calibration_queries.queries_for(encoder, index_dir, index.values)
    xq = np.concatenate(list(sets.values()))
    top = calibration.exact_top(xq, index.values, np.full(len(xq), -1))
    result = {"index": str(index_dir), "rows": index.count, "dim": int(index.values.shape[1]), "k": K,
              "queries": {name: len(g) for name, g in sets.items()}, "cores": len(os.sched_getaffinity(0)),
              "groupings": []}
    for groups in group_counts:
        started = time.perf_counter()
        centres, assignment = grouped(index.values, groups)
        stats = group_statistics(xq, index.values, centres, assignment)
        entry = {"groups": groups, "rows_per_group_p50": int(np.median(stats["count"])),
                 "seconds": round(time.perf_counter() - started, 1), "rules": {}}
        for name, score in rule_scores(xq, centres, stats, reaches).items():
            entry["rules"][name] = per_set(arrival_shares(score, stats["count"], assignment, top), sets, summary)
        tops = group_tops(xq, index.values, assignment, groups)
        entry["stopped"] = stopping_rules(xq, centres, stats["count"], assignment, top, tops, patiences, slacks, sets)
        if build_queries is not None:
            entry["calibrated"] = calibrated_slack(build_queries, index.values, centres, stats["count"], assignment,
                                                   slacks, target)
        log.info("%d groups: %s %s", groups, json.dumps(entry["rules"]), json.dumps(entry["stopped"]))
        result["groupings"].append(entry)
    return result


def markdown(result: dict) -> str:
    sets = list(result["queries"])
    lines = ["| groups | probed in order of | " + " | ".join(
        f"{s}: whole top 10, p50 / p90 | {s}: mean recall 0.95" for s in sets) + " |",
        "|---|---|" + "---|---|" * len(sets)]
    for entry in result["groupings"]:
        for name, per_set in entry["rules"].items():
            cells = [f"{per_set[s]['whole_top10_p50']:.3f} / {per_set[s]['whole_top10_p90']:.3f} | "
                     f"{per_set[s]['share_for_mean_recall_0.95']:.3f}" for s in sets]
            lines.append(f"| {entry['groups']:,} | {name} | " + " | ".join(cells) + " |")
    lines += ["", "| groups | centre order, stopped by | " + " | ".join(
        f"{s}: recall@10 | {s}: share probed p50 / p90" for s in sets) + " |", "|---|---|" + "---|---|" * len(sets)]
    for entry in result["groupings"]:
        for name, per_set in entry["stopped"].items():
            cells = [f"{per_set[s]['recall_at_10']:.3f} | {per_set[s]['share_p50']:.3f} / {per_set[s]['share_p90']:.3f}"
                     for s in sets]
            lines.append(f"| {entry['groups']:,} | {name} | " + " | ".join(cells) + " |")
    for entry in result["groupings"]:
        chosen = entry.get("calibrated")
        if chosen is None:
            continue
        if chosen["slack"] is None:
            lines.append(f"\n{entry['groups']:,} groups, calibrated to {chosen['target']}: no slack reached it")
            continue
        held = entry["stopped"][f"slack {chosen['slack']:g}"]
        lines.append(f"\n{entry['groups']:,} groups, calibrated to {chosen['target']}: slack {chosen['slack']:g}, "
                     + ", ".join(f"{s} recall@10 {held[s]['recall_at_10']:.3f} (share p50 {held[s]['share_p50']:.3f})"
                                 for s in sets))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--groups", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--reach", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                        help="the radius bound's reach; 1 is a true upper bound")
    parser.add_argument("--patience", type=int, nargs="+", default=[4, 16, 64],
                        help="stop after this many groups in a row that left the k-th best score as it was")
    parser.add_argument("--slack", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2],
                        help="stop at the first group whose centre score + slack x |q| is below the k-th best so far")
    parser.add_argument("--target", type=float, default=None,
                        help="also calibrate the slack to this recall on the queries index build calibrates on")
    parser.add_argument("--out", type=Path, default=Path("group-bounds.json"))
    args = parser.parse_args(argv)
    if min(args.groups) < 1 or min(args.reach) < 0 or min(args.patience) < 1:
        parser.error("--groups and --patience must be >= 1 and --reach >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.queries, args.groups, args.reach, args.patience, args.slack, args.target)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()

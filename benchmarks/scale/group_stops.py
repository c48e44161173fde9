"""Stopping rules for a partitioned first stage: groups probed in centre order until a rule stops, on exact scores
(``bench.scale.group_bounds`` runs them), and a slack chosen as a build chooses a margin.

- ``patience P``: stop after P groups in a row that left the k-th best score so far where it was;
- ``slack s``: stop at the first group whose centre score plus s × |q| is below the k-th best score so far.
"""

from __future__ import annotations

import numpy as np

from densehybrid.index.building import calibration
from densehybrid.index.building.calibration_queries import CalibrationQueries
from densehybrid.index.search.widening import as_float32

K = calibration.K
CHUNK_ROWS = 65_536


def group_tops(xq: np.ndarray, values: np.ndarray, assignment: np.ndarray, groups: int,
               own_rows: np.ndarray | None = None, queries_at_once: int = 25) -> np.ndarray:
    """(Q, G, k) each group's k best scores for each query, descending (-inf where a group has fewer rows), each
    query's ``own_rows`` (the row it was cut from; -1: none) left out."""
    by_group = np.argsort(assignment, kind="stable")
    place_of_row = np.argsort(by_group)
    owner = assignment[by_group]
    starts = np.searchsorted(owner, np.arange(groups))
    place = np.arange(len(owner)) - starts[owner]
    keep = place < K
    tops = np.full((len(xq), groups, K), -np.inf, np.float32)
    for q0 in range(0, len(xq), queries_at_once):
        block = xq[q0:q0 + queries_at_once]
        scores = np.concatenate([block @ as_float32(values[s:s + CHUNK_ROWS]).T
                                 for s in range(0, len(values), CHUNK_ROWS)], axis=1)[:, by_group]
        for i, row in enumerate(scores):
            if own_rows is not None and own_rows[q0 + i] >= 0:
                row[place_of_row[own_rows[q0 + i]]] = -np.inf
            # sorted by group then score, each group's rows keep their span, best first: a place is a rank
            tops[q0 + i, owner[keep], place[keep]] = row[np.lexsort((-row, owner))][keep]
    return tops


def running_kth(order: np.ndarray, tops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For one query, groups probed in ``order``: the k-th best score after each group, and whether it rose."""
    best = np.full(K, -np.inf, np.float32)
    kth = np.empty(len(order), np.float32)
    rose = np.zeros(len(order), bool)
    for step, group in enumerate(order):
        head = tops[group]
        if head[0] > best[-1]:
            best = np.sort(np.concatenate([best, head]))[::-1][:K]
            rose[step] = True
        kth[step] = best[-1]
    return kth, rose


def stopping_rules(xq: np.ndarray, centres: np.ndarray, count: np.ndarray, assignment: np.ndarray,
                   top: np.ndarray, tops: np.ndarray, patiences: list[int], slacks: list[float],
                   sets: dict[str, np.ndarray]) -> dict:
    """Groups probed in order of their centre, stopped by a rule a search can apply: after ``patience`` groups
    in a row that left the k-th best score where it was, or at the first group whose centre score plus
    ``slack``·|q| falls below the k-th best so far. Per rule and set: mean recall@10 and the share probed."""
    centre = np.where(count[None] == 0, -np.inf, xq @ centres.T)  # an empty group last, as in ``rule_scores``
    order = np.argsort(-centre, axis=1, kind="stable")
    probed = np.cumsum(count[order], axis=1) / count.sum()
    rank = np.argsort(order, axis=1)
    holder_rank = np.take_along_axis(rank, assignment[top], axis=1)
    norms = np.linalg.norm(xq, axis=1)
    stops = {f"patience {p}": [] for p in patiences} | {f"slack {s:g}": [] for s in slacks}
    for q in range(len(xq)):
        kth, rose = running_kth(order[q], tops[q])
        rises = np.flatnonzero(rose)
        for p in patiences:
            gaps = np.diff(np.concatenate([rises, [len(order[q]) + p]]))
            stops[f"patience {p}"].append(min(rises[np.argmax(gaps > p)] + p, len(order[q]) - 1))
        for s in slacks:
            below = np.flatnonzero(centre[q, order[q][1:]] + s * norms[q] < kth[:-1])
            stops[f"slack {s:g}"].append(below[0] if len(below) else len(order[q]) - 1)
    out = {}
    for name, stop in stops.items():
        stop = np.asarray(stop)
        recall_share = np.stack([(holder_rank <= stop[:, None]).mean(axis=1), probed[np.arange(len(xq)), stop]], 1)
        out[name] = per_set(recall_share, sets, lambda part: {
            "recall_at_10": round(float(part[:, 0].mean()), 4), "share_p50": round(float(np.median(part[:, 1])), 4),
            "share_p90": round(float(np.percentile(part[:, 1], 90)), 4)})
    return out


def per_set(by_query: np.ndarray, sets: dict[str, np.ndarray], summarized) -> dict:
    """``summarized`` of each query set's rows of ``by_query`` (the sets' queries in order, one row each)."""
    out, first = {}, 0
    for name, queries in sets.items():
        out[name] = summarized(by_query[first:first + len(queries)])
        first += len(queries)
    return out


def calibrated_slack(queries: CalibrationQueries, values: np.ndarray, centres: np.ndarray, count: np.ndarray,
                     assignment: np.ndarray, slacks: list[float], target: float) -> dict:
    """The least of ``slacks`` at which every group of the build's own calibration ``queries`` (their rows left
    out, as a calibration holds them out) reaches a mean recall@10 of ``target`` under the slack rule, and what
    each group got at each slack."""
    xq, own = queries.vectors, queries.own_rows
    top = calibration.exact_top(xq, values, own)
    tops = group_tops(xq, values, assignment, len(centres), own_rows=own)
    sets = {group.name: group.vectors for group in queries.groups}
    stopped = stopping_rules(xq, centres, count, assignment, top, tops, [], slacks, sets)
    reached = [s for s in sorted(slacks) if all(g["recall_at_10"] >= target for g in stopped[f"slack {s:g}"].values())]
    return {"target": target, "slack": reached[0] if reached else None, "calibration": stopped}

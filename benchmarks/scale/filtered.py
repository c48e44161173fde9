"""Filtered search at scale: recall@10 against the exact top 10 of the rows a filter keeps, and latency.

    python -m densehybrid.bench.scale.filtered INDEX --queries NAME=FILE[:N] [--queries ...]
        [--ann pqscan hnsw] [--breadth hnsw=256 --breadth pqscan=0.08] [--scratch DIR]
        [--label after] [--out filtered.json]

INDEX is a built index: its own encoder encodes each group's queries, its ``vectors.faiss`` holds the rows.
Its own approximate first stage is measured as it was built; each other ``--ann`` choice is written over
the same rows into ``--scratch`` (once: a later run reuses it, so runs before and after a change search
the same graph and lists) with the breadth ``--breadth`` gives, else its default.

The filters are row masks handed to the first stage as a served search hands them (a ``Selection``):
``random-P``, the same seeded P % of the rows for every query, and ``least-like-P``, per query the P % of
the rows whose exact scores are lowest (what "everything but what I have already seen" keeps once the
best rows are seen). Each query's reference is the exact top 10 of the rows its filter keeps; a found row
counts when its exact score reaches the 10th of those (tied scores count alike). Every search is one
query, one thread (``faiss.omp_set_num_threads(1)``); ``short`` counts answers with fewer than 10 rows
where 10 kept rows exist. ``--label`` files the run under that name in ``--out`` beside earlier runs, so
that one file holds a before and an after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import CHOICES, encoded_queries
from densehybrid.bench.timing import summarize
from densehybrid.index.building.calibrate import store_of
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.building.first_stage import write_approximate
from densehybrid.index.engines import faiss_engine
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.params import BREADTH
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.vectors import VECTORS

log = logging.getLogger(__name__)

K = 10
PERCENTS = (5, 20, 50, 80)
KINDS = ("none", *(f"random-{p}" for p in PERCENTS), *(f"least-like-{p}" for p in PERCENTS))
SEED = 1234
_CHUNK = 65_536


def exact_scores(xq: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(Q, dim) queries, (N, dim) rows -> (Q, N) float32 exact inner products, a chunk of rows at a time."""
    out = np.empty((len(xq), len(values)), np.float32)
    for s in range(0, len(values), _CHUNK):
        out[:, s:s + _CHUNK] = xq @ np.asarray(values[s:s + _CHUNK], dtype=np.float32).T
    return out


def kept_rows(kind: str, scores: np.ndarray, shared: dict[int, np.ndarray]) -> np.ndarray | None:
    """The (N,) bool mask of filter ``kind`` for a query of exact ``scores`` (N,); None for no filter."""
    if kind == "none":
        return None
    name, percent = kind.rsplit("-", 1)
    count = int(np.ceil(len(scores) * int(percent) / 100))
    if name == "random":
        return shared[int(percent)]
    mask = np.zeros(len(scores), bool)
    mask[np.argpartition(scores, count - 1)[:count]] = True
    return mask


def random_masks(total: int) -> dict[int, np.ndarray]:
    """Per percent, a seeded mask keeping ceil(P % of ``total``) rows (one count for every run)."""
    masks = {}
    for percent in PERCENTS:
        mask = np.zeros(total, bool)
        mask[np.random.default_rng(SEED + percent).permutation(total)[:int(np.ceil(total * percent / 100))]] = True
        masks[percent] = mask
    return masks


def recall(found: np.ndarray, scores: np.ndarray, mask: np.ndarray | None) -> tuple[float, bool]:
    """(recall@K of ``found`` rows against the exact top K of the kept rows, whether the answer was short)."""
    kept = scores if mask is None else np.where(mask, scores, -np.inf)
    best = np.partition(kept, len(kept) - K)[-K:]
    wanted = int(np.isfinite(best).sum())
    rows = found[found >= 0]
    good = (mask is None or mask[rows].all()) and len(set(rows.tolist())) == len(rows)
    # float32 rounding: a tie within 1e-5 of the largest score counts (near a score of 0, as the middle of
    # the scores can be, a share of the 10th best score would ask for more digits than float32 has)
    hits = int((kept[rows] >= best.min() - 1e-5 * np.abs(scores).max()).sum()) if good else 0
    return min(hits, wanted) / max(1, wanted), len(rows) < wanted


def stores(index, names: list[str], scratch: Path, breadths: dict[str, float]) -> dict:
    """First-stage name -> its served store over ``index``'s rows: the index's own, or written into ``scratch``."""
    out, values = {}, index.values
    own = index.manifest["first_stage"]
    for name in names:
        if own.get("type") == name:
            directory, record = index.path, dict(own)
        else:
            directory = scratch / name
            record_file = directory / "record.json"
            directory.mkdir(parents=True, exist_ok=True)
            if not (directory / VECTORS).exists():  # the rows of its exact scans
                (directory / VECTORS).symlink_to((index.path / VECTORS).resolve())
            if not record_file.exists():
                started = time.perf_counter()
                with faiss_engine.omp_threads(os.cpu_count() or 1):
                    record = write_approximate(values, directory, CHOICES[name])
                log.info("%s written in %.0f s", name, time.perf_counter() - started)
                record_file.write_text(json.dumps(record, indent=1) + "\n")
            record = json.loads(record_file.read_text())
        if name in breadths:
            record[BREADTH[name]] = breadths[name]
        out[name] = (store_of(directory, record, values), {BREADTH[name]: record[BREADTH[name]]})
    return out


def measure(store, groups: dict[str, np.ndarray], scores: dict[str, np.ndarray], shared) -> dict:
    """Per filter kind: recall@K per group, short answers, p50/p99 ms over every group's queries."""
    result = {}
    for kind in KINDS:
        samples, entry = [], {}
        for name, xq in groups.items():
            recalls, short = [], 0
            for q, s in zip(xq, scores[name]):
                mask = kept_rows(kind, s, shared)
                selection = None if mask is None else Selection(int(mask.sum()), len(mask), mask=mask)
                started = time.perf_counter()
                rows = store.inner_product(q[None], K, selection)[1][0]
                samples.append((time.perf_counter() - started) * 1000.0)
                got, was_short = recall(rows, s, mask)
                recalls.append(got)
                short += was_short
            entry[name] = {"recall_at_10": round(float(np.mean(recalls)), 4),
                           "min_recall": round(float(np.min(recalls)), 2), "short": short}
        timing = summarize(samples)
        result[kind] = entry | {"p50_ms": round(timing.p50, 3), "p99_ms": round(timing.p99, 3)}
        log.info("%s: %s, p50 %.2f ms", kind, ", ".join(f"{n} {entry[n]['recall_at_10']:.3f}" for n in groups),
                 timing.p50)
    return result


def run(index_dir: Path, query_specs: list[str], names: list[str], scratch: Path, breadths: dict[str, float]) -> dict:
    faiss_engine.faiss.omp_set_num_threads(1)
    index = load_index(index_dir, checksums=False)
    encoder = encoder_for_index(index, device="cpu")
    groups = encoded_queries(encoder, query_specs)
    scores = {name: exact_scores(xq, index.values) for name, xq in groups.items()}
    shared = random_masks(index.count)
    result = {"index": str(index_dir), "rows": index.count, "k": K, "threads": 1,
              "queries": {name: len(xq) for name, xq in groups.items()}, "engines": {}}
    for name, (store, breadth) in stores(index, names, scratch, breadths).items():
        log.info("%s (%s)", name, breadth)
        result["engines"][name] = {"breadth": breadth, "filters": measure(store, groups, scores, shared)}
    return result


def markdown(runs: dict) -> str:
    """One row per engine and filter kind: recall@10 per group and p50 ms, for each labelled run."""
    labels = list(runs)
    first = runs[labels[0]]
    groups = list(first["queries"])
    head = ["engine", "filter"] + [f"{label} {g}" for label in labels for g in groups] + [f"{label} p50 ms" for label in labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for engine in first["engines"]:
        for kind in KINDS:
            cells = [engine, kind]
            for label in labels:
                entry = runs[label]["engines"].get(engine, {}).get("filters", {}).get(kind, {})
                cells += [f"{entry[g]['recall_at_10']:.3f}" if g in entry else "" for g in groups]
            for label in labels:
                entry = runs[label]["engines"].get(engine, {}).get("filters", {}).get(kind, {})
                cells.append(f"{entry['p50_ms']:.1f}" if entry else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--ann", nargs="*", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--breadth", action="append", default=[], help="NAME=VALUE: ef_search or margin")
    parser.add_argument("--scratch", type=Path, default=Path("filtered-scratch"))
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=Path("filtered.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    breadths = {name: float(value) for name, _, value in (b.partition("=") for b in args.breadth)}
    breadths = {name: int(v) if v.is_integer() and name != "pqscan" else v for name, v in breadths.items()}
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}  # earlier runs, and notes on them
    kept.setdefault("runs", {})[args.label] = run(args.index, args.queries, args.ann, args.scratch, breadths)
    args.out.write_text(json.dumps(kept, indent=1) + "\n")
    print(markdown(kept["runs"]))


if __name__ == "__main__":
    main()

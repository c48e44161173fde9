"""The recall an approximate first stage states against the recall unseen queries get, in domain and from another.

    python -m densehybrid.bench.scale.calibration INDEX --scratch DIR --tune NAME=FILE ... --report NAME=FILE ...
        [--ann pqscan hnsw] [--shares 1 0.5 0.25] [--out calibration.json]

INDEX is a built index of the corpus (its vectors and texts are read, its own encoder encodes every query). For
each ``--ann`` choice the first stage is built over the same rows in ``DIR/<choice>`` as a build builds it
(``calibrate.write_calibrated``: without the rows the in-domain calibration queries were cut from, measured, then
completed) with the in-domain group and one other-domain group per candidate ``--shares`` (docstring sentences,
the farthest share of a larger pool kept), all measured in one pass. Then, on the completed first stage:

- the old calibration: the same in-domain sentences searched in the first stage that holds their own rows (each
  own row dropped from the answers and the exact top 10), the breadth it would choose and the recall it states;
- each candidate share's calibration: the breadth at which both groups keep the target, and the lower group's
  recall stated there;
- every breadth of the grid searched for each ``--tune`` and ``--report`` set (queries unseen by the corpus),
  recall@10 against the exact scan of every row.

The share is picked on the ``--tune`` sets alone (:func:`pick_share`); the ``--report`` sets are never read by
that choice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.scale.real import CHOICES, read_queries, sweep
from densehybrid.index.building import calibrate, calibration, calibration_queries
from densehybrid.index.building.calibration_queries import CalibrationQueries, Group
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.engines import faiss_engine
from densehybrid.index.search.params import BREADTH
from densehybrid.index.served.loading import load_index
from densehybrid.index.served.stated_recall import Point, choose, recall_at

log = logging.getLogger(__name__)

K = calibration.K
SHARES = (1.0, 0.5, 0.25)
# the tuning rule: the stated figure at most this far above the lower tuning set's measured recall (below the
# target's 0.02: questions from another domain were measured a little below sentences cut from its passages) ...
OVER = 0.0
# ... and at most this far below it
UNDER = 0.05


def share_group(name: str) -> str:
    return f"other_domain@{name}"


def choice_of(curve: list[dict], groups: list[str], target: float) -> dict:
    """The breadth a calibration on ``groups`` (names in the curve's points) would choose, and the recall it states."""
    points = [Point(p["breadth"], min(p["groups"][g]["recall_at_10"] for g in groups),
                    min(p["groups"][g]["exact_top10"] for g in groups), p["p50_ms"], p["p99_ms"]) for p in curve]
    chosen = choose(points, target)
    return {"breadth": chosen.point.breadth, "reached": chosen.reached, "stated": round(chosen.point.recall, 4)}


def measured_at(row: dict, breadth: float, name: str) -> float:
    """The recall ``name`` measured at ``breadth`` of the row's sweep."""
    return next(p[name]["recall_at_10"] for p in row["sweep"] if p["breadth"] == breadth)


def miss(stated: float, measured: list[float]) -> float:
    """How far ``stated`` lies outside [lower - UNDER, lower + OVER] of the ``measured`` recalls (0: inside)."""
    lower = min(measured)
    return max(stated - (lower + OVER), (lower - UNDER) - stated, 0.0)


def pick_share(rows: list[dict], tune: list[str], shares) -> float:
    """The share whose stated figures miss the tuning sets' measured recalls least over every first stage (ties:
    the larger share, the fewer sentences encoded). Reads the ``tune`` sets only."""
    def worst(share: float) -> float:
        return max(miss(r["shares"][str(share)]["stated"],
                        [measured_at(r, r["shares"][str(share)]["breadth"], t) for t in tune]) for r in rows)
    return min(shares, key=lambda s: (round(worst(s), 4), -s))


def staged_beside(index, directory: Path) -> Path:
    """``directory`` holding links to the index's texts and vectors, as a build's staged directory holds them."""
    directory.mkdir(parents=True, exist_ok=True)
    for shared in ("docs.sqlite", "vectors.faiss"):
        if not (directory / shared).exists():
            (directory / shared).symlink_to((index.path / shared).resolve())
    return directory


def calibration_groups(index, encoder, staged: Path, shares) -> tuple[Group, list[Group]]:
    """The in-domain group a build cuts, and the other-domain group each share keeps (the same for every choice)."""
    in_domain = calibration_queries.in_domain(encoder, staged, index.values)
    others = []
    for share in shares:
        group = calibration_queries.from_stdlib(encoder, index.values, share=share)
        others.append(Group(share_group(str(share)), group.vectors, group.own_rows, group.source))
    return in_domain, others


def one_choice(name: str, index, scratch: Path, groups: tuple[Group, list[Group]], sets: dict, exact: dict,
               shares, target: float) -> dict:
    staged = staged_beside(index, scratch / name)
    values = index.values
    in_domain, others = groups
    started = time.perf_counter()
    with faiss_engine.omp_threads(os.cpu_count() or 1):  # built as a build builds it: every core
        record = calibrate.write_calibrated(values, staged, CHOICES[name], CalibrationQueries((in_domain, *others)),
                                            target)
    total_s = time.perf_counter() - started
    entry = record["calibration"]
    store = calibrate.store_of(staged, record, values)
    old = calibrate.calibrate(store, record, values, CalibrationQueries((in_domain,)), target, staged)
    knob = BREADTH[name]

    def search(q, breadth):
        return store.inner_product(q, K, **{knob: breadth})[1][0]

    row = {"choice": name, "knob": knob, "build_and_calibration_s": round(total_s, 1),
           "calibration_s": entry["seconds"], "calibration_queries": entry["queries"], "groups": entry["groups"],
           "held_out_rows": entry["held_out_rows"], "curve": entry["curve"],
           "old": {"breadth": old[knob], "reached": old["calibration"]["reached"],
                   "stated": recall_at(old["calibration"]["curve"], old[knob]), "seconds": old["calibration"]["seconds"],
                   "curve": old["calibration"]["curve"]},
           "shares": {str(s): choice_of(entry["curve"], ["in_domain", share_group(str(s))], target) for s in shares},
           "sweep": sweep(search, sets, exact, calibrate.grid(record, len(values)))}
    return row


def run(index_dir: Path, scratch: Path, tune: list[str], report: list[str], choices: list[str], shares,
        target: float = calibration.DEFAULT_TARGET) -> dict:
    faiss_engine.faiss.omp_set_num_threads(1)
    index = load_index(index_dir)
    encoder = encoder_for_index(index, device="cpu")
    sets, files = {}, {}
    for spec in tune + report:
        name, texts = read_queries(spec)
        sets[name] = np.asarray(encoder.encode(texts, "query").values, np.float32)
        files[name] = spec.partition("=")[2]
    started = time.perf_counter()
    exact = {name: calibration.exact_top(xq, index.values, np.full(len(xq), -1)) for name, xq in sets.items()}
    log.info("exact top 10 of %d queries in %.0f s", sum(map(len, sets.values())), time.perf_counter() - started)
    started = time.perf_counter()
    groups = calibration_groups(index, encoder, staged_beside(index, scratch / "groups"), shares)
    log.info("calibration groups cut and encoded in %.0f s", time.perf_counter() - started)
    tune_names = [read_queries(s)[0] for s in tune]
    result = {"index": str(index_dir), "rows": index.count, "dim": int(index.values.shape[1]),
              "model": index.spec.model_id, "target": target, "k": K, "sets": files,
              "queries": {n: len(x) for n, x in sets.items()}, "tune": tune_names,
              "report": [read_queries(s)[0] for s in report], "shares": list(shares), "choices": []}
    for name in choices:
        result["choices"].append(one_choice(name, index, scratch, groups, sets, exact, shares, target))
        log.info("%s done", name)
    result["picked_share"] = pick_share(result["choices"], tune_names, shares)
    return result


def table(result: dict) -> str:
    """One row per first stage: stated recall (old, new) against each set's measured recall at that breadth."""
    share = str(result["picked_share"])
    names = result["tune"] + result["report"]
    lines = ["| first stage | calibration | breadth | stated | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for row in result["choices"]:
        for label, chosen in (("old", row["old"]), ("new", row["shares"][share])):
            measured = " | ".join(f"{measured_at(row, chosen['breadth'], n):.3f}" for n in names)
            lines.append(f"| {row['choice']} | {label} | {row['knob']} {chosen['breadth']:g} | "
                         f"{chosen['stated']:.3f} | {measured} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--tune", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--report", action="append", required=True, help="NAME=FILE[:N], a BEIR queries.jsonl")
    parser.add_argument("--ann", nargs="*", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--shares", nargs="*", type=float, default=list(SHARES))
    parser.add_argument("--out", type=Path, default=Path("calibration.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.index, args.scratch, args.tune, args.report, args.ann, args.shares)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()

"""Tune how far the other-domain calibration group is moved from the corpus, on first stages already built.

    python -m densehybrid.bench.scale.calibration_noise RESULT.json INDEX --scratch DIR [--noises 0 0.5 1]
        [--out noise.json]

RESULT.json is a ``bench.scale.calibration`` result whose first stages are still in ``DIR/<choice>``. An
other-domain query has no row of its own in the corpus, so its recall on the completed first stage is what it
would be on the first stage without the held-out rows (200 of the rows fewer). For each noise level the
docstring sentences the build encodes are moved that far toward seeded random passages
(:func:`moved`), measured at every breadth, and set beside the in-domain group measured by
the result: the breadth at which both keep the target and the recall stated there. The level is picked on the
result's tuning sets alone (``calibration.pick_share``'s rule).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import faiss
import numpy as np

from densehybrid.bench.scale.calibration import miss, measured_at
from densehybrid.index.building import calibrate, calibration, calibration_queries, other_domain
from densehybrid.index.building.commands import encoder_for_index
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.search.params import BREADTH
from densehybrid.index.served.loading import load_index
from densehybrid.index.served.stated_recall import Point, choose

log = logging.getLogger(__name__)
NOISES = (0.0, 0.25, 0.5, 0.75, 1.0)


def moved(xq: np.ndarray, noise: float, values: np.ndarray, seed: int = 0) -> np.ndarray:
    """``xq`` (Q, dim) moved away from where it was encoded, toward a seeded random row of ``values`` each: plus
    ``noise`` times that row (scaled to the query's norm), scaled back to the query's norm. The query then lies
    between its own topic and one of the corpus's, where a graph walk or the probed lists find its neighbours
    least (noise drawn in every direction would not move it: the corpus spans few of them)."""
    if noise == 0:
        return xq
    norms = np.linalg.norm(xq, axis=1, keepdims=True)
    rows = np.sort(np.random.default_rng(seed).choice(len(values), len(xq), replace=len(values) < len(xq)))
    toward = np.asarray(values[rows], dtype=np.float32)
    toward = toward[np.random.default_rng(seed + 1).permutation(len(xq))]
    x = xq + noise * norms * toward / np.maximum(np.linalg.norm(toward, axis=1, keepdims=True), 1e-12)
    return (x * norms / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def record_of(directory: Path, name: str) -> dict:
    """The manifest record of a first stage the calibration bench left in ``directory``."""
    if name == "hnsw":
        graph = faiss.read_index(str(directory / hnsw_engine.ANN_FILE))
        rows = directory / hnsw_engine.NODE_ROWS
        extra = {"node_rows": hnsw_engine.NODE_ROWS, "nodes": graph.ntotal} if rows.exists() else {}
        return {**hnsw_engine.HNSWConfig().to_dict(), **extra}
    codes = faiss.read_index(str(directory / pqscan_engine.ANN_FILE))
    return pqscan_engine.PQScanConfig(m=codes.pq.M).to_dict()


def stated_with(row: dict, other: list[dict], target: float) -> dict:
    """The breadth at which the result's in-domain group and ``other`` (points: breadth, recall, exact share) both
    keep ``target``, and the lower recall there."""
    mine = {p["breadth"]: p for p in other}
    points = [Point(p["breadth"], min(p["groups"]["in_domain"]["recall_at_10"], mine[p["breadth"]]["recall_at_10"]),
                    min(p["groups"]["in_domain"]["exact_top10"], mine[p["breadth"]]["exact_top10"]), 0.0, 0.0)
              for p in row["curve"]]
    chosen = choose(points, target)
    return {"breadth": chosen.point.breadth, "reached": chosen.reached, "stated": round(chosen.point.recall, 4)}


def run(result_path: Path, index_dir: Path, scratch: Path, noises, shares=()) -> dict:
    faiss.omp_set_num_threads(1)
    result = json.loads(result_path.read_text())
    index = load_index(index_dir)
    encoder = encoder_for_index(index, device="cpu")
    if shares:  # instead of moving them, keep the farthest ``share`` of a larger pool
        groups = {s: calibration_queries.from_stdlib(encoder, index.values, share=s).vectors for s in shares}
    else:
        base = np.asarray(encoder.encode(other_domain.stdlib_sentences(calibration_queries.QUERIES), "query").values,
                          np.float32)
        groups = {n: moved(base, n, index.values) for n in noises}
    out = {"result": str(result_path), "noises": list(groups), "choices": []}
    exact = {n: calibration.exact_top(xq, index.values, np.full(len(xq), -1)) for n, xq in groups.items()}
    for row in result["choices"]:
        name, knob = row["choice"], BREADTH[row["choice"]]
        store = calibrate.store_of(scratch / name, record_of(scratch / name, name), index.values)
        per = {}
        for noise, xq in groups.items():
            curve = []
            for breadth in [p["breadth"] for p in row["curve"]]:
                found = np.array([store.inner_product(q[None], calibration.K, **{knob: breadth})[1][0] for q in xq])
                recalls = calibration.recall_at_k(found, exact[noise])
                curve.append({"breadth": breadth, "recall_at_10": round(float(recalls.mean()), 4),
                              "exact_top10": round(float((recalls == 1.0).mean()), 4)})
            per[str(noise)] = {"curve": curve, **stated_with(row, curve, result["target"])}
            log.info("%s noise %g: %s", name, noise, per[str(noise)] | {"curve": None})
        out["choices"].append({"choice": name, "noises": per})
    out["picked_noise"] = pick(out, result)
    return out


def pick(out: dict, result: dict) -> float:
    """The noise whose stated figures miss the tuning sets' measured recalls least over every first stage (ties:
    the smaller noise). Reads the result's tuning sets only."""
    rows = {r["choice"]: r for r in result["choices"]}

    def worst(noise: float) -> float:
        return max(miss(c["noises"][str(noise)]["stated"],
                        [measured_at(rows[c["choice"]], c["noises"][str(noise)]["breadth"], t) for t in result["tune"]])
                   for c in out["choices"])
    return min(out["noises"], key=lambda n: (round(worst(n), 4), n))


def summary(result: dict, out: dict) -> list[dict]:
    """Per first stage, the old calibration and the new one (the picked noise): breadth, stated recall, and each
    set's measured recall at that breadth."""
    noise = str(out["picked_noise"])
    rows = []
    for row, tuned in zip(result["choices"], out["choices"]):
        for label, chosen in (("old", row["old"]), ("new", tuned["noises"][noise])):
            rows.append({"choice": row["choice"], "calibration": label, "knob": row["knob"],
                         "breadth": chosen["breadth"], "reached": chosen["reached"],
                         "stated": round(chosen["stated"], 4),
                         "measured": {n: measured_at(row, chosen["breadth"], n) for n in result["tune"] + result["report"]}})
    return rows


def markdown(result: dict, rows: list[dict]) -> str:
    names = result["tune"] + result["report"]
    lines = ["| first stage | calibration | breadth | stated | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    lines += [f"| {r['choice']} | {r['calibration']} | {r['knob']} {r['breadth']:g} | {r['stated']:.3f} | "
              + " | ".join(f"{r['measured'][n]:.3f}" for n in names) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("index", type=Path)
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--noises", nargs="*", type=float, default=list(NOISES))
    parser.add_argument("--shares", nargs="*", type=float, default=[],
                        help="measure the farthest share of a larger pool of sentences instead of moved ones")
    parser.add_argument("--out", type=Path, default=Path("noise.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = run(args.result, args.index, args.scratch, args.noises, args.shares)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    result = json.loads(args.result.read_text())
    print("picked noise", out["picked_noise"])
    print(markdown(result, summary(result, out)))


if __name__ == "__main__":
    main()

"""The growth exponents of a ``bench.scale.growth`` result, their projection to a larger corpus, its table and plot.

    python -m densehybrid.bench.scale.growth_report RESULT.json [--project-rows N] [--project-dim D]
        [--project-cores C] [--plot growth.png]

A cost c measured at several row counts N is fitted as c = a·N^b (least squares on the logs); b is its exponent
in the rows. The projection takes each first stage's p50 from the largest size measured to ``rows`` by that
exponent, then to ``dim`` dimensions by the ratio of the dimensions (the codes scanned and the rows rescored are
that much longer), then, for pqscan, to ``cores`` scan threads by Amdahl's law with the serial share its two
threads showed at the largest size measured. A scan's p50 is also fitted as a fixed part plus a part per row
(c = f + r·N, least squares): an exponent fitted where the fixed part still weighs (rescoring, the merge) is
below the 1 a scan of every row tends to, so the power law understates the cost far past the sizes measured;
the linear model, with only the per-row part spread over the cores, is the other bound. Recall is not
projected: it is measured at each size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MSMARCO_ROWS = 8_841_823
STAGES = ("flat", "pqscan", "pqscan-2t", "hnsw")


def add_projection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project-rows", type=int, default=MSMARCO_ROWS, help="rows to project to (MS MARCO's)")
    parser.add_argument("--project-dim", type=int, default=768, help="dimensions to project to")
    parser.add_argument("--project-cores", type=int, default=16, help="scan threads to project pqscan to")


def exponent(rows: list[int], costs: list[float]) -> tuple[float, float] | None:
    """(b, log a) of costs = a·rows^b fitted on the logs; None with fewer than two positive points."""
    points = [(n, c) for n, c in zip(rows, costs) if n > 0 and c and c > 0]
    if len(points) < 2:
        return None
    slope, intercept = np.polyfit(np.log([n for n, _ in points]), np.log([c for _, c in points]), 1)
    return float(slope), float(intercept)


def fit(result: dict) -> dict:
    """Per first stage and cost (``p50_ms``, ``build_s``): its exponent in the rows."""
    sizes = result["sizes"]
    rows = [point["rows"] for point in sizes]
    fitted = {}
    for stage in STAGES:
        for cost in ("p50_ms", "build_s"):
            got = exponent(rows, [point[stage].get(cost) for point in sizes])
            if got is not None and not (cost == "build_s" and stage in ("flat", "pqscan-2t")):
                fitted[f"{stage} {cost}"] = round(got[0], 3)
    return fitted


def fixed_and_per_row(rows: list[int], costs: list[float]) -> tuple[float, float]:
    """(f, r) of costs = f + r·rows, least squares."""
    per_row, fixed = np.polyfit(np.asarray(rows, float), np.asarray(costs, float), 1)
    return float(fixed), float(per_row)


def serial_share(one_thread_ms: float, two_threads_ms: float) -> float:
    """Amdahl's serial share s of a query from its p50 on one and two threads: t2/t1 = s + (1 - s)/2."""
    return float(min(1.0, max(0.0, 2.0 * two_threads_ms / one_thread_ms - 1.0)))


def project(result: dict, rows: int, dim: int, cores: int) -> dict:
    """Each first stage's p50 projected to ``rows`` × ``dim`` (pqscan also on ``cores`` threads), with the
    assumptions it rests on."""
    sizes = result["sizes"]
    largest = sizes[-1]
    counts = [point["rows"] for point in sizes]
    scale_dim = dim / result["dim"]
    projected = {}
    for stage in ("flat", "pqscan", "hnsw"):
        got = exponent(counts, [point[stage]["p50_ms"] for point in sizes])
        if got is None:
            continue
        b = got[0]
        projected[stage] = round(largest[stage]["p50_ms"] * (rows / largest["rows"]) ** b * scale_dim, 2)
    share = serial_share(largest["pqscan"]["p50_ms"], largest["pqscan-2t"]["p50_ms"])
    linear = None
    if "pqscan" in projected:
        projected[f"pqscan-{cores}t"] = round(projected["pqscan"] * (share + (1.0 - share) / cores), 2)
        fixed, per_row = fixed_and_per_row(counts, [point["pqscan"]["p50_ms"] for point in sizes])
        linear = {"fixed_ms": round(fixed, 3), "per_million_rows_ms": round(per_row * 1e6, 3),
                  "p50_ms": round((fixed + per_row * rows) * scale_dim, 2),
                  f"p50_ms_{cores}t": round((fixed + per_row * rows / cores) * scale_dim, 2)}
    return {"rows": rows, "dim": dim, "cores": cores, "p50_ms": projected, "serial_share": round(share, 3),
            "pqscan_fixed_plus_per_row": linear,
            "assumptions": [
                f"p50 grows from the largest size measured ({largest['rows']:,} rows) with its fitted exponent",
                f"cost in proportion to the dimensions ({result['dim']} -> {dim}): codes and rescored rows "
                "are that much longer",
                f"pqscan on {cores} threads keeps the serial share its 2 threads showed at {largest['rows']:,} rows "
                f"({share:.2f}: rescoring, the merge and the hand-off), and the cores are its own; or, fitted as a "
                "fixed part plus a part per row, only the per-row part (the codes' scan) spreads over the cores",
                "recall is not projected: it is what each size measured",
                "the machine measured on is a shared 2-core one; a server's cores and memory bandwidth differ"]}


def markdown(result: dict) -> str:
    sets = list(result["queries"])
    lines = ["| rows | first stage | breadth chosen | " + " | ".join(f"{s}: recall@10 (whole)" for s in sets)
             + " | p50 ms | p99 ms | build s | load |", "|" + "---|" * (7 + len(sets))]
    for point in result["sizes"]:
        for stage in STAGES:
            p = point[stage]
            breadth = (f"margin {p['margin']}" if "margin" in p else f"ef {p['ef_search']}" if "ef_search" in p
                       else "-")
            cells = [f"{p['sets'][s]['recall_at_10']:.3f} ({p['sets'][s]['exact_top10']:.2f})" for s in sets]
            lines.append(f"| {point['rows']:,} | {stage} | {breadth} | " + " | ".join(cells)
                         + f" | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p.get('build_s', '-')} | "
                         f"{point['load_average'][0]:.1f} |")
    if result.get("fit"):
        lines.append("\nexponents in the rows: " + ", ".join(f"{k} {v}" for k, v in result["fit"].items()))
    if result.get("projection"):
        proj = result["projection"]
        lines.append(f"\nprojected p50 at {proj['rows']:,} x {proj['dim']}: "
                     + ", ".join(f"{k} {v} ms" for k, v in proj["p50_ms"].items()))
        if proj.get("pqscan_fixed_plus_per_row"):
            linear = proj["pqscan_fixed_plus_per_row"]
            lines.append(f"pqscan as {linear['fixed_ms']} ms + {linear['per_million_rows_ms']} ms per million rows: "
                         + ", ".join(f"{k} {v} ms" for k, v in linear.items() if k.startswith("p50")))
        lines.extend(f"- {a}" for a in proj["assumptions"])
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    """p50 against rows (log-log) per first stage, and the worst set's recall@10 against rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(result["queries"])
    rows = [point["rows"] for point in result["sizes"]]
    figure, (cost, recall) = plt.subplots(1, 2, figsize=(10, 4))
    for stage in STAGES:
        cost.plot(rows, [point[stage]["p50_ms"] for point in result["sizes"]], marker="o", label=stage)
        recall.plot(rows, [min(point[stage]["sets"][s]["recall_at_10"] for s in sets) for point in result["sizes"]],
                    marker="o", label=stage)
    cost.set_xscale("log")
    cost.set_yscale("log")
    cost.set_xlabel("rows")
    cost.set_ylabel("first stage p50, ms (batch 1)")
    recall.set_xscale("log")
    recall.set_xlabel("rows")
    recall.set_ylabel(f"recall@10, worst of {', '.join(sets)}")
    for axes in (cost, recall):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(f"{result['model']} x {result['dim']}: growth with the rows")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a bench.scale.growth result (JSON)")
    add_projection_arguments(parser)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    result["fit"] = fit(result)
    result["projection"] = project(result, args.project_rows, args.project_dim, args.project_cores)
    args.result.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()

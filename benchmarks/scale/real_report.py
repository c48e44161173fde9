"""The tables and the plot of a ``bench.scale.real`` result: recall@10 per query group against first-stage
latency, and pqscan's margin against a fixed candidate count at equal mean latency."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def markdown(result: dict) -> str:
    """One row per choice and breadth: recall@10 (exact top-10 share) per group, p50/p99 ms."""
    names = list(result["queries"])
    counts = result["queries"]
    lines = [f"| first stage | breadth | {' | '.join(f'{n} ({counts[n]})' for n in names)} | p50 ms | p99 ms |",
             "|---|---|" + "---|" * len(names) + "---|---|",
             f"| flat (exact) | - | {' | '.join('1.000' for _ in names)} | {result['flat']['p50_ms']} | {result['flat']['p99_ms']} |"]
    for row in result["choices"] + result["peers"]:
        sweeps = [(row["choice"], row["knob"], row["sweep"])]
        if row.get("fixed_rescore_sweep"):
            sweeps.append((f"{row['choice']}, margin 0", "rescore", row["fixed_rescore_sweep"]))
        for choice, knob, points in sweeps:
            for p in points:
                mark = " (calibrated)" if knob == row["knob"] and row.get("calibrated", {}).get("breadth") == p["breadth"] else ""
                cells = " | ".join(f"{p[n]['recall_at_10']:.3f} ({p[n]['exact_top10']:.2f})" for n in names)
                lines.append(f"| {choice} | {knob} {p['breadth']}{mark} | {cells} | {p['p50_ms']} | {p['p99_ms']} |")
    return "\n".join(lines) + "\n"


def at_equal_latency(row: dict, names: list[str]) -> list[dict]:
    """Each margin of a pqscan sweep beside a fixed number of candidates rescored at the same mean latency: the
    fixed sweep's recall interpolated in mean ms between the two counts around it (margins outside the fixed
    sweep's range are left out)."""
    fixed = sorted(row["fixed_rescore_sweep"], key=lambda p: p["mean_ms"])
    mean_ms = [p["mean_ms"] for p in fixed]
    rows = []
    for point in row["sweep"]:
        if not mean_ms[0] <= point["mean_ms"] <= mean_ms[-1]:
            continue
        rows.append({"margin": point["breadth"], "mean_ms": point["mean_ms"],
                     **{name: {"margin": point[name]["recall_at_10"],
                               "fixed": round(float(np.interp(point["mean_ms"], mean_ms,
                                                              [p[name]["recall_at_10"] for p in fixed])), 4)}
                        for name in names}})
    return rows


def equal_latency_markdown(result: dict) -> str:
    """The margin against a fixed candidate count at equal mean latency, per group (empty without a pqscan row)."""
    names = list(result["queries"])
    rows = [r for r in result["choices"] if r.get("fixed_rescore_sweep")]
    if not rows:
        return ""
    lines = [f"| margin | mean ms | {' | '.join(f'{n}: margin / fixed' for n in names)} |",
             "|---|---|" + "---|" * len(names)]
    for entry in at_equal_latency(rows[0], names):
        cells = " | ".join(f"{entry[n]['margin']:.3f} / {entry[n]['fixed']:.3f}" for n in names)
        lines.append(f"| {entry['margin']} | {entry['mean_ms']} | {cells} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    """Recall@10 (the mean over groups) against first-stage p50, one curve per choice and peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["queries"])
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row in result["choices"] + result["peers"]:
        ours = row in result["choices"]
        curves = [(row["choice"], row["sweep"])]
        if row.get("fixed_rescore_sweep"):
            curves.append((f"{row['choice']} (fixed rescore)", row["fixed_rescore_sweep"]))
        for label, points in curves:
            x = [p["p50_ms"] for p in points]
            y = [min(p[n]["recall_at_10"] for n in names) for p in points]
            axes.plot(x, y, marker="o" if ours else "x", linestyle="-" if ours else "--", label=label)
    axes.axvline(result["flat"]["p50_ms"], color="grey", linestyle=":", label="flat (exact) p50")
    axes.set_xscale("log")
    axes.set_xlabel("first stage p50, ms (batch 1, one thread)")
    axes.set_ylabel("recall@10 of the worst query group")
    axes.set_title(f"{result['rows']:,} x {result['dim']} real rows: {', '.join(names)}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path

"""The scale benchmark's outputs: a table on the terminal, the JSON file, a recall-vs-latency plot (PNG)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

PLOT_HINT = "pip install matplotlib"
# each sweep of a result: its key, the name of a point (the knob's value added), and the knob
SWEEPS = (("hnsw_sweep", "hnsw ef", "ef_search"), ("ivf_sweep", "ivf nprobe", "nprobe"))


def _sweeps(result: dict):
    """(name, knob, points) of each sweep ``result`` holds."""
    return [(name, knob, result[key]) for key, name, knob in SWEEPS if result.get(key)]


def print_table(results: list[dict], console: Console | None = None) -> None:
    table = Table(title="first stage, batch 1 (ms; this machine, one run)")
    for column in ("rows x dim", "first stage", "p50", "p99", "recall@10", "top-10 exact", "rescore p50"):
        table.add_column(column)
    for r in results:
        shape = f"{r['rows']:,} x {r['dim']}"
        flat = r["flat"]
        table.add_row(shape, "flat", f"{flat['first_stage']['p50']:.2f}", f"{flat['first_stage']['p99']:.2f}",
                      f"{flat['recall_at_10']:.3f}", "-", "-")
        for name, knob, points in _sweeps(r):
            for s in points:
                exact = f"{s['exact_top10']:.3f}" if "exact_top10" in s else "-"  # older runs did not count it
                table.add_row(shape, f"{name} {s[knob]}", f"{s['first_stage']['p50']:.2f}",
                              f"{s['first_stage']['p99']:.2f}", f"{s['recall_at_10']:.3f}", exact,
                              f"{s['rescore_ms_p50']:.3f}")
    (console or Console()).print(table)
    serving = [r["serving"] for r in results if r.get("serving")]
    if serving:
        print_serving(serving, console)


def print_serving(runs: list[dict], console: Console | None = None) -> None:
    """One row per server: the model alone, then flat and hnsw or ivf over the imported rows."""
    table = Table(title="served over HTTP, default settings; RSS before the first query (this machine, one run)")
    for column in ("rows x dim", "server", "import s", "ready s", "RSS MB", "anon + file", "1st /search ms",
                   "/search p50"):
        table.add_column(column)
    for run in runs:
        shape = f"{run['rows']:,} x {run['dim']}"
        for name in ("model_only", "flat", *(ann for ann in ("hnsw", "ivf") if ann in run)):
            s, label = run[name], run["model"] if name == "model_only" else name
            memory = s["before_first_query"]
            table.add_row(shape, label, f"{s['import_s']:.1f}" if "import_s" in s else "-", f"{s['ready_s']:.1f}",
                          f"{memory['rss_mb']:.0f}", f"{memory['anon_mb']:.0f} + {memory['file_mb']:.0f}",
                          f"{s['first_search_ms']:.1f}" if "first_search_ms" in s else "-",
                          f"{s['search']['p50']:.1f}" if "search" in s else "-")
    (console or Console()).print(table)


def write_json(results: list[dict], path: Path) -> Path:
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return path


def _vectors_label(result: dict) -> str:
    """``result``'s rows as a legend names them: shape, and which vectors when they are not the clustered ones."""
    vectors = result.get("vectors", "")
    kind = ("" if not vectors or vectors.startswith("clustered")
            else f", real + {result['fit_components']}-component mixture" if result.get("fit_components", 1) > 1
            else ", real + Gaussian")
    return f"{result['rows']:,} x {result['dim']}{kind}"


def plot(results: list[dict], path: Path) -> Path:
    """Batch-1 p50 latency against recall@10 (left) and against the share of queries whose final top-10 is the
    exhaustive one (right; runs that counted it): one curve per sweep (ef_search or nprobe), the flat scan as a point."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(f"the plot needs matplotlib: {PLOT_HINT}") from exc
    fig, (recall_ax, exact_ax) = plt.subplots(1, 2, figsize=(12.8, 5.6), sharex=True, sharey=True,
                                             layout="constrained")
    for r in results:
        label = _vectors_label(r)
        for name, knob, points in _sweeps(r):
            marker = "o" if knob == "ef_search" else "^"
            line, = recall_ax.plot([s["first_stage"]["p50"] for s in points], [s["recall_at_10"] for s in points],
                                   marker=marker, label=f"{name.split()[0]}, {label}")
            counted = [s for s in points if "exact_top10" in s]  # older runs did not count it
            if counted:
                exact_ax.plot([s["first_stage"]["p50"] for s in counted], [s["exact_top10"] for s in counted],
                              marker=marker, color=line.get_color())
            for ax, metric in ((recall_ax, "recall_at_10"), (exact_ax, "exact_top10")):
                for s in points if metric == "recall_at_10" else counted:
                    ax.annotate(str(s[knob]), (s["first_stage"]["p50"], s[metric]), fontsize=6,
                                textcoords="offset points", xytext=(3, -8))
        recall_ax.plot([r["flat"]["first_stage"]["p50"]], [r["flat"]["recall_at_10"]], marker="s", linestyle="none",
                       color=line.get_color(), label=f"flat, {label}" + (" (ivf run)" if r.get("ivf_sweep") else ""))
    for ax, ylabel in ((recall_ax, "recall of the final top-10"),
                       (exact_ax, "queries whose final top-10 is exact")):
        ax.set_xscale("log")
        ax.set_xlabel("batch-1 first stage p50 (ms, log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    exact_ax.tick_params(labelleft=True, labelbottom=True)
    fig.suptitle("HNSW (labels: ef_search), IVF (labels: nprobe) vs the exact flat scan", fontsize=10)
    fig.legend(*recall_ax.get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncol=3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

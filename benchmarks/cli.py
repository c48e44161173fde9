"""Command line of the benchmark: ``densehybrid bench``, also ``python -m densehybrid.bench``."""

from __future__ import annotations

import contextlib
import logging
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from densehybrid.bench.config import PRESETS, SECTIONS, BenchConfig

Section = Enum("Section", {name: name for name in SECTIONS}, type=str)
Backend = Enum("Backend", {name: name for name in ("torch", "onnx")}, type=str)
Preset = Enum("Preset", {name: name for name in PRESETS}, type=str)


def config_from(preset: str = "default", *, only: list[str] | None = None, rows: int | None = None,
                threads: int | None = None, device: str | None = None, service_backend: str | None = None,
                service_kind: str | None = None, backends: list[str] | None = None) -> BenchConfig:
    """The preset's configuration with the options given (None: the preset's value)."""
    return PRESETS[preset].with_overrides(
        sections=tuple(only) if only else None, first_stage_rows=rows, device=device, threads=threads,
        service_backend=service_backend, service_kind=service_kind, backends=tuple(backends) if backends else None)


def _values(choices: list[Enum] | None) -> list[str] | None:
    return [choice.value for choice in choices] if choices else None


def bench_command(
    quick: bool = typer.Option(False, "--quick", help="tiny sizes, seconds (what CI runs)"),
    full: bool = typer.Option(False, "--full", help="larger samples: more repeats, approx-GIP over 1M rows, "
                              "a 100k-document service index"),
    preset: Optional[Preset] = typer.Option(None, "--preset", help="named sizes instead of --quick/--full: gpu is "
                                            "the GPU machine's run (benchmarks/gpu/gpu_run.sh), gpu-rehearsal its CPU "
                                            "rehearsal"),
    out: Optional[Path] = typer.Option(None, "--out", help="JSON results file (default: bench-PRESET.json)"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="also write the table as Markdown to this file"),
    only: Optional[list[Section]] = typer.Option(None, "--only", help="run only this section (repeat for several)"),
    rows: Optional[int] = typer.Option(None, "--rows", min=1, help="first-stage rows (default: 1M, capped by memory)"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads for torch, ONNX Runtime and Faiss"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: CUDA when present)"),
    service_backend: Optional[Backend] = typer.Option(None, "--service-backend", help="encoder backend of the server"),
    service_kind: Optional[str] = typer.Option(None, "--service-kind", help="model kind served in the service section (default: dhr)"),
    backends: Optional[list[Backend]] = typer.Option(None, "--backends",
                                                     help="encoder backend to compare (repeat for several; default: both)"),
    scale: Optional[list[int]] = typer.Option(None, "--scale", min=1, help="instead: the scale benchmark at N rows "
                                              "(repeat for several): seeded vectors in Pyserini's layout made an "
                                              "index, flat vs hnsw first stage, recall; see --scale-dim, "
                                              "--plot"),
    scale_dim: int = typer.Option(768, "--scale-dim", min=2, help="--scale: dims of the vectors"),
    scale_fit: Optional[Path] = typer.Option(None, "--scale-fit", exists=True, help="--scale: real passage vectors "
                                             "(.npy) to include, with distractors drawn from their Gaussian fit"),
    scale_fit_components: int = typer.Option(1, "--scale-fit-components", min=1,
                                             help="--scale-fit: draw the distractors from a tied-covariance "
                                             "Gaussian mixture of this many k-means components of the real "
                                             "vectors (1: one Gaussian, no topical clusters)"),
    scale_queries: Optional[Path] = typer.Option(None, "--scale-queries", exists=True,
                                                 help="--scale: real query vectors (.npy) instead of drawn ones"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="--scale: write the recall-vs-latency plot (PNG) here"),
    scale_serve: bool = typer.Option(True, "--scale-serve/--no-scale-serve",
                                     help="--scale: also serve N rows for the offline minilm (384 dims) over HTTP, "
                                     "flat and hnsw first stages: ready time, memory before the first "
                                     "query, /search p50"),
) -> None:
    """Run the performance benchmark: memory bandwidth, first stage, rerank, encoders and a live service, side by
    side in one run, with the targets as ratios."""
    if scale:
        from densehybrid.bench.scale.run import run_scales

        with quiet_libraries():  # the serving part's client would log every request
            run_scales(scale, scale_dim, scale_fit, scale_queries, out or Path("bench-scale.json"), plot, threads,
                       scale_serve, scale_fit_components)
        return
    if quick + full + (preset is not None) > 1:
        raise typer.BadParameter("give one of --quick, --full and --preset", param_hint="--quick/--full/--preset")
    name = preset.value if preset else "quick" if quick else "full" if full else "default"
    config = config_from(name, only=_values(only), rows=rows,
                         threads=threads, device=device, service_backend=service_backend and service_backend.value,
                         service_kind=service_kind, backends=_values(backends))
    run_and_report(config, out, markdown)


NOISY_LOGGERS = ("httpx", "httpcore", "transformers", "faiss.loader", "uvicorn", "uvicorn.error", "service",
                 "densehybrid.access")


@contextlib.contextmanager
def quiet_libraries():
    """Per-request access logs of the servers under test would drown the table; restored afterwards."""
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_and_report(config: BenchConfig, out: Path | None, markdown: Path | None = None) -> dict:
    with quiet_libraries():  # before the imports: faiss logs its loader attempts at import time
        from densehybrid.bench import report, runner

        results = runner.run(config)
    report.print_table(results)
    path = report.write_json(results, out or Path(f"bench-{config.preset}.json"))
    if markdown is not None:
        markdown.write_text(report.markdown(results))
    logging.getLogger(__name__).info("results written to %s", path)
    return results


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    single = typer.Typer(add_completion=False)
    single.command()(bench_command)
    single(prog_name="python -m densehybrid.bench")

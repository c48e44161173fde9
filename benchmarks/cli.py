"""Command line of the benchmark (also ``densehybrid bench``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path

from densehybrid.bench.config import PRESETS, SECTIONS, BenchConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m densehybrid.bench", description="densehybrid performance benchmark (DESIGN §8)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="preset", const="quick", help="tiny sizes, seconds (CI)")
    size.add_argument("--full", action="store_const", dest="preset", const="full", help="larger samples")
    p.add_argument("--out", type=Path, default=None, help="JSON results file [bench-<preset>.json]")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown to this file")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=None, help="run only these sections")
    p.add_argument("--rows", type=int, default=None, help="first-stage rows (default 1M, capped by memory)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch, ONNX Runtime and Faiss")
    p.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when present)")
    p.add_argument("--service-backend", choices=("torch", "onnx"), default=None, help="encoder backend of the server")
    p.add_argument("--service-kind", default=None, help="model kind served in the service section [dhr]")
    p.add_argument("--backends", nargs="+", choices=("torch", "onnx"), default=None, help="encoder backends to compare")
    return p


def config_from(args: argparse.Namespace) -> BenchConfig:
    config = PRESETS[args.preset or "default"]
    return config.with_overrides(
        sections=tuple(args.only) if args.only else None, first_stage_rows=args.rows, device=args.device, threads=args.threads,
        service_backend=args.service_backend, service_kind=args.service_kind,
        backends=tuple(args.backends) if args.backends else None)


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


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    run_and_report(config_from(args), args.out, args.markdown)

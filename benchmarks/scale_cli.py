"""``densehybrid bench --scale N``: run :mod:`densehybrid.bench.scale` for each N, print, write JSON and the plot."""

from __future__ import annotations

import logging
from pathlib import Path

from densehybrid.bench import scale_report
from densehybrid.bench.scale import ScaleConfig, run_scale

log = logging.getLogger(__name__)


def run_scales(sizes: list[int], dim: int, fit: Path | None, queries: Path | None, out: Path,
               plot: Path | None, threads: int | None) -> list[dict]:
    if threads:
        import faiss

        faiss.omp_set_num_threads(threads)
    work = out.parent / f"{out.stem}-data"  # removed after each size
    results = [run_scale(ScaleConfig(rows=n, dim=dim, fit=fit, real_queries=queries, work=work)) for n in sizes]
    scale_report.print_table(results)
    scale_report.write_json(results, out)
    if plot is not None:
        scale_report.plot(results, plot)
    log.info("scale results written to %s%s", out, f" and {plot}" if plot else "")
    return results

"""``densehybrid bench --scale N``: run :mod:`densehybrid.bench.scale.search` (and, unless told not to,
:mod:`densehybrid.bench.scale.serve`) for each N; print, write JSON and the plot."""

from __future__ import annotations

import logging
from pathlib import Path

from densehybrid.bench.scale import report
from densehybrid.bench.scale.search import ScaleConfig, run_scale

log = logging.getLogger(__name__)


def run_scales(sizes: list[int], dim: int, fit: Path | None, queries: Path | None, out: Path,
               plot: Path | None, threads: int | None, serve: bool = True, fit_components: int = 1) -> list[dict]:
    if threads:
        import faiss

        faiss.omp_set_num_threads(threads)
    work = out.parent / f"{out.stem}-data"  # removed after each size
    results = []
    for n in sizes:
        config = ScaleConfig(rows=n, dim=dim, fit=fit, real_queries=queries, work=work, fit_components=fit_components)
        result = run_scale(config)
        if serve:  # fresh server processes of their own: the numbers above are of this one
            from densehybrid.bench.scale.serve import run_serving

            result["serving"] = run_serving(n, work, config.hnsw, config.seed)
        results.append(result)
    report.print_table(results)
    report.write_json(results, out)
    if plot is not None:
        report.plot(results, plot)
    log.info("scale results written to %s%s", out, f" and {plot}" if plot else "")
    return results

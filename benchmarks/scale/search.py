"""``densehybrid bench --scale N``: N seeded passage vectors in Pyserini's layout, made an index, searched.

Steps, each timed: write the vectors as a Pyserini Faiss directory (``index`` + ``docid``); import it
(``index import --ann hnsw``: the float16 copy, and an HNSW graph built from it); open it (time and
resident memory); then batch-1 first stages: the exact flat scan, and the graph at each ``ef_search`` of
the sweep with its candidates rescored exactly. Recall is of the final top-10 against the
exhaustive top-10 over the same float16 rows, and ``exact_top10`` the share of queries whose final
top-10 is that top-10 entire. The numbers are of this machine and this run; on a shared machine,
compare ratios within one run only.
"""

from __future__ import annotations

import json
import logging
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from densehybrid.bench.scale import pyserini_layout, vectors
from densehybrid.bench.timing import summarize
from densehybrid.encoder.base import EncoderSpec
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.engines import faiss_engine, hnsw_engine
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.served.loading import load_index

log = logging.getLogger(__name__)

K = 10


@dataclass(frozen=True)
class ScaleConfig:
    rows: int
    dim: int = 768
    queries: int = 200
    seed: int = 0
    ef_sweep: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    work: Path = Path("runs/scale")
    fit: Path | None = None  # real passage vectors (.npy) the distractors are drawn to match
    fit_components: int = 1  # of the Gaussian mixture fitted to ``fit`` the distractors are drawn from
    real_queries: Path | None = None  # real query vectors (.npy) instead of drawn ones
    keep_files: bool = False  # leave the Pyserini directory and the index in ``work`` (they are large)


# opens the index in a process of its own: in this one, freed arrays would hide what the index takes
_OPEN_SCRIPT = """
import json, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
from densehybrid.index.served.loading import load_index
before, started = rss(), time.perf_counter()
index = load_index(sys.argv[1], checksums=False)
print(json.dumps({"open_s": round(time.perf_counter() - started, 3), "rss_added_mb": round(rss() - before, 1)}))
"""


def open_cost(path: Path) -> dict:
    """Seconds to open the index and the resident memory it adds, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _OPEN_SCRIPT, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


def _vectors(config: ScaleConfig) -> tuple[np.ndarray, np.ndarray, str]:
    fit = None if config.fit is None else np.load(config.fit)
    xb = vectors.passages(config.rows, config.dim, config.seed, fit, config.fit_components)
    if config.real_queries is not None:
        xq = np.load(config.real_queries).astype(np.float32)
    else:
        xq = vectors.queries(config.queries, config.dim, config.seed)
    mixture = ("Gaussian-fitted" if config.fit_components == 1
               else f"{config.fit_components}-component Gaussian-mixture-fitted")
    source = "clustered synthetic" if fit is None else f"{len(fit)} real vectors + {mixture} distractors"
    return xb, xq, source + (", real queries" if config.real_queries else ", drawn queries")


def exhaustive_top(xq: np.ndarray, values: np.ndarray, k: int = K) -> np.ndarray:
    """(Q, k) rows of the exact top-k inner products over ``values`` (read in chunks)."""
    best = faiss_engine.faiss.IndexFlatIP(values.shape[1])
    for s in range(0, len(values), 65_536):
        best.add(np.asarray(values[s:s + 65_536], dtype=np.float32))
    return best.search(np.ascontiguousarray(xq, dtype=np.float32), k)[1]


def _recall(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]))


def _exact_share(got: np.ndarray, want: np.ndarray) -> float:
    """The share of queries whose top-k is the exhaustive top-k entire."""
    return float(np.mean([set(g) == set(w) for g, w in zip(got, want)]))


def _per_query(fn, xq: np.ndarray) -> tuple[dict, np.ndarray]:
    """Batch-1 calls of ``fn(q (1, dim)) -> rows (1, K)``: timing of each after two warm-ups, rows (Q, K)."""
    fn(xq[:1]), fn(xq[:1])
    samples, rows = [], []
    for q in range(len(xq)):
        start = time.perf_counter()
        rows.append(fn(xq[q:q + 1])[0])
        samples.append((time.perf_counter() - start) * 1000)
    return summarize(samples).to_dict(), np.array(rows)


def _publish(config: ScaleConfig, pyserini: Path, out: Path, dim: int) -> dict:
    """``index import --ann hnsw`` of the Pyserini directory: the float16 copy, then the graph built from it."""
    started = time.perf_counter()
    spec = EncoderSpec(kind="cls", dim=dim, gated_dim=0, lam=1.0, model_id="bench-scale",
                       weights_hash="synthetic")
    import_pyserini(pyserini, out, spec, ImportOptions(ann=config.hnsw))
    manifest = json.loads((out / "manifest.json").read_text())
    return {"import_s": round(time.perf_counter() - started, 2), "hnsw": manifest["first_stage"]}


def _hnsw_sweep(config: ScaleConfig, index, xq: np.ndarray, want: np.ndarray) -> list[dict]:
    graph = hnsw_engine.HnswStore(index.ann, index.values, None, index.doc_ids, config.hnsw.ef_search, index.ann_rows)
    sweep = []
    for ef in config.ef_sweep:
        timing, rows = _per_query(lambda q: graph.inner_product(q, K, ef_search=ef)[1], xq)
        candidates = np.sort(np.random.default_rng(ef).choice(config.rows, min(config.rows, max(ef, K)), replace=False))
        rescore, _ = _per_query(lambda q: hnsw_engine.rescore(q, index.values, candidates[None], K)[1], xq)
        sweep.append({"ef_search": ef, "first_stage": timing, "rescore_ms_p50": rescore["p50"],
                      "recall_at_10": _recall(rows, want), "exact_top10": _exact_share(rows, want)})
    return sweep


def run_scale(config: ScaleConfig) -> dict:
    work = config.work / f"n{config.rows}-d{config.dim}"
    shutil.rmtree(work, ignore_errors=True)
    xb, xq, source = _vectors(config)
    started = time.perf_counter()
    pyserini = pyserini_layout.write_pyserini_dir(work / "pyserini", xb, [f"p{i}" for i in range(len(xb))])
    written_s = time.perf_counter() - started
    dim = xb.shape[1]
    del xb
    built = _publish(config, pyserini, work / "index", dim)
    opened = open_cost(work / "index")
    index = load_index(work / "index", checksums=False)
    want = exhaustive_top(xq, index.values)
    flat = faiss_engine.FaissStore(index.faiss, index.values, None, index.doc_ids)
    flat_timing, flat_rows = _per_query(lambda q: flat.inner_product(q, K)[1], xq)
    sweep = _hnsw_sweep(config, index, xq, want)
    result = {"rows": config.rows, "dim": config.dim, "queries": len(xq), "vectors": source, "k": K,
              "pyserini_write_s": round(written_s, 2), **built, **opened, "files": _sizes(work / "index"),
              "pyserini_files": _sizes(pyserini), "flat": {"first_stage": flat_timing,
                                                           "recall_at_10": _recall(flat_rows, want)},
              "hnsw_sweep": sweep, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    del index, flat
    if not config.keep_files:
        shutil.rmtree(work, ignore_errors=True)
    log.info("scale %d x %d: flat p50 %.2f ms; hnsw %s", config.rows, config.dim, flat_timing["p50"],
             ", ".join(f"ef_search {s['ef_search']}: {s['first_stage']['p50']:.2f} ms r@10 {s['recall_at_10']:.3f}"
                       for s in sweep))
    return result

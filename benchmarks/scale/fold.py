"""A fold at scale: N stored rows, W documents written through the live index, then one compaction, each phase timed.

``python -m densehybrid.bench.scale.fold --rows 1000000 --written 10000 --work runs/fold`` writes a
seeded index of ``rows`` x ``dim`` float16 rows straight in the index format (HashEncoder's ``cls``
spec; the vectors are random, which is fine here: a fold copies rows, it never ranks them), opens it
as a server does (a :class:`~densehybrid.index.writes.live.LiveIndex` with a write-ahead log), writes
``written`` documents in batches the way ``POST /documents`` does (values from the same generator; one
in ten replaces a stored document, so the fold drops base rows too), and compacts once through the
fold child process. ``--profile`` also runs the same fold in this process under cProfile and prints
its top functions. It prints one JSON report; the numbers are of this machine and this run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import time
from pathlib import Path

import numpy as np

from densehybrid.bench.servers.hash_encoder import HashEncoder
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served import loading
from densehybrid.index.storage import durable, files
from densehybrid.index.storage.documents import Document, write_docs
from densehybrid.index.storage.vectors import write_vectors
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta, apply
from densehybrid.index.writes.live import LiveIndex
from densehybrid.index.writes.wal import iter_changes

_CHUNK = 65_536


def _rows(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _doc(i: int, prefix: str = "p") -> Document:
    return Document(f"{prefix}{i}", f"title {i}", f"passage {i} about dense retrieval at scale, row {i}")


def make_index(path: Path, rows: int, dim: int, seed: int = 0) -> Path:
    """A published flat index of ``rows`` seeded rows at ``path`` (replacing it)."""
    spec = HashEncoder("cls", dense_dim=dim).spec
    staged = path.with_name(path.name + ".staging")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    write_vectors(staged / "vectors.faiss", (_rows(min(_CHUNK, rows - s), dim, rng) for s in range(0, rows, _CHUNK)),
                  count=rows, dim=dim)
    files.write_doc_ids(staged, [f"p{i}" for i in range(rows)])
    write_docs(staged, (_doc(i) for i in range(rows)))
    files.write_manifest(staged, name=path.name, spec=spec, count=rows, lam=spec.lam, first_stage={"type": "flat_ip"})
    shutil.rmtree(path, ignore_errors=True)
    durable.publish(staged, path)
    return path


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - started, 3)


def _write(live: LiveIndex, written: int, batch: int, base_rows: int, dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    for s in range(0, written, batch):
        ids = range(s, min(written, s + batch))
        # one in ten replaces a stored document (its base row is hidden, then dropped by the fold)
        docs = [_doc(i * 97 % base_rows) if i % 10 == 0 else _doc(i, "w") for i in ids]
        live.upsert(docs, _rows(len(docs), dim, rng), None)


def _profile_fold(index: Path, log_dir: Path, out: Path, top: int) -> str:
    """The fold of the whole log into ``out`` (not over the index), in this process, under cProfile: its
    top functions by cumulative time."""
    def fold_logged() -> None:
        base = loading.load_index(index)
        delta = Delta()
        for change in iter_changes(log_dir):
            delta = apply(delta, base, change, replaying=True)
        fold(base, delta, out, delta.changes)

    profiler = cProfile.Profile()
    profiler.runcall(fold_logged)
    shutil.rmtree(out)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def run(rows: int, written: int, work: Path, *, dim: int = 768, batch: int = 100, seed: int = 0,
        profile: bool = False, keep: bool = False, reuse: bool = False) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    index, log_dir = work / "index", work / "wal"
    shutil.rmtree(log_dir, ignore_errors=True)
    report: dict = {"rows": rows, "written": written, "dim": dim, "write_batch": batch}
    if not (reuse and (index / files.MANIFEST).is_file()):
        _, report["make_index_s"] = _timed(lambda: make_index(index, rows, dim, seed))
    report["index_bytes"] = sum(p.stat().st_size for p in index.iterdir())
    base, report["load_index_s"] = _timed(lambda: loading.load_index(index))
    report["stored_rows"] = base.count
    live, report["open_live_s"] = _timed(lambda: LiveIndex.open(index, Searcher, log_dir=log_dir, base=base))
    try:
        _, report["first_write_s"] = _timed(lambda: _write(live, batch, batch, rows, dim, seed))
        _, report["writes_s"] = _timed(lambda: _write(live, written, batch, rows, dim, seed))
        report["count_before_fold"] = live.count
        if profile:
            report["profile"] = _profile_fold(index, log_dir, work / "profiled", 30)
        live.prepare_compaction()
        _, report["compact_s"] = _timed(live.compact)
        report["count_after_fold"] = live.count
        report["index_count_after_fold"] = live.base.count
    finally:
        live.close()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--written", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--batch", type=int, default=100, help="documents per write (one POST /documents)")
    parser.add_argument("--work", type=Path, default=Path("runs/fold"))
    parser.add_argument("--profile", action="store_true", help="also profile the fold in this process")
    parser.add_argument("--keep", action="store_true", help="leave the index and the log in --work")
    parser.add_argument("--reuse", action="store_true", help="fold into the index --keep left in --work (it holds "
                                                             "the earlier run's writes too)")
    args = parser.parse_args(argv)
    report = run(args.rows, args.written, args.work, dim=args.dim, batch=args.batch, profile=args.profile,
                 keep=args.keep, reuse=args.reuse)
    profile = report.pop("profile", None)
    print(json.dumps(report, indent=2))
    if profile:
        print(profile)


if __name__ == "__main__":
    main()

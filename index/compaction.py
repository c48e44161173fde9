"""Fold a live index's delta into a new generation, published the way builds are.

The live base rows (hidden ones dropped) and then the delta rows are written as build
shards in ``<index>.partial/``, assembled, given a manifest that records the last folded
log sequence number (``writes.applied_seq``, so a restart never applies a change twice),
fsynced, and renamed into place by :func:`index.store.publish`. A crash at any point
leaves either the old generation or the new one, and the log still holds every change the
new one lacks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index import flat, shards, store
from densehybrid.index.store import IndexFiles
from densehybrid.index.wal import fsync_directory

_CHUNK_ROWS = 65_536


def _pq_config(first_stage: dict) -> flat.PQConfig | None:
    if first_stage.get("type") != "pq":
        return None
    return flat.PQConfig(**{k: v for k, v in first_stage.items() if k != "type"})


def _base_values(base: IndexFiles, rows: np.ndarray) -> np.ndarray:
    """float32 values of base ``rows``: exact from a flat Faiss index, else the stored float16."""
    if isinstance(base.faiss, faiss.IndexFlat) and len(rows):
        first = int(rows[0])
        return base.faiss.reconstruct_n(first, int(rows[-1]) - first + 1)[rows - first]
    return np.asarray(base.values[rows], dtype=np.float32)


def _fsync_tree(directory: Path) -> None:
    for p in directory.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_directory(directory)


def fold(base: IndexFiles, delta, out: Path, applied_seq: int) -> Path:
    """Write base (minus ``delta.hidden``) + ``delta`` rows as a new generation at ``out`` (replacing it)."""
    out = Path(out)
    work = shards.work_dir(out)
    shutil.rmtree(work, ignore_errors=True)  # an interrupted earlier compaction
    shards.start(work, {"from": "compaction", "applied_seq": applied_seq}, resume=False)
    hidden = np.array(sorted(delta.hidden), dtype=np.int64)
    keep = np.setdiff1d(np.arange(base.count, dtype=np.int64), hidden)
    number = 0
    for s in range(0, len(keep), _CHUNK_ROWS):
        rows = keep[s:s + _CHUNK_ROWS]
        docs = base.docs.get_many([base.doc_ids[r] for r in rows])
        gates = np.asarray(base.gates[rows]) if base.gates is not None else None
        shards.write_shard(work, number, _base_values(base, rows), gates, docs)
        number += 1
    if len(delta):
        shards.write_shard(work, number, delta.values, delta.gates, delta.docs)
    count = len(keep) + len(delta)
    spec = base.spec
    staged = shards.assemble(work, count=count, dim=spec.dim, gated_dim=spec.gated_dim,
                             pq=_pq_config(base.manifest["first_stage"]))
    extra = {k: base.manifest[k] for k in ("lambda", "build") if k in base.manifest}
    store.write_manifest(staged, name=base.name, spec=spec, count=count, lam=base.lam,
                         first_stage=base.manifest["first_stage"], extra={**extra, "writes": {"applied_seq": applied_seq}})
    _fsync_tree(staged)
    store.publish(staged, out, overwrite=True)
    fsync_directory(out.parent)
    shards.finish(work)
    return out

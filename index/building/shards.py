"""Build-time files: the work directory of an unfinished build, its shards, and final assembly.

A build works in ``<out>.partial/`` next to the target:

    build.json        what is being built (corpus checksum, encoder spec, sizes); a resume must match it
    shards/00000/     values.npy (float32), gates.npy, docs.jsonl - one per ``shard_size`` passages,
                      written as ``00000.tmp/`` and renamed, so a shard exists whole or not at all
    index/            the assembled index, renamed to ``<out>`` when complete

Together with :mod:`index.storage.files` and :mod:`index.storage.documents` this is all the file I/O of an index build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from densehybrid.index.storage.documents import Document, write_docs
from densehybrid.index.storage.durable import fsync_files
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.building.first_stage import AnnConfig, write_vectors_and_first_stage
from densehybrid.index.storage.files import GATES, VALUES, write_doc_ids

STATE = "build.json"
_SHARD_NAME = re.compile(r"^\d{5}$")


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def start(work: Path, state: dict, *, resume: bool) -> None:
    """Create the work directory, or check that a resumed one was started with the same ``state``."""
    path = work / STATE
    if work.exists() and resume and path.is_file():
        recorded = json.loads(path.read_text(encoding="utf-8"))
        for key in sorted(set(recorded) | set(state)):
            if recorded.get(key) != state.get(key):
                raise IndexWriteError(f"{path}: cannot resume, {key} differs from the interrupted build "
                                      f"({recorded.get(key)!r} then, {state.get(key)!r} now); delete {work} to start over")
        return
    if work.exists() and not resume:
        raise IndexWriteError(f"{work}: an interrupted build is in the way; pass --resume to continue it or delete it")
    if work.exists():
        shutil.rmtree(work)
    (work / "shards").mkdir(parents=True)
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def completed(work: Path) -> int:
    """Number of complete shards (a contiguous run 00000, 00001, ...)."""
    names = {p.name for p in (work / "shards").iterdir() if p.is_dir() and _SHARD_NAME.match(p.name)}
    n = 0
    while f"{n:05d}" in names:
        n += 1
    return n


def write_shard(work: Path, number: int, values: np.ndarray, gates: np.ndarray | None, docs: Sequence[Document]) -> None:
    """Write one shard atomically: values (n, dim) float32, gates (n, G) uint8 or None, n docs."""
    final = work / "shards" / f"{number:05d}"
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    np.save(tmp / VALUES, np.ascontiguousarray(values, dtype=np.float32))
    if gates is not None:
        np.save(tmp / GATES, np.ascontiguousarray(gates, dtype=np.uint8))
    with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps([d.id, d.title, d.text], ensure_ascii=False) + "\n")
    fsync_files(tmp)
    os.rename(tmp, final)


def _shard_dirs(work: Path) -> list[Path]:
    return [work / "shards" / f"{i:05d}" for i in range(completed(work))]


def iter_shard_arrays(work: Path, name: str) -> Iterator[np.ndarray]:
    return (np.load(d / name, mmap_mode="r") for d in _shard_dirs(work))


def iter_shard_docs(work: Path) -> Iterator[Document]:
    for d in _shard_dirs(work):
        with open(d / "docs.jsonl", encoding="utf-8") as f:
            for line in f:
                yield Document(*json.loads(line))


def assemble(work: Path, *, count: int, dim: int, gated_dim: int,
             values_dtype: str = "float16", ann: AnnConfig | None = None) -> tuple[Path, dict]:
    """Concatenate the shards into ``work/index`` (everything but the manifest) -> (that directory,
    the manifest's ``first_stage`` entry)."""
    staged = work / "index"
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir()
    first_stage = write_vectors_and_first_stage(staged, iter_shard_arrays(work, VALUES), count=count, dim=dim,
                                                values_dtype=values_dtype, ann=ann)
    if gated_dim:
        write_rows(staged / GATES, iter_shard_arrays(work, GATES), (count, gated_dim), np.uint8)
    doc_ids = [d.id for d in iter_shard_docs(work)]
    if len(set(doc_ids)) != len(doc_ids):
        seen: set[str] = set()
        dup = next(i for i in doc_ids if i in seen or seen.add(i))
        raise IndexWriteError(f"corpus: document id {dup!r} occurs more than once")
    write_doc_ids(staged, doc_ids)
    write_docs(staged, iter_shard_docs(work))
    return staged, first_stage


def write_rows(path: Path, parts: Iterable[np.ndarray], shape: tuple[int, int], dtype) -> None:
    """The row blocks ``parts``, in order, as one .npy file of ``shape``; one block in memory at a time."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    at = 0
    for part in parts:
        out[at:at + len(part)] = part
        at += len(part)
    if at != shape[0]:
        raise IndexWriteError(f"{path}: {at} rows written, expected {shape[0]}")
    out.flush()
    del out


def finish(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)


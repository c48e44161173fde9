"""Vectors in Pyserini's prebuilt Faiss layout: a directory with a Faiss ``IndexFlatIP`` file named ``index``
and a ``docid`` file holding one id per line, in row order (as ``msmarco-v1-passage.aggretriever-*``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

INDEX, DOCID = "index", "docid"
_ADD_ROWS = 65_536


def write_pyserini_dir(directory: str | Path, xb: np.ndarray, doc_ids: Sequence[str]) -> Path:
    """Write ``xb`` (N, dim) float and ``doc_ids`` (N,) as a Pyserini Faiss directory; returns it."""
    if len(xb) != len(doc_ids):
        raise ValueError(f"{len(xb)} vectors for {len(doc_ids)} ids")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    index = faiss.IndexFlatIP(xb.shape[1])
    for s in range(0, len(xb), _ADD_ROWS):
        index.add(np.ascontiguousarray(xb[s:s + _ADD_ROWS], dtype=np.float32))
    faiss.write_index(index, str(directory / INDEX))
    (directory / DOCID).write_text("".join(f"{d}\n" for d in doc_ids), encoding="utf-8")
    return directory


def read_pyserini_dir(directory: str | Path) -> tuple[np.ndarray, list[str]]:
    """(vectors (N, dim) float32, ids) of a Pyserini Faiss directory."""
    directory = Path(directory)
    index = faiss.read_index(str(directory / INDEX))
    ids = (directory / DOCID).read_text(encoding="utf-8").splitlines()
    if index.ntotal != len(ids):
        raise ValueError(f"{directory}: {index.ntotal} vectors but {len(ids)} ids")
    return index.reconstruct_n(0, index.ntotal), ids

"""Vectors in Pyserini's prebuilt Faiss layout: a directory with a Faiss ``IndexFlatIP`` file named ``index``
and a ``docid`` file holding one id per line, in row order (as ``msmarco-v1-passage.aggretriever-*``); the
import reads it back (``index.building.importing.read_pyserini``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.building.importing import PYSERINI_DOCID, PYSERINI_INDEX

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
    faiss.write_index(index, str(directory / PYSERINI_INDEX))
    (directory / PYSERINI_DOCID).write_text("".join(f"{d}\n" for d in doc_ids), encoding="utf-8")
    return directory


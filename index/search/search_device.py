"""Where a search runs: the first stage and the rerank's device, chosen apart from the encoder's."""

from __future__ import annotations

import logging

from densehybrid.index.errors import SearchError
from densehybrid.index.search.served import StoredIndex

log = logging.getLogger(__name__)


def resolve_search_device(requested: str | None, index: StoredIndex) -> str:
    """Where the first stage and rerank run, chosen apart from the encoder's device.

    ``auto``/None: a GPU when torch sees one, else the CPU. ``cpu``: Faiss on the CPU.
    ``cuda``/``cuda:N``: exact torch search on that GPU (all GPUs for ``cuda``).
    """
    import torch

    if index.remote:  # a Milvus collection: Milvus searches, the rerank is local numpy
        if requested not in (None, "", "auto", "cpu"):
            log.info("a Milvus collection searches in Milvus (search device %s ignored)", requested)
        return "cpu"
    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if not requested.startswith("cuda"):
        raise SearchError(f"unknown search device {requested!r}; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise SearchError(f"search device {requested!r} requested but torch sees no CUDA device; use cpu or auto")
    index_no = requested.partition(":")[2]
    if index_no and (not index_no.isdigit() or int(index_no) >= torch.cuda.device_count()):
        raise SearchError(f"search device {requested!r}: only {torch.cuda.device_count()} CUDA devices exist")
    return requested

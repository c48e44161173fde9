"""A small real index over a generated corpus: what the load benchmarks serve.

The corpus is BEIR-style JSON lines; passages are a few words drawn from ``TOPICS``, so any query made
of topic words has matches.
"""

from __future__ import annotations

import json
from pathlib import Path

from densehybrid.encoder.base import Encoder

TOPICS = ["dense retrieval", "lexical matching", "gated inner product", "aggregation of term weights",
          "faiss flat index", "query latency", "passage ranking", "bm25 baseline", "neural reranking",
          "vector quantization"]


def write_toy_corpus(path: Path, count: int = 80, seed: int = 0) -> Path:
    """A BEIR-style ``corpus.jsonl`` of ``count`` short passages built from a few topics."""
    import random

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            words = rng.sample(" ".join(TOPICS).split(), 6) + [f"doc{i}"]
            f.write(json.dumps({"_id": f"D{i}", "title": f"passage {i}", "text": " ".join(words)}) + "\n")
    return path


def build_toy_index(encoder: Encoder, directory: Path, count: int = 80) -> Path:
    """A small real index (the project's builder) of :func:`write_toy_corpus`."""
    from densehybrid.index.building.build import BuildOptions, build_index

    directory.mkdir(parents=True, exist_ok=True)
    corpus = write_toy_corpus(directory / "corpus.jsonl", count)
    return build_index(encoder, corpus, directory / "index", BuildOptions(progress=False, batch_size=16))

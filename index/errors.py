"""Every error the index layer raises, in one hierarchy (the CLI and the service map them to messages)."""

from __future__ import annotations


class IndexAccessError(RuntimeError):
    """Base of every error reading, writing, matching or reaching an index."""


class IndexLoadError(IndexAccessError):
    """An index directory is missing, incomplete, corrupted or of an unknown format."""


class IndexMismatchError(IndexAccessError):
    """An encoder does not produce the vectors an index was built with."""


class IndexWriteError(IndexAccessError):
    """An index could not be written or published."""


class MilvusUnavailableError(IndexAccessError):
    """Milvus cannot be reached or answered with an error; the message names the URI and the cause."""


class SearchError(ValueError):
    """A search request is out of range (k, candidates, first stage, λ) or asks a store for what it cannot do."""

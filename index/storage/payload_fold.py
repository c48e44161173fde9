"""Payload columns of a fold: the kept rows of the stored columns, then the written rows, column by column.

What ``Payload.from_rows`` would build from every row's values, without turning a million rows into
dicts: kept rows are taken from the arrays, keyword codes are moved onto the merged vocabulary, and
the vocabulary keeps only the words some row still holds (as a fresh build's would).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from densehybrid.index.storage.payload import Column, Payload


def _merged_vocab(a: Column, b: Column, codes_a: np.ndarray, codes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted vocabulary of the words in use, those codes a then b, moved onto it)."""
    words = np.concatenate([a.vocab[codes_a], b.vocab[codes_b]]).astype(str)
    vocab, codes = np.unique(words, return_inverse=True)
    if not len(vocab):
        vocab = np.array([], dtype="<U1")
    return vocab, codes.astype(np.int32).reshape(-1)


def _keyword(a: Column, keep: np.ndarray, b: Column) -> Column:
    present = np.concatenate([a.present[keep], b.present])
    data = np.zeros(len(present), np.int32)
    vocab, codes = _merged_vocab(a, b, a.data[keep][a.present[keep]], b.data[b.present])
    data[present] = codes
    return Column("keyword", present, data, vocab)


def _keyword_list(a: Column, keep: np.ndarray, b: Column) -> Column:
    kept_rows = np.zeros(len(a.present), bool)
    kept_rows[keep] = True
    kept_elements = kept_rows[a.element_rows()]
    vocab, codes = _merged_vocab(a, b, a.data[kept_elements], b.data)
    lengths = np.concatenate([np.diff(a.offsets)[keep], np.diff(b.offsets)])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    present = np.concatenate([a.present[keep], b.present])
    return Column("keyword_list", present, codes, vocab, offsets)


def folded_payload(schema: Mapping[str, str], base: Payload, keep: np.ndarray, added: Payload) -> Payload:
    """Columns of ``schema``: ``base``'s rows ``keep`` (ascending), then every row of ``added``."""
    columns = {}
    for name, kind in schema.items():
        a, b = base.columns[name], added.columns[name]
        if kind == "keyword":
            columns[name] = _keyword(a, keep, b)
        elif kind == "keyword_list":
            columns[name] = _keyword_list(a, keep, b)
        else:
            columns[name] = Column(kind, np.concatenate([a.present[keep], b.present]),
                                   np.concatenate([a.data[keep], b.data]).astype(a.data.dtype))
    return Payload(len(keep) + added.count, columns)

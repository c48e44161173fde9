"""The one offline encoding loop: texts -> encoded batches (index build, its Ray actors, ``encode``, search).

Texts are tokenized once, then encoded ``batch_size`` at a time, in input order or
sorted by token length (ties by position) so that a batch wastes little padding.
Each batch comes back with the input positions of its rows; :func:`encode_all`
puts them back in input order. The online service batches differently (its
batcher packs requests by a token budget); this is for lists known up front.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoded, Encoder
from densehybrid.encoder.choices import Role


@dataclass(frozen=True)
class EncodedBatch:
    """``encoded`` row i is input text ``rows[i]`` (int64 positions)."""

    rows: np.ndarray
    encoded: Encoded


def plan_batches(lengths: Sequence[int], batch_size: int, *, by_length: bool = False) -> list[list[int]]:
    """Input positions of each batch (all but the last hold ``batch_size``): in order, or by length."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i)) if by_length else list(range(len(lengths)))
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


def encode_in_batches(encoder: Encoder, texts: Sequence[str], role: Role, batch_size: int | None = None, *,
                      by_length: bool = False, plan: Sequence[Sequence[int]] | None = None,
                      progress: Callable[[int], object] | None = None) -> Iterator[EncodedBatch]:
    """Yield one :class:`EncodedBatch` per forward batch; ``progress(rows)`` after each.

    The batches are :func:`plan_batches`' unless ``plan`` gives them (positions into ``texts``).
    """
    tokenized = encoder.tokenize(texts, role)
    if plan is None:
        plan = plan_batches([t.length for t in tokenized], batch_size or len(texts) or 1, by_length=by_length)
    for rows in plan:
        encoded = encoder.encode_tokenized([tokenized[i] for i in rows], role)
        if progress is not None:
            progress(len(rows))
        yield EncodedBatch(np.asarray(rows, dtype=np.int64), encoded)


def encode_all(encoder: Encoder, texts: Sequence[str], role: Role, batch_size: int, *, by_length: bool = False,
               progress: Callable[[int], object] | None = None) -> Encoded:
    """Every text encoded, in input order (``len(texts)`` rows, zero for no texts)."""
    batches = list(encode_in_batches(encoder, texts, role, batch_size, by_length=by_length, progress=progress))
    if not batches:
        return encoder.encode_tokenized([], role)
    encoded = Encoded.concat([b.encoded for b in batches])
    return encoded[np.argsort(np.concatenate([b.rows for b in batches]), kind="stable")]

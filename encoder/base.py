"""What every encoder promises the index and the service.

An encoder turns texts into rows of one vector layout:

    values (N, dim) float32 = [gated part (gated_dim) ; open part (dim - gated_dim)]
    gates  (N, gated_dim) uint8, or None when gated_dim == 0

The gated part is a DLR whose dims only count when query and passage
gates agree; the open part is scored by a plain inner product. For ``dhr`` and
``fusion`` the open part is the dense vector, which the *searcher* scales by λ
on the query side; encoders always return it unscaled, so passage vectors in an
index and query vectors from ``/encode`` are both raw.

Tokenization is split from the forward so the service can tokenize on request
threads and batch the forwards on one worker: ``tokenize`` gives one
:class:`TokenizedText` per text, ``encode_tokenized`` pads and runs them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
import numpy as np

from densehybrid.encoder.choices import (  # noqa: F401 - re-exported: older imports name this module
    GATED_KINDS, KINDS, ROLES, SCALED_KINDS, Direction, Kind, Lexical, Pooling, Role,
)


@dataclass(frozen=True)
class EncoderSpec:
    """Everything an index must record to be served by the same encoder again."""

    kind: Kind
    dim: int
    gated_dim: int = 0
    lam: float = 1.0
    skip_mlm: bool = False
    # how the V-dim lexical vector is made: "delade" (the term-weighted MLM vector),
    # "skip_mlm" or "splade"; None for ``cls``
    lexical: Lexical | None = None
    agg_dim: int | None = None
    dlr_dim: int | None = None
    pooling: Pooling | None = None
    normalize: bool = False
    max_query_length: int = 32
    max_passage_length: int = 128
    vocab_size: int | None = None
    model_id: str = ""
    dense_model_id: str | None = None
    weights_hash: str = ""
    # sha256 of each tokenizer/config file by relative name (model_dir.identity_files); {} where unknown
    identity_files: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EncoderSpec":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown encoder spec fields: {sorted(unknown)}")
        return cls(**data)

    def max_length(self, role: Role) -> int:
        return self.max_query_length if role == "query" else self.max_passage_length


@dataclass(frozen=True)
class Encoded:
    """values (N, dim) float32 and gates (N, gated_dim) uint8 or None."""

    values: np.ndarray
    gates: np.ndarray | None = None

    def __len__(self) -> int:
        return self.values.shape[0]

    def __getitem__(self, rows) -> "Encoded":
        return Encoded(self.values[rows], None if self.gates is None else self.gates[rows])

    @staticmethod
    def concat(parts: Sequence["Encoded"]) -> "Encoded":
        values = np.concatenate([p.values for p in parts], axis=0)
        gates = None if parts[0].gates is None else np.concatenate([p.gates for p in parts], axis=0)
        return Encoded(values, gates)


@dataclass(frozen=True)
class SparseVector:
    """The non-zero entries of one V-dim vector: token ids ascending (int64) and their weights (float32)."""

    indices: np.ndarray
    values: np.ndarray

    @staticmethod
    def from_dense(row) -> "SparseVector":
        row = np.asarray(row, dtype=np.float32)
        indices = np.flatnonzero(row)
        return SparseVector(indices.astype(np.int64), row[indices])


@dataclass(frozen=True)
class TokenizedText:
    """One text's token ids per sub-model (``fusion`` has two), unpadded and truncated.

    ``full_length`` is the token count before truncation (the longest sub-model's; None: ``length``)."""

    ids: dict[str, list[int]]
    truncated: bool = False
    full_length: int | None = None

    @property
    def length(self) -> int:
        return max(len(v) for v in self.ids.values())

    @property
    def untruncated_length(self) -> int:
        return self.length if self.full_length is None else self.full_length


@dataclass(frozen=True)
class Token:
    """One token of a text as the tokenizer made it: ``text`` is the slice ``[start, stop)`` of the text
    (character offsets), or the token itself for a special token (``start``, ``stop`` None)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Encoder(abc.ABC):
    """Texts -> :class:`Encoded` for one role, with the layout of :attr:`spec`."""

    spec: EncoderSpec

    @abc.abstractmethod
    def tokenize(self, texts: Sequence[str], role: Role, *, direction: Direction = "right",
                 prompt: str = "") -> list[TokenizedText]:
        """Token ids of ``prompt + text``, truncated to the role's max length. Safe to call from any thread.

        ``direction`` "right" keeps the first tokens, "left" the last ones; special tokens ([CLS], [SEP])
        stay in place and the prompt's tokens are never cut (unless the prompt alone is over the limit)."""

    @abc.abstractmethod
    def encode_tokenized(self, items: Sequence[TokenizedText], role: Role) -> Encoded:
        """Pad and encode; memory is bounded whatever ``len(items)`` is."""

    def encode(self, texts: Sequence[str], role: Role, *, prompt: str = "") -> Encoded:
        return self.encode_tokenized(self.tokenize(texts, role, prompt=prompt), role)

    @abc.abstractmethod
    def tokens(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens with their character offsets, untruncated (the query side's tokenizer)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of token ids (the query side's tokenizer)."""

    @property
    def has_lexical(self) -> bool:
        """Whether the model makes a V-dim lexical vector (every kind but ``cls``)."""
        return self.spec.lexical is not None

    def lexical_tokenized(self, items: Sequence[TokenizedText], role: Role) -> list[SparseVector]:
        """Each text's V-dim lexical vector (before DLR or aggregation, docs/concepts.md) as its non-zeros."""
        raise NotImplementedError(f"{self.spec.kind!r} models have no lexical vector")

    @abc.abstractmethod
    def term(self, token_id: int) -> str:
        """The vocabulary entry behind a token id (for ``explain``)."""

    def replay_short_batches(self, buckets=None) -> bool:
        """Run short batches from CUDA graphs over padded buckets (``encoder.graphs``); -> whether it can."""
        return False

    def prepare_replay(self, role: Role) -> None:
        """Capture the replayed buckets of ``role`` ahead of the first request (a no-op where none replay)."""

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def backend(self) -> str:
        """The runtime of the forward: "torch" or "onnx" (what ``load_encoder``'s ``backend`` chose)."""
        return "torch"

    @property
    def precision(self) -> str:
        """What the forward computes in: "fp32" or "int8" (``load_encoder``'s ``precision``)."""
        return "fp32"

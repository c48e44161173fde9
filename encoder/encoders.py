"""One encoder class per kind (docs/concepts.md), sharing the tokenize/pad/chunk/forward loop.

Layout of every output row (see :mod:`encoder.base`): gated part first (a DLR),
then the open part; dense parts are unscaled (λ is the searcher's, query side).

- ``aggretriever``: ``[agg(lexical) (agg_dim) ; pooler(H_0)]``, no gates;
- ``dhr``: ``[DLR value ; pooler(H_0)]``, gates = DLR index;
- ``dlr``: ``DLR value``, gates = DLR index;
- ``cls``: pooled ([CLS] or mean) hidden state, optionally L2-normalised;
- ``fusion``: a ``dlr`` encoder's row then a ``cls`` encoder's row (two models).

The lexical V-dim vector is ``delade``, ``skip_mlm`` (no MLM head
loaded, no vocabulary logits) or ``splade``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np
import torch

from densehybrid.encoder import representations as R
from densehybrid.encoder.backbone import Backbone
from densehybrid.encoder.base import Direction, Encoded, Encoder, EncoderSpec, Role, SparseVector, Token, TokenizedText
from densehybrid.encoder.device import autocast
from densehybrid.encoder.graphs import Buckets, ReplayedForward
from densehybrid.encoder.heads import LinearHead
from densehybrid.encoder.tokenization import length_chunks, pad

MODEL_KEY = "model"
# padded tokens per forward. The MLM path holds the (tokens x V) logits (CPU float32: 512 x 30522 x 4 B
# = 62.5 MB; CUDA fp16: 8192 x 30522 x 2 B = 500 MB, so a 64 x 128 batch of passages is one forward).
MLM_TOKEN_BUDGET = {"cpu": 512, "cuda": 8192}
DENSE_TOKEN_BUDGET = {"cpu": 8192, "cuda": 16384}
# rows per forward for kinds with a lexical part: each row holds a V-dim vector
# (30522 x 4 B = 122 KB) whatever its length, so short texts are capped by rows
LEXICAL_MAX_ROWS = 256


class TransformerEncoder(Encoder):
    """Tokenize with the backbone's tokenizer; encode in length-sorted chunks under a token budget."""

    max_rows: int | None = None

    def __init__(self, spec: EncoderSpec, backbone: Backbone, device: torch.device, token_budget: int | None = None):
        self.spec = spec
        self.backbone = backbone.to(device)
        self._device = device
        budgets = MLM_TOKEN_BUDGET if backbone.with_mlm else DENSE_TOKEN_BUDGET
        self.token_budget = token_budget or budgets.get(device.type, budgets["cpu"])
        self._replayed: dict[Role, ReplayedForward] = {}

    def replay_short_batches(self, buckets: Buckets | None = None) -> bool:
        """Run batches that fit ``buckets`` in padded buckets: CUDA graphs on a GPU, eagerly on a CPU.

        Only a torch backbone can be captured; -> whether batches now replay."""
        if self.backbone.backend != "torch":
            return False
        buckets = buckets or Buckets()
        self._replayed = {
            role: ReplayedForward(lambda ids, mask, role=role: self._forward(ids, mask, role), self._device,
                                  self.backbone.tokenizer.pad_id, buckets.capped(self.spec.max_length(role)))
            for role in ("query", "passage")}
        return True

    @property
    def graph_count(self) -> int:
        """CUDA graphs captured so far, over both roles."""
        return sum(replayed.graph_count for replayed in self._replayed.values())

    def prepare_replay(self, role: Role) -> None:
        """Capture every bucket of ``role`` now rather than on first use."""
        if role in self._replayed:
            self._replayed[role].capture_all()

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def backend(self) -> str:
        return self.backbone.backend

    @property
    def precision(self) -> str:
        return self.backbone.precision

    def tokenize(self, texts: Sequence[str], role: Role, *, direction: Direction = "right",
                 prompt: str = "") -> list[TokenizedText]:
        return [TokenizedText({MODEL_KEY: ids}, truncated=len(ids) < full, full_length=full)
                for ids, full in self.backbone.tokenizer(texts, role, direction, prompt)]

    def tokens(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        return self.backbone.tokenizer.tokens(texts, add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backbone.tokenizer.decode(ids, skip_special_tokens)

    def term(self, token_id: int) -> str:
        return self.backbone.tokenizer.term(token_id)

    def encode_tokenized(self, items: Sequence[TokenizedText], role: Role) -> Encoded:
        if not items:
            return self._empty()
        rows = [item.ids[MODEL_KEY] for item in items]
        values = np.empty((len(rows), self.spec.dim), dtype=np.float32)
        gates = np.empty((len(rows), self.spec.gated_dim), dtype=np.uint8) if self.spec.gated_dim else None
        replayed = self._replayed.get(role)
        for chunk in length_chunks([len(r) for r in rows], self.token_budget, self.max_rows):
            chunk_rows = [rows[i] for i in chunk]
            if replayed is not None and replayed.fits(len(chunk_rows), max(len(r) for r in chunk_rows)):
                values[chunk], chunk_gates = replayed(chunk_rows)
            else:
                input_ids, mask = pad(chunk_rows, self.backbone.tokenizer.pad_id, self._device)
                with torch.inference_mode(), autocast(self._device):
                    chunk_values, chunk_gates = self._forward(input_ids, mask, role)
                values[chunk] = chunk_values.float().cpu().numpy()
                chunk_gates = None if chunk_gates is None else chunk_gates.cpu().numpy()
            if gates is not None:
                gates[chunk] = chunk_gates
        return Encoded(values, gates)

    def _empty(self) -> Encoded:
        gated = self.spec.gated_dim
        return Encoded(np.zeros((0, self.spec.dim), np.float32), np.zeros((0, gated), np.uint8) if gated else None)

    @abc.abstractmethod
    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, role: Role) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) ids and mask -> values (B, dim) and gates (B, gated_dim) uint8 or None."""


class CLSEncoder(TransformerEncoder):
    """Single-vector bi-encoders (Condenser, coCondenser, SimLM, MASTER, sentence-transformers)."""

    def _forward(self, input_ids, mask, role):
        hidden, _ = self.backbone.forward(input_ids, mask, role)
        hidden = hidden.float()
        pooled = R.mean_pool(hidden, mask) if self.spec.pooling == "mean" else R.cls_pool(hidden)
        return (R.l2_normalize(pooled) if self.spec.normalize else pooled), None


class LexicalEncoder(TransformerEncoder):
    """Shared by the kinds built on a V-dim lexical vector."""

    max_rows = LEXICAL_MAX_ROWS

    def __init__(self, spec: EncoderSpec, backbone: Backbone, device: torch.device, *,
                 term_weight: LinearHead | None = None, pooler: LinearHead | None = None,
                 token_budget: int | None = None):
        if spec.lexical in ("delade", "skip_mlm") and term_weight is None:
            raise ValueError(f"lexical {spec.lexical!r} needs a term-weight head")
        if backbone.with_mlm == (spec.lexical == "skip_mlm"):
            raise ValueError(f"lexical {spec.lexical!r} with a backbone with_mlm={backbone.with_mlm}")
        super().__init__(spec, backbone, device, token_budget)
        self.term_weight = term_weight.to(device) if term_weight is not None else None
        self.pooler = pooler.to(device) if pooler is not None else None

    def _lexical(self, input_ids, mask, role) -> tuple[torch.Tensor, torch.Tensor]:
        """-> lexical vector (B, V) float32 and last hidden states (B, L, d)."""
        hidden, logits = self.backbone.forward(input_ids, mask, role)
        if self.spec.lexical == "splade":
            return R.splade_lexical(logits, mask), hidden
        weights = self.term_weight(hidden, role).squeeze(-1).float()
        if self.spec.lexical == "skip_mlm":
            return R.skip_mlm_lexical(input_ids, weights, mask, self.backbone.vocab_size), hidden
        return R.term_weighted_mlm(logits, weights, mask), hidden

    def lexical_tokenized(self, items: Sequence[TokenizedText], role: Role) -> list[SparseVector]:
        rows = [item.ids[MODEL_KEY] for item in items]
        out: list[SparseVector | None] = [None] * len(rows)
        for chunk in length_chunks([len(r) for r in rows], self.token_budget, self.max_rows):
            input_ids, mask = pad([rows[i] for i in chunk], self.backbone.tokenizer.pad_id, self._device)
            with torch.inference_mode(), autocast(self._device):
                lexical, _ = self._lexical(input_ids, mask, role)
            for i, row in zip(chunk, lexical.float().cpu().numpy()):
                out[i] = SparseVector.from_dense(row)
        return out

    def _projected_cls(self, hidden, role) -> torch.Tensor:
        return self.pooler(R.cls_pool(hidden), role).float()


class AggretrieverEncoder(LexicalEncoder):
    def _forward(self, input_ids, mask, role):
        lexical, hidden = self._lexical(input_ids, mask, role)
        agg = R.aggregate_full(lexical, self.spec.agg_dim)
        return torch.cat([agg, self._projected_cls(hidden, role)], dim=1), None


class DLREncoder(LexicalEncoder):
    def _forward(self, input_ids, mask, role):
        lexical, _ = self._lexical(input_ids, mask, role)
        return R.densify(lexical, self.spec.dlr_dim)


class DHREncoder(LexicalEncoder):
    def _forward(self, input_ids, mask, role):
        lexical, hidden = self._lexical(input_ids, mask, role)
        values, gates = R.densify(lexical, self.spec.dlr_dim)
        return torch.cat([values, self._projected_cls(hidden, role)], dim=1), gates


LEXICAL_KEY, DENSE_KEY = "lexical", "dense"


class FusionEncoder(Encoder):
    """A SPLADE-style model's DLR ⊕ any dense model's vector: two tokenizers, two forwards."""

    def __init__(self, spec: EncoderSpec, lexical: DLREncoder, dense: CLSEncoder):
        self.spec, self.lexical, self.dense = spec, lexical, dense

    def replay_short_batches(self, buckets: Buckets | None = None) -> bool:
        replayed = [half.replay_short_batches(buckets) for half in (self.lexical, self.dense)]
        return all(replayed)

    def prepare_replay(self, role: Role) -> None:
        self.lexical.prepare_replay(role)
        self.dense.prepare_replay(role)

    @property
    def device(self) -> str:
        return self.lexical.device

    @property
    def backend(self) -> str:
        """One runtime, or "onnx+torch" where ``auto`` could run only the lexical half on ONNX Runtime."""
        halves = (self.lexical.backend, self.dense.backend)
        return halves[0] if halves[0] == halves[1] else "+".join(halves)

    @property
    def precision(self) -> str:
        halves = (self.lexical.precision, self.dense.precision)
        return halves[0] if halves[0] == halves[1] else "+".join(halves)

    def tokenize(self, texts: Sequence[str], role: Role, *, direction: Direction = "right",
                 prompt: str = "") -> list[TokenizedText]:
        halves = zip(self.lexical.tokenize(texts, role, direction=direction, prompt=prompt),
                     self.dense.tokenize(texts, role, direction=direction, prompt=prompt))
        return [TokenizedText({LEXICAL_KEY: lex.ids[MODEL_KEY], DENSE_KEY: den.ids[MODEL_KEY]},
                              truncated=lex.truncated or den.truncated,
                              full_length=max(lex.untruncated_length, den.untruncated_length)) for lex, den in halves]

    def tokens(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """The lexical model's tokens (the vocabulary of the gated part and of ``explain``)."""
        return self.lexical.tokens(texts, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.lexical.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_tokenized(self, items: Sequence[TokenizedText], role: Role) -> Encoded:
        lexical = self.lexical.encode_tokenized([TokenizedText({MODEL_KEY: i.ids[LEXICAL_KEY]}) for i in items], role)
        dense = self.dense.encode_tokenized([TokenizedText({MODEL_KEY: i.ids[DENSE_KEY]}) for i in items], role)
        return Encoded(np.concatenate([lexical.values, dense.values], axis=1), lexical.gates)

    def lexical_tokenized(self, items: Sequence[TokenizedText], role: Role) -> list[SparseVector]:
        return self.lexical.lexical_tokenized([TokenizedText({MODEL_KEY: i.ids[LEXICAL_KEY]}) for i in items], role)

    def term(self, token_id: int) -> str:
        return self.lexical.term(token_id)


ENCODER_CLASSES: dict[str, type[LexicalEncoder]] = {
    "aggretriever": AggretrieverEncoder,
    "dhr": DHREncoder,
    "dlr": DLREncoder,
}

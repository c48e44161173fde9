"""The load benchmarks' encoder: deterministic, no weights, so a load test measures the service.

``densehybrid loadtest`` and ``python -m densehybrid.bench.load.writes`` serve a small index with it.
Words are hashed to vocabulary ids; each word has a fixed weight and a fixed random dense direction.
The lexical vector goes through the real representation math (densify, aggregate), so gates and GIP
behave like the real thing. It ranks by shared words, not meaning: use it for throughput and latency,
never for quality numbers.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from densehybrid.encoder import representations as R
from densehybrid.encoder.base import (GATED_KINDS, Direction, Encoded, Encoder, EncoderSpec, Kind, Role, SparseVector,
                                       Token, TokenizedText)

CLS_ID, SEP_ID, PAD_ID = 101, 102, 0


class HashEncoder(Encoder):
    model_prefix = "hash"  # model_id and weights_hash start with it

    def __init__(
        self,
        kind: Kind = "dhr",
        *,
        vocab_size: int = 30522,
        dlr_dim: int = 768,
        dense_dim: int = 128,
        agg_dim: int = 640,
        lam: float = 1.0,
        max_query_length: int = 32,
        max_passage_length: int = 128,
    ):
        self.vocab_size = vocab_size
        self.dense_dim = dense_dim
        self._vocab: dict[int, str] = {}
        gated = dlr_dim if kind in GATED_KINDS else 0
        dim = {"aggretriever": agg_dim + dense_dim, "dlr": dlr_dim, "cls": dense_dim}.get(kind, dlr_dim + dense_dim)
        self.spec = EncoderSpec(
            kind=kind,
            dim=dim,
            gated_dim=gated,
            lam=lam,
            lexical=None if kind == "cls" else "splade",
            agg_dim=agg_dim if kind == "aggretriever" else None,
            dlr_dim=dlr_dim if gated else None,
            pooling="mean" if kind == "cls" else None,
            max_query_length=max_query_length,
            max_passage_length=max_passage_length,
            vocab_size=vocab_size,
            model_id=f"{self.model_prefix}-{kind}",
            weights_hash=f"{self.model_prefix}-{kind}-{vocab_size}-{dlr_dim}-{dense_dim}-{agg_dim}",
        )

    # -- tokenization -------------------------------------------------------
    def _word_id(self, word: str) -> int:
        token_id = 1000 + zlib.crc32(word.encode("utf-8")) % (self.vocab_size - 1000)
        self._vocab.setdefault(token_id, word)
        return token_id

    def tokenize(self, texts: Sequence[str], role: Role, *, direction: Direction = "right",
                 prompt: str = "") -> list[TokenizedText]:
        limit = self.spec.max_length(role) - 2
        prompt_words = min(len(prompt.split()), limit)  # never cut (unless the prompt is over the limit)
        out = []
        for text in texts:
            joined = (prompt + text).lower().split()
            kept, words = joined[:prompt_words], joined[prompt_words:]
            room = limit - len(kept)
            words_in = words[:room] if direction == "right" else words[len(words) - room:] if room > 0 else []
            ids = [CLS_ID, *(self._word_id(w) for w in [*kept, *words_in]), SEP_ID]
            out.append(TokenizedText({"hash": ids}, truncated=len(words) > room,
                                     full_length=len(kept) + len(words) + 2))
        return out

    def tokens(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        out = []
        for text in texts:
            words = [Token(self._word_id(m.group().lower()), m.group(), False, m.start(), m.end())
                     for m in re.finditer(r"\S+", text)]
            specials = add_special_tokens
            out.append([Token(CLS_ID, "[CLS]", True, None, None)] * specials + words
                       + [Token(SEP_ID, "[SEP]", True, None, None)] * specials)
        return out

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        special = {CLS_ID: "[CLS]", SEP_ID: "[SEP]", PAD_ID: "[PAD]"}
        outside = [i for i in ids if not 0 <= i < self.vocab_size]
        if outside:
            raise ValueError(f"token id {outside[0]} is outside the vocabulary of {self.vocab_size} ids")
        return " ".join(special[i] if i in special else self.term(i) for i in ids
                        if not (skip_special_tokens and i in special))

    def term(self, token_id: int) -> str:
        return self._vocab.get(token_id, f"[unused{token_id}]")

    # -- forward ------------------------------------------------------------
    def _dense(self, ids: list[int]) -> np.ndarray:
        vec = np.zeros(self.dense_dim, dtype=np.float64)
        for token_id in ids:
            vec += np.random.default_rng(token_id).standard_normal(self.dense_dim)
        return (vec / max(np.linalg.norm(vec), 1e-12)).astype(np.float32)

    def _lexical(self, ids: list[int]) -> torch.Tensor:
        v = torch.zeros(self.vocab_size)
        for token_id in ids[1:]:
            weight = 0.5 + (token_id % 97) / 97.0
            v[token_id] = max(float(v[token_id]), weight)
        return v

    def lexical_tokenized(self, items: Sequence[TokenizedText], role: Role) -> list[SparseVector]:
        if not self.has_lexical:
            return super().lexical_tokenized(items, role)
        return [SparseVector.from_dense(self._lexical(item.ids["hash"]).numpy()) for item in items]

    def encode_tokenized(self, items: Sequence[TokenizedText], role: Role) -> Encoded:
        if not items:
            dim, gated = self.spec.dim, self.spec.gated_dim
            return Encoded(np.zeros((0, dim), np.float32), np.zeros((0, gated), np.uint8) if gated else None)
        ids = [item.ids["hash"] for item in items]
        dense = torch.from_numpy(np.stack([self._dense(i) for i in ids]))
        if self.spec.kind == "cls":
            return Encoded(dense.numpy())
        lexical = torch.stack([self._lexical(i) for i in ids])
        if self.spec.kind == "aggretriever":
            agg = R.aggregate_full(lexical, self.spec.agg_dim)
            return Encoded(torch.cat([agg, dense], 1).numpy().astype(np.float32))
        values, gates = R.densify(lexical, self.spec.dlr_dim)
        if self.spec.kind != "dlr":
            values = torch.cat([values, dense], 1)
        return Encoded(values.numpy().astype(np.float32), gates.numpy())

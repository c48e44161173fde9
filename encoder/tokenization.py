"""Thread-safe tokenization and the padding/chunking that turn token ids into forwards.

HF fast tokenizers mutate their Rust object whenever truncation or padding
settings change, and a concurrent call then fails with "Already borrowed". Here
each role gets a private copy of the Rust tokenizer whose truncation is set once,
at construction, and never touched again; encoding only borrows it immutably, so
any number of request threads may tokenize at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from densehybrid.encoder.base import Role


class RoleTokenizer:
    """Text -> unpadded ids truncated to the role's max length ([CLS]/[SEP] included)."""

    def __init__(self, hf_tokenizer, max_lengths: dict[Role, int]):
        serialized = hf_tokenizer.backend_tokenizer.to_str()
        self._by_role: dict[Role, Tokenizer] = {}
        for role, max_length in max_lengths.items():
            tokenizer = Tokenizer.from_str(serialized)
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=max_length)
            self._by_role[role] = tokenizer
        self.hf_tokenizer = hf_tokenizer
        self.pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
        self.max_lengths = dict(max_lengths)

    def __call__(self, texts: Sequence[str], role: Role) -> list[tuple[list[int], bool]]:
        """Per text: (ids, truncated)."""
        encodings = self._by_role[role].encode_batch(list(texts))
        return [(e.ids, bool(e.overflowing)) for e in encodings]

    def term(self, token_id: int) -> str:
        token = self._by_role["query"].id_to_token(int(token_id))
        if token is None:
            raise KeyError(f"token id {token_id} is outside the vocabulary")
        return token


def pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists -> input_ids (B, L) long and attention mask (B, L) long."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids.to(device), mask.to(device)


def length_chunks(lengths: Sequence[int], token_budget: int, max_rows: int | None = None) -> list[list[int]]:
    """Group row indices, longest first, so each group's rows x longest length <= ``token_budget``
    and rows <= ``max_rows``.

    A single row longer than the budget forms a group of its own. Sorting by
    length keeps padding (wasted compute) small.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks: list[list[int]] = []
    for i in order:
        # the first row of a chunk is its longest, so it fixes the padded length
        fits = chunks and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= token_budget
        if fits and (max_rows is None or len(chunks[-1]) < max_rows):
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks

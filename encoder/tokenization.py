"""Thread-safe tokenization and the padding/chunking that turn token ids into forwards.

HF fast tokenizers mutate their Rust object whenever truncation or padding
settings change, and a concurrent call then fails with "Already borrowed". Here
one private copy of the Rust tokenizer has truncation and padding off, set once
at construction and never touched again; encoding only borrows it immutably, so
any number of request threads may tokenize at once. The cut to a role's max
length is made in :func:`cut`, from either end, keeping the special tokens and a
prompt's tokens (the tokenizer's own truncation would cut a prompt from the left).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Encoding, Tokenizer

from densehybrid.encoder.base import Direction, Role, Token


class RoleTokenizer:
    """Text -> unpadded ids truncated to the role's max length ([CLS]/[SEP] included), from either end."""

    def __init__(self, hf_tokenizer, max_lengths: dict[Role, int]):
        # one untruncated copy: the cut is made here, from either end, around special tokens and a prompt
        self._tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.hf_tokenizer = hf_tokenizer
        self.pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
        self.max_lengths = dict(max_lengths)

    def __call__(self, texts: Sequence[str], role: Role, direction: Direction = "right",
                 prompt: str = "") -> list[tuple[list[int], int]]:
        """Per text: (ids of ``prompt + text`` cut to the role's limit, token count before the cut)."""
        encodings = self._tokenizer.encode_batch([prompt + text for text in texts] if prompt else list(texts))
        limit, out = self.max_lengths[role], []
        for e in encodings:
            ids = e.ids  # a new list on every access
            out.append((ids if len(ids) <= limit else cut(e, limit, direction, len(prompt)), len(ids)))
        return out

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [[_token(text, token_id, token, special, offsets)
                 for token_id, token, special, offsets in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets)]
                for text, e in zip(texts, encodings)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        outside = [i for i in ids if not 0 <= i < size]
        if outside:
            raise ValueError(f"token id {outside[0]} is outside the vocabulary of {size} ids")
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def term(self, token_id: int) -> str:
        token = self._tokenizer.id_to_token(int(token_id))
        if token is None:
            raise KeyError(f"token id {token_id} is outside the vocabulary")
        return token


def _token(text: str, token_id: int, token: str, special: int, offsets: tuple[int, int]) -> Token:
    if special:
        return Token(token_id, token, True, None, None)
    start, stop = offsets
    return Token(token_id, text[start:stop], False, start, stop)


def cut(encoding: Encoding, limit: int, direction: Direction, kept_chars: int = 0) -> list[int]:
    """``encoding``'s ids, at most ``limit`` of them: the special tokens the template added and the tokens
    of the first ``kept_chars`` characters (a prompt) stay; of the others, the first (``direction``
    "right") or the last ("left") that fit. Without a prompt, the tokenizer's own truncation to
    ``limit`` from that side gives the same ids.
    """
    ids = encoding.ids
    if len(ids) <= limit:
        return ids
    added = [seq is None for seq in encoding.sequence_ids]  # [CLS]/[SEP] of the template, not ones typed in text
    fixed = [a or start < kept_chars for a, (start, _) in zip(added, encoding.offsets)]
    if sum(fixed) > limit:  # the prompt alone is over the limit: it is cut like the text
        fixed = added
    free = [i for i, f in enumerate(fixed) if not f]
    budget = limit - sum(fixed)
    chosen = set(free[:budget] if direction == "right" else free[len(free) - budget:] if budget > 0 else [])
    return [token_id for i, token_id in enumerate(ids) if fixed[i] or i in chosen]


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

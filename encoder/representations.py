"""The representation math (written out in docs/concepts.md): tensors in, tensors out.

Shapes: ``B`` batch, ``L`` sequence length, ``V`` vocabulary size, ``d`` hidden size.
Nothing here knows about files, devices or models; sizes are arguments.

"Real tokens" are positions ``1..L-1`` with ``mask == 1``: [SEP] counts,
[CLS] does not. Padded positions are excluded with ``-inf`` before every max,
so a text gives the same vector alone or padded inside a batch.
"""

from __future__ import annotations

import torch

NEG_INF, POS_INF = float("-inf"), float("inf")


def real_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, L) attention mask -> (B, L) bool, True at real tokens (no [CLS], no padding)."""
    real = mask.bool().clone()
    real[:, 0] = False
    return real


# Elements of the float32 temporaries of one step over the vocabulary. CPU: ~8 MB, so a step stays in
# cache (one step for a query (32 x 30522), a few for a chunk of passages; measured 2-5x faster than
# one call over 512 x 30522). CUDA: ~1 GB, so a whole batch is one kernel per op instead of one
# launch per few tokens (launches, not bandwidth, bound small steps on a GPU). Same values either way.
STEP_ELEMENTS = {"cpu": 2_000_000, "cuda": 1 << 28}


def step_elements(device: torch.device) -> int:
    return STEP_ELEMENTS.get(device.type, STEP_ELEMENTS["cpu"])


def term_weighted_mlm(logits: torch.Tensor, term_weights: torch.Tensor, mask: torch.Tensor, *,
                      step: int | None = None) -> torch.Tensor:
    """Aggretriever/DeLADE lexical vector.

    logits (B, L, V) MLM logits, term_weights (B, L) ``w_i``, mask (B, L).
    Returns (B, V): ``v[t] = max_i w_i * softmax(logits_i)[t]`` over real tokens.
    A text with no real token (impossible with a tokenizer that adds [SEP]) gives -inf.

    Computed without materialising the softmax: for ``w_i > 0``,
    ``w_i * p_i[t] = exp(log p_i[t] + log w_i)``, so the max over tokens is the exp of a max of
    shifted log-probabilities. Tokens with ``w_i <= 0`` only matter in a row where no real token has
    ``w > 0``: every product is then <= 0 and ``v[t] = -exp(min_i (log|w_i| + log p_i[t]))``. One
    min-max reduction gives both, so the vocabulary-sized values are read three times in all (the
    log-softmax, the shift in place, the reduction), which on a GPU bounds a passage batch's cost.

    ``step``: float32 elements per step over the vocabulary (default: :func:`step_elements` of the
    device): tokens are taken in blocks of (B, step / (B V), V), so no (B, L, V) float32 copy is made
    beyond one step's; fp16 logits (CUDA autocast) are upcast inside the log-softmax.
    """
    w = term_weights.float()
    step = step or step_elements(logits.device)
    real = real_token_mask(mask)
    positive = real & (w > 0)
    any_positive = positive.any(dim=1, keepdim=True)  # (B, 1)
    use = torch.where(any_positive, positive, real)
    # log|w_i| where token i counts; elsewhere -inf (lost in the max of rows with a positive weight) or
    # +inf (lost in the min of the rows without)
    excluded = torch.where(any_positive, NEG_INF, POS_INF)
    shift = torch.where(use, torch.log(w.abs()), excluded)  # (B, L)
    batch, length, vocab = logits.shape
    tokens_per_step = max(1, step // max(1, batch * vocab))
    high = torch.full((batch, vocab), NEG_INF, dtype=torch.float32, device=logits.device)
    low = torch.full((batch, vocab), POS_INF, dtype=torch.float32, device=logits.device)
    for i in range(0, length, tokens_per_step):
        block = torch.log_softmax(logits[:, i:i + tokens_per_step], dim=-1, dtype=torch.float32)
        block.add_(shift[:, i:i + tokens_per_step, None])
        block_low, block_high = _min_max_over_tokens(block)
        high = torch.maximum(high, block_high)
        low = torch.minimum(low, block_low)
    return torch.where(any_positive, torch.exp(high), -torch.exp(low))


def _min_max_over_tokens(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, t, V) -> min and max over t. One pass on CUDA (aminmax); two on the CPU, where aminmax over a
    middle dim measured ~15x slower than amax and amin together."""
    if block.is_cuda:
        return torch.aminmax(block, dim=1)
    return block.amin(1), block.amax(1)


def skip_mlm_lexical(input_ids: torch.Tensor, term_weights: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Aggretriever "w/o MLM" lexical vector, no vocabulary logits.

    input_ids (B, L) long, term_weights (B, L), mask (B, L) -> (B, V):
    ``v[t] = max(0, max over real tokens i with id_i = t of w_i)``, 0 for absent ids.
    """
    weights = term_weights.float().masked_fill(~real_token_mask(mask), 0.0)
    out = torch.zeros(input_ids.shape[0], vocab_size, dtype=weights.dtype, device=weights.device)
    # include_self=True keeps the zero floor: padded positions write 0, which changes nothing.
    return out.scatter_reduce(1, input_ids.long(), weights, reduce="amax", include_self=True)


def splade_lexical(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SPLADE max-pooled lexical vector: (B, L, V), (B, L) -> (B, V).

    ``max_i log(1 + relu(x_i))`` over every unmasked token ([CLS], [SEP] included),
    computed as ``log(1 + relu(max_i x_i))`` (the map is monotone, and the max
    first avoids the elementwise log over B x L x V).
    """
    # the max is exact in the logits' own dtype, so only the (B, V) result is upcast (no float32
    # copy of the (B, L, V) logits under fp16 autocast)
    masked = logits.masked_fill(~mask.bool().unsqueeze(-1), NEG_INF)
    return torch.log1p(torch.relu(masked.amax(dim=1).float()))


def removal_offset(vocab_size: int, width: int) -> int:
    """Entries to drop (>= 0) or zeros to append (< 0) so ``V`` reshapes to rows of ``width``."""
    r = vocab_size % width
    return r - width if r > 1000 else r


def _fold_rows(v: torch.Tensor, width: int, r: int) -> torch.Tensor:
    """(B, V) -> (B, rows, width) after dropping ``r`` leading entries or padding ``-r`` zeros."""
    if r >= 0:
        v = v[:, r:]
    else:
        v = torch.nn.functional.pad(v, (0, -r))
    return v.reshape(v.shape[0], -1, width)


def aggregate_full(v: torch.Tensor, d_agg: int = 640) -> torch.Tensor:
    """Aggretriever full aggregation: (B, V) -> (B, d_agg)."""
    n = 2 * d_agg
    m = _fold_rows(v, n, removal_offset(v.shape[1], n)).amax(dim=1)
    pos, neg = m[:, 0::2], m[:, 1::2]
    return torch.where(pos > neg, pos, -neg)


def aggregate_semi(v: torch.Tensor, d_agg: int = 640) -> torch.Tensor:
    """Semi-aggregation ablation: (B, V) -> (B, d_agg), no sign split."""
    return _fold_rows(v, d_agg, removal_offset(v.shape[1], d_agg)).amax(dim=1)


def dlr_offset(vocab_size: int, dim: int) -> int:
    """Leading vocabulary entries a DLR of ``dim`` dims drops: ``V mod dim``."""
    return vocab_size % dim


def densify(v: torch.Tensor, dim: int = 768) -> tuple[torch.Tensor, torch.Tensor]:
    """Densified lexical representation: (B, V) -> values (B, dim) float, index (B, dim) uint8.

    ``value[j] = max_k x[k, j]``, ``index[j] = argmax_k x[k, j]`` (the first row on ties)
    where ``x`` is ``v`` without its first ``V mod dim`` entries, reshaped (rows, dim).
    """
    rows = _fold_rows(v, dim, dlr_offset(v.shape[1], dim))
    if rows.shape[1] > 256:
        raise ValueError(f"DLR of {dim} dims over V={v.shape[1]} needs {rows.shape[1]} rows; uint8 gates hold 256")
    values, index = rows.max(dim=1)
    return values, index.to(torch.uint8)


def dlr_term_ids(index: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Vocabulary id behind each DLR dimension: index (..., dim) -> ids (..., dim) long.

    ``id = r + index[j] * dim + j`` with ``r = V mod dim``.
    """
    dim = index.shape[-1]
    j = torch.arange(dim, device=index.device)
    return dlr_offset(vocab_size, dim) + index.long() * dim + j


def gated_inner_product(q_values: torch.Tensor, q_gates: torch.Tensor, p_values: torch.Tensor, p_gates: torch.Tensor) -> torch.Tensor:
    """GIP of every query with every passage over the gated (lexical) dims.

    q_values (Q, D), q_gates (Q, D), p_values (N, D), p_gates (N, D) -> (Q, N) float32:
    ``sum_j q.value[j] * p.value[j] * [q.index[j] == p.index[j]]``.
    """
    match = q_gates.unsqueeze(1) == p_gates.unsqueeze(0)
    prod = q_values.float().unsqueeze(1) * p_values.float().unsqueeze(0)
    return torch.where(match, prod, torch.zeros((), dtype=prod.dtype, device=prod.device)).sum(-1)


def cls_pool(hidden: torch.Tensor) -> torch.Tensor:
    """(B, L, d) -> (B, d): the [CLS] position."""
    return hidden[:, 0]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, d), (B, L) -> (B, d): mean over unmasked positions ([CLS] and [SEP] included)."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Row-wise L2 normalisation, as sentence-transformers' Normalize."""
    return torch.nn.functional.normalize(x, p=2.0, dim=-1, eps=eps)

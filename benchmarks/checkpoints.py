"""Random-weight model directories in the published castorini format (DESIGN §3).

Speed does not depend on weight values, so a DistilBERT-base-shaped masked LM built
from its config measures the published checkpoints' cost without the hub. The
tokenizer is the bert-base-uncased wordpiece vocabulary of the offline SPLADE-tiny
model (the published DistilBERT checkpoints use the same uncased vocabulary).
"""

from __future__ import annotations

from pathlib import Path

import torch

from densehybrid.encoder import zoo
from densehybrid.encoder.heads import POOLER, TERM_WEIGHT, LinearHead, save_head

SHAPES = {
    # DistilBERT-base: 6 layers, hidden 768, 12 heads, FFN 3072, V = 30522
    "distilbert-base": {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072},
    "tiny": {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "initializer_range": 0.2},
}
POOLER_DIM = 128


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(zoo.fetch("splade-tiny"))


def random_masked_lm(shape: str, seed: int = 0):
    """A ``DistilBertForMaskedLM`` of a named shape with seeded random weights, in eval mode."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(seed)
    return DistilBertForMaskedLM(DistilBertConfig(vocab_size=30522, **SHAPES[shape])).eval()


def write_random_checkpoint(path: str | Path, shape: str = "distilbert-base", *, seed: int = 0) -> Path:
    """Masked-LM checkpoint + tokenizer + tied ``pooler.pt`` (d -> 128) + ``TermWeightTrans.pt`` (d -> 1).

    The term-weight bias is positive so every token carries weight, as in a trained
    model's content words: no benchmark path gets to skip tokens.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    model = random_masked_lm(shape, seed)
    hf_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar is noise in a report
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    hidden = model.config.dim
    torch.manual_seed(seed + 1)
    pooler, term_weight = LinearHead(hidden, POOLER_DIM), LinearHead(hidden, 1)
    with torch.no_grad():
        term_weight.linear_q.bias.fill_(1.0)
    save_head(pooler, path, POOLER)
    save_head(term_weight, path, TERM_WEIGHT)
    return path

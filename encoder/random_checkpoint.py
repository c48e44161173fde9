"""Random-weight checkpoints in the published castorini format, for tests and speed benchmarks.

``write_random_checkpoint`` builds a BERT or DistilBERT masked-LM model from a
config (no hub, no download), and writes it with ``pooler.pt`` and
``TermWeightTrans.pt`` exactly as castorini/dhr does: the tied heads' state dicts
hold both ``linear_q.*`` and ``linear_p.*``. Speed does not depend on weight
values, so a DistilBERT-base-shaped random model is a fair stand-in for the
published checkpoints (DESIGN §3).

Without ``tokenizer_from`` the tokenizer is a synthetic WordPiece vocabulary of
``vocab_size`` entries with BERT's special-token ids (0 [PAD], 100 [UNK], 101
[CLS], 102 [SEP], 103 [MASK]); any lower-case ASCII text tokenizes.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from densehybrid.encoder.heads import POOLER, TERM_WEIGHT, LinearHead, save_head
from densehybrid.encoder.model_dir import PASSAGE_DIR, QUERY_DIR, save_transformer

_WORDS = (
    "the of and to in is was for on that with as by it at from his an were are which this be has had or "
    "one first new after who they have her she two been other when there all also into during time more "
    "city school world would up its state film year may over out new under team states game where only "
    "dense retrieval search query passage document vector model lexical semantic index score rank term "
    "cat dog sat mat river bank money water fish music piano history war king queen computer science "
    "learning neural network language english french paris london capital country population weather rain "
    "sun moon planet star earth ocean mountain food bread coffee tea health doctor disease medicine what how"
).split()


def synthetic_vocab(vocab_size: int = 30522) -> list[str]:
    """BERT-like special ids, single characters, ``##`` continuations, some words, then filler."""
    specials = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    vocab = [specials.get(i, f"[unused{i}]") for i in range(104)]
    chars = string.ascii_lowercase + string.digits + string.punctuation
    for token in [*chars, *("##" + c for c in chars), *dict.fromkeys(_WORDS)]:
        vocab.append(token)
    vocab.extend(f"[unused{i}]" for i in range(len(vocab), vocab_size))
    if len(vocab) != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for the synthetic vocabulary ({len(vocab)})")
    return vocab


def _tokenizer(tokenizer_from: str | Path | None, vocab_size: int):
    from transformers import AutoTokenizer, BertTokenizerFast

    if tokenizer_from is not None:
        return AutoTokenizer.from_pretrained(tokenizer_from)
    vocab = {token: i for i, token in enumerate(synthetic_vocab(vocab_size))}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True)


def _mlm_model(arch: str, hidden: int, layers: int, heads: int, vocab_size: int, max_positions: int):
    from transformers import BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

    if arch == "bert":
        config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * hidden,
                            max_position_embeddings=max_positions)
        return BertForMaskedLM(config)
    if arch == "distilbert":
        config = DistilBertConfig(vocab_size=vocab_size, dim=hidden, n_layers=layers, n_heads=heads,
                                  hidden_dim=4 * hidden, max_position_embeddings=max_positions)
        return DistilBertForMaskedLM(config)
    raise ValueError(f"unknown arch {arch!r}; use bert or distilbert")


def write_random_checkpoint(path: str | Path, *, arch: str = "bert", hidden: int = 32, layers: int = 2,
                            heads: int = 2, pooler_dim: int = 16, vocab_size: int = 30522,
                            max_positions: int = 512, untied: bool = False, tied_heads: bool = True,
                            tokenizer_from: str | Path | None = None, seed: int = 0) -> Path:
    """Write a published-format masked-LM directory with random weights; returns ``path``."""
    path = Path(path)
    torch.manual_seed(seed)
    tokenizer = _tokenizer(tokenizer_from, vocab_size)
    for sub in ((QUERY_DIR, PASSAGE_DIR) if untied else ("",)):
        model = _mlm_model(arch, hidden, layers, heads, vocab_size, max_positions).eval()
        save_transformer(model, tokenizer, path / sub)
    for files, out in ((POOLER, pooler_dim), (TERM_WEIGHT, 1)):
        head = LinearHead(hidden, out, tied=tied_heads)
        with torch.no_grad():  # larger than nn.Linear's init so term weights spread over both signs
            for layer in {id(m): m for m in (head.linear_q, head.linear_p)}.values():
                layer.weight.normal_(0.0, 0.5)
                layer.bias.normal_(0.0, 0.5)
        save_head(head, path, files)
    return path

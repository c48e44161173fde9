"""Random-weight checkpoints in the published castorini format, for tests and speed benchmarks.

``write_random_checkpoint`` builds a BERT or DistilBERT masked-LM model from a
config (no hub, no download), and writes it with ``pooler.pt`` and
``TermWeightTrans.pt`` exactly as castorini/dhr does: the tied heads' state dicts
hold both ``linear_q.*`` and ``linear_p.*``. Speed does not depend on weight
values, so a DistilBERT-base-shaped random model (``shape="distilbert-base"``)
is a fair stand-in for the published checkpoints (docs/indexes.md).

Two head initialisations: ``"spread"`` draws weights and biases from N(0, 0.5) so
term weights fall on both signs (the math tests need zeros and negatives);
``"linear"`` keeps ``nn.Linear``'s init (seeded ``seed + 1``) with a positive
term-weight bias, so every token carries weight as a trained model's content
words do and no benchmark path gets to skip tokens.

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

# named shapes: the published DistilBERT checkpoints' (docs/indexes.md), BERT-base (the coCondenser
# Aggretriever's backbone), and a tiny one for quick runs and the ONNX tests; all with the bert-base-uncased
# vocabulary of the offline SPLADE-tiny model
SHAPES: dict[str, dict] = {
    "distilbert-base": {"arch": "distilbert", "hidden": 768, "layers": 6, "heads": 12},
    "bert-base": {"arch": "bert", "hidden": 768, "layers": 12, "heads": 12},
    "tiny": {"arch": "distilbert", "hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "init_range": 0.2},
}
SHAPE_HEADS = {"pooler_dim": 128, "head_init": "linear", "tokenizer_from": "splade-tiny"}
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


def _config(arch: str, hidden: int, layers: int, heads: int, intermediate: int | None, init_range: float | None,
            vocab_size: int, max_positions: int):
    from transformers import BertConfig, DistilBertConfig

    extra = {} if init_range is None else {"initializer_range": init_range}
    if arch == "bert":
        return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                          intermediate_size=intermediate or 4 * hidden, max_position_embeddings=max_positions, **extra)
    if arch == "distilbert":
        return DistilBertConfig(vocab_size=vocab_size, dim=hidden, n_layers=layers, n_heads=heads,
                                hidden_dim=intermediate or 4 * hidden, max_position_embeddings=max_positions, **extra)
    raise ValueError(f"unknown arch {arch!r}; use bert or distilbert")


def random_masked_lm(shape: str | None = None, *, seed: int | None = 0, arch: str = "bert", hidden: int = 32,
                     layers: int = 2, heads: int = 2, intermediate: int | None = None, init_range: float | None = None,
                     vocab_size: int = 30522, max_positions: int = 512):
    """A masked-LM model of a named shape (or the given sizes) with random weights, in eval mode.

    The torch generator is seeded with ``seed`` first; ``seed=None`` continues the caller's state."""
    from transformers import BertForMaskedLM, DistilBertForMaskedLM

    if shape is not None:
        arch, hidden, layers, heads = (SHAPES[shape][k] for k in ("arch", "hidden", "layers", "heads"))
        intermediate, init_range = SHAPES[shape].get("intermediate"), SHAPES[shape].get("init_range")
    if seed is not None:
        torch.manual_seed(seed)
    config = _config(arch, hidden, layers, heads, intermediate, init_range, vocab_size, max_positions)
    return (BertForMaskedLM if arch == "bert" else DistilBertForMaskedLM)(config).eval()


def _heads(hidden: int, pooler_dim: int, tied: bool, head_init: str, seed: int) -> tuple[LinearHead, LinearHead]:
    if head_init == "linear":
        torch.manual_seed(seed + 1)
        pooler, term_weight = LinearHead(hidden, pooler_dim, tied=tied), LinearHead(hidden, 1, tied=tied)
        with torch.no_grad():
            for layer in {id(m): m for m in (term_weight.linear_q, term_weight.linear_p)}.values():
                layer.bias.fill_(1.0)
        return pooler, term_weight
    if head_init != "spread":
        raise ValueError(f"unknown head_init {head_init!r}; use spread or linear")
    made = []
    for out in (pooler_dim, 1):
        head = LinearHead(hidden, out, tied=tied)
        with torch.no_grad():  # larger than nn.Linear's init so term weights spread over both signs
            for layer in {id(m): m for m in (head.linear_q, head.linear_p)}.values():
                layer.weight.normal_(0.0, 0.5)
                layer.bias.normal_(0.0, 0.5)
        made.append(head)
    return made[0], made[1]


def write_random_checkpoint(path: str | Path, shape: str | None = None, *, arch: str = "bert", hidden: int = 32,
                            layers: int = 2, heads: int = 2, intermediate: int | None = None,
                            init_range: float | None = None, pooler_dim: int = 16, vocab_size: int = 30522,
                            max_positions: int = 512, untied: bool = False, tied_heads: bool = True,
                            head_init: str = "spread", tokenizer_from: str | Path | None = None,
                            seed: int = 0) -> Path:
    """Write a published-format masked-LM directory with random weights; returns ``path``.

    ``shape`` names one of :data:`SHAPES` (sizes, then 128-d pooler, ``"linear"`` heads and the
    SPLADE-tiny tokenizer) in place of the size arguments."""
    path = Path(path)
    if shape is not None:
        from densehybrid.encoder import zoo

        hidden = SHAPES[shape]["hidden"]  # random_masked_lm takes the other sizes from the shape
        pooler_dim, head_init = SHAPE_HEADS["pooler_dim"], SHAPE_HEADS["head_init"]
        tokenizer_from = zoo.fetch(SHAPE_HEADS["tokenizer_from"])
    torch.manual_seed(seed)
    tokenizer = _tokenizer(tokenizer_from, vocab_size)
    for sub in ((QUERY_DIR, PASSAGE_DIR) if untied else ("",)):
        model = random_masked_lm(shape, seed=None, arch=arch, hidden=hidden, layers=layers, heads=heads, intermediate=intermediate,
                                 init_range=init_range, vocab_size=vocab_size, max_positions=max_positions)
        save_transformer(model, tokenizer, path / sub)
    pooler, term_weight = _heads(hidden, pooler_dim, tied_heads, head_init, seed)
    save_head(pooler, path, POOLER)
    save_head(term_weight, path, TERM_WEIGHT)
    return path

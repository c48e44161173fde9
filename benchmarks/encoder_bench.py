"""Encoder cost on a DistilBERT-base-shaped masked LM with random weights (DESIGN §3, §8).

Query latency: batch 1 at each query length, for [CLS]-only, full Aggretriever,
skip-MLM Aggretriever and DHR, on each backend (torch, ONNX Runtime), with the
ratio of each to [CLS]-only on the same backend. Token ids are made directly
(``[CLS] w1 .. wn [SEP]``) so every query has exactly the stated length;
tokenization (thread-safe, off the worker) is not part of the forward.

Passage throughput: batches of ``passage_batch`` x ``passage_length`` through our
encoders vs one bare transformers forward of the same network (the masked LM for
the MLM paths, its backbone for [CLS] and skip-MLM), so our overhead shows.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.checkpoints import write_random_checkpoint
from benchmarks.timing import ratio, time_calls
from encoder.backends.onnx_backend import apply_backend
from encoder.base import TokenizedText
from encoder.encoders import MODEL_KEY
from encoder.loading import load_encoder

log = logging.getLogger(__name__)

# name -> load_encoder options; "cls" first: every ratio is to it
VARIANTS = {
    "cls": {"kind": "cls", "pooling": "cls"},
    "aggretriever": {"kind": "aggretriever"},
    "aggretriever_skip_mlm": {"kind": "aggretriever", "skip_mlm": True},
    "dhr": {"kind": "dhr"},
}
CLS_ID, SEP_ID = 101, 102


def token_items(count: int, length: int, seed: int) -> list[TokenizedText]:
    """``count`` texts of exactly ``length`` ids ([CLS] .. [SEP]) drawn from the wordpiece range."""
    rng = np.random.default_rng(seed)
    return [TokenizedText({MODEL_KEY: [CLS_ID, *rng.integers(1996, 29612, length - 2).tolist(), SEP_ID]})
            for _ in range(count)]


def _encoder(model_dir: Path, variant: str, backend: str, device: str | None, cache: Path):
    encoder = load_encoder(str(model_dir), device=device, **VARIANTS[variant])
    return apply_backend(encoder, backend, cache_root=cache)


def query_latency(config, model_dir: Path, device: str | None, cache: Path) -> dict:
    out: dict = {}
    for backend in config.backends:
        for variant in VARIANTS:
            encoder = _encoder(model_dir, variant, backend, device, cache)
            for length in config.query_lengths:
                item = token_items(1, length, seed=length)
                t = time_calls(lambda: encoder.encode_tokenized(item, "query"), repeats=config.encoder_repeats, warmup=3)
                out.setdefault(backend, {}).setdefault(f"len{length}", {})[variant] = t.to_dict()
    for backend, by_length in out.items():
        for row in by_length.values():
            base = row["cls"]["p50"]
            for variant, t in row.items():
                t["ratio_to_cls_p50"] = ratio(t["p50"], base)
    if "torch" in out and "onnx" in out:
        out["onnx_speedup_p50"] = {length: {v: ratio(out["torch"][length][v]["p50"], out["onnx"][length][v]["p50"])
                                            for v in VARIANTS} for length in out["torch"]}
    return out


def _throughput(fn, passages: int, batches: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(batches):
        fn()
    return passages * batches / (time.perf_counter() - start)


def _bare_forward(encoder, items: list[TokenizedText]):
    """One transformers forward of the encoder's own network over the whole padded batch."""
    from encoder.tokenization import pad

    model = encoder.backbone.models["passage"]
    input_ids, mask = pad([i.ids[MODEL_KEY] for i in items], encoder.backbone.tokenizer.pad_id, model.device)

    def run():
        with torch.inference_mode():
            return model(input_ids=input_ids, attention_mask=mask)
    return run


def passage_throughput(config, model_dir: Path, device: str | None, cache: Path) -> dict:
    items = token_items(config.passage_batch, config.passage_length, seed=7)
    n, batches = len(items), config.passage_batches
    out: dict = {"batch": n, "length": config.passage_length}
    for variant in VARIANTS:
        torch_encoder = _encoder(model_dir, variant, "torch", device, cache)
        bare = _throughput(_bare_forward(torch_encoder, items), n, batches)
        row = {"bare_transformers_pps": round(bare, 3)}
        for backend in config.backends:
            encoder = apply_backend(torch_encoder, backend, cache_root=cache) if backend != "torch" else torch_encoder
            pps = _throughput(lambda: encoder.encode_tokenized(items, "passage"), n, batches)
            row[f"{backend}_pps"] = round(pps, 3)
            row[f"{backend}_over_bare"] = ratio(pps, bare)
        out[variant] = row
    return out


def run(config, device: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="densehybrid-bench-") as tmp:
        model_dir = write_random_checkpoint(Path(tmp) / "model", config.encoder_shape)
        cache = Path(tmp) / "onnx"
        return {"shape": config.encoder_shape, "threads": torch.get_num_threads(),
                "query_latency_ms": query_latency(config, model_dir, device, cache),
                "passage_throughput": passage_throughput(config, model_dir, device, cache)}

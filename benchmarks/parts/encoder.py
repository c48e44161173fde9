"""Encoder cost on a masked LM of a named shape (DistilBERT-base by default) with random weights
(docs/performance.md).

Query latency: batch 1 at each query length, for [CLS]-only, full Aggretriever,
skip-MLM Aggretriever and DHR, on each backend (torch, ONNX Runtime), with the
ratio of each to [CLS]-only on the same backend. Token ids are made directly
(``[CLS] w1 .. wn [SEP]``) so every query has exactly the stated length;
tokenization (thread-safe, off the worker) is not part of the forward. A
second row per backend times a real query text end to end, tokenization included.

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

from densehybrid.encoder.random_checkpoint import write_random_checkpoint
from densehybrid.bench.timing import ratio, round_robin, summarize
from densehybrid.encoder.base import TokenizedText
from densehybrid.encoder.encoders import MODEL_KEY
from densehybrid.encoder.loading import load_encoder

log = logging.getLogger(__name__)

# name -> load_encoder options; "cls" first: every ratio is to it
VARIANTS = {
    "cls": {"kind": "cls", "pooling": "cls"},
    "aggretriever": {"kind": "aggretriever"},
    "aggretriever_skip_mlm": {"kind": "aggretriever", "skip_mlm": True},
    "dhr": {"kind": "dhr"},
}
CLS_ID, SEP_ID = 101, 102
# 12 tokens with [CLS] and [SEP] under the bert-base-uncased vocabulary
QUERY_TEXT = "what is the population of the capital city of france"


def token_items(count: int, length: int, seed: int) -> list[TokenizedText]:
    """``count`` texts of exactly ``length`` ids ([CLS] .. [SEP]) drawn from the wordpiece range."""
    rng = np.random.default_rng(seed)
    return [TokenizedText({MODEL_KEY: [CLS_ID, *rng.integers(1996, 29612, length - 2).tolist(), SEP_ID]})
            for _ in range(count)]


def _encoder(model_dir: Path, variant: str, backend: str, device: str | None, cache: Path, **options):
    return load_encoder(str(model_dir), device=device, backend=backend, cache_root=cache, **options,
                        **VARIANTS[variant])


def interleaved(calls: dict[str, object], *, repeats: int, warmup: int = 3) -> dict[str, dict]:
    """Time several calls round-robin (their ratios are the output); -> name -> timing dict."""
    def timed(fn):
        def call(_round: int) -> float:
            start = time.perf_counter()
            fn()
            _device_done()
            return (time.perf_counter() - start) * 1000.0
        return call

    samples = round_robin({name: timed(fn) for name, fn in calls.items()}, repeats, warmup=warmup)
    return {name: summarize(s).to_dict() for name, s in samples.items()}


def query_latency(config, model_dir: Path, device: str | None, cache: Path) -> dict:
    out: dict = {}
    for backend in config.backends:
        encoders = {variant: _encoder(model_dir, variant, backend, device, cache) for variant in VARIANTS}
        # the GPU run (and its CPU rehearsal) also times the forwards without CUDA graphs
        graphs_compared = backend == "torch" and config.preset.startswith("gpu")
        eager = {variant: _encoder(model_dir, variant, backend, device, cache, cuda_graphs=False)
                 for variant in ("cls", "aggretriever")} if graphs_compared else {}
        for length in config.query_lengths:
            item = token_items(1, length, seed=length)
            calls = {v: (lambda e=e: e.encode_tokenized(item, "query")) for v, e in encoders.items()}
            if backend == "torch":  # the reference: the same networks' bare transformers forwards
                calls |= {"bare_backbone": _bare_forward(encoders["cls"], item),
                          "bare_masked_lm": _bare_forward(encoders["aggretriever"], item)}
                if eager:  # what the CUDA graphs save, on ours and on the bare networks
                    calls |= {f"{v}_eager": (lambda e=e: e.encode_tokenized(item, "query")) for v, e in eager.items()}
                    calls |= {"bare_backbone_graphed": _bare_replayed(encoders["cls"], item),
                              "bare_masked_lm_graphed": _bare_replayed(encoders["aggretriever"], item)}
            row = interleaved(calls, repeats=config.encoder_repeats)
            for t in row.values():
                t["ratio_to_cls_p50"] = ratio(t["p50"], row["cls"]["p50"])
            out.setdefault(backend, {})[f"len{length}"] = row
        calls = {v: (lambda e=e: e.encode([QUERY_TEXT], "query")) for v, e in encoders.items()}
        calls |= {f"{v}_eager": (lambda e=e: e.encode([QUERY_TEXT], "query")) for v, e in eager.items()}
        out[backend]["text_with_tokenize"] = interleaved(calls, repeats=config.encoder_repeats)
        out.setdefault("cuda_graphs_captured", {})[backend] = {v: getattr(e, "graph_count", 0)
                                                               for v, e in encoders.items()}
        del encoders, eager
    if "torch" in out and "onnx" in out:
        out["onnx_speedup_p50"] = {length: {v: ratio(out["torch"][length][v]["p50"], out["onnx"][length][v]["p50"])
                                            for v in VARIANTS} for length in out["torch"]}
    return out


def _throughput(fn, warm, passages: int, batches: int) -> float:
    warm()  # a small batch: allocations and lazy initialisation stay out of the timing
    fn()  # and one full batch: the math libraries pick their kernels for its shapes on first use
    _device_done()
    start = time.perf_counter()
    for _ in range(batches):
        fn()
    _device_done()
    return passages * batches / (time.perf_counter() - start)


def _device_done() -> None:
    """Wait for the GPU: a bare forward returns once its kernels are queued, ours once its rows are copied
    back, so both are timed to the end of their work."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _bare_forward(encoder, items: list[TokenizedText]):
    """One transformers forward of the encoder's own network over the whole padded batch, under the same
    autocast as the encoder (fp16 on CUDA), so the two differ only by what the encoder adds."""
    from densehybrid.encoder.device import autocast
    from densehybrid.encoder.tokenization import pad

    model = encoder.backbone.models["passage"]
    input_ids, mask = pad([i.ids[MODEL_KEY] for i in items], encoder.backbone.tokenizer.pad_id, model.device)

    def run():
        with torch.inference_mode(), autocast(model.device):
            return model(input_ids=input_ids, attention_mask=mask)
    return run


def _bare_replayed(encoder, items: list[TokenizedText]):
    """The bare forward of :func:`_bare_forward` replayed from a CUDA graph in the encoder's own bucket (the
    bare network's floor under graphs)."""
    from densehybrid.encoder.graphs import Buckets, ReplayedForward

    model = encoder.backbone.models["passage"]

    def forward(ids, mask):
        out = model(input_ids=ids, attention_mask=mask)
        return (out.logits if hasattr(out, "logits") else out.last_hidden_state)[:, 0], None

    rows = [i.ids[MODEL_KEY] for i in items]
    replayed = ReplayedForward(forward, model.device, encoder.backbone.tokenizer.pad_id,
                               Buckets().capped(encoder.spec.max_query_length))
    return lambda: replayed(rows)


def passage_throughput(config, model_dir: Path, device: str | None, cache: Path) -> dict:
    items = token_items(config.passage_batch, config.passage_length, seed=7)
    few = items[:2]
    n, batches = len(items), config.passage_batches
    out: dict = {"batch": n, "length": config.passage_length}
    bare_by_network: dict[bool, float] = {}  # the masked LM (MLM paths) or its backbone ([CLS], skip-MLM)
    for variant in VARIANTS:
        torch_encoder = _encoder(model_dir, variant, "torch", device, cache)
        network = torch_encoder.backbone.with_mlm
        if network not in bare_by_network:
            bare_by_network[network] = _throughput(_bare_forward(torch_encoder, items),
                                                   _bare_forward(torch_encoder, few), n, batches)
        bare = bare_by_network[network]
        row = {"network": "masked LM" if network else "backbone", "bare_transformers_pps": round(bare, 3)}
        for backend in config.backends:
            encoder = _encoder(model_dir, variant, backend, device, cache) if backend != "torch" else torch_encoder
            pps = _throughput(lambda: encoder.encode_tokenized(items, "passage"),
                              lambda: encoder.encode_tokenized(few, "passage"), n, batches)
            row[f"{backend}_pps"] = round(pps, 3)
            row[f"{backend}_over_bare"] = ratio(pps, bare)
        out[variant] = row
    return out


def mlm_breakdown(config, model_dir: Path, device: str | None, cache: Path) -> dict:
    """Where a full-Aggretriever query's time goes (torch): backbone, MLM head on the L-1 real
    rows, representation math; and the multiply-adds per token of the backbone and of the head, which
    bound the full/[CLS] ratio from below when both run at the same FLOP rate."""
    from densehybrid.encoder import representations as R
    from densehybrid.encoder.backends.onnx_export import base_model_of, mlm_head_of

    encoder = _encoder(model_dir, "aggretriever", "torch", device, cache)
    model = encoder.backbone.models["query"]
    base, head, cfg = base_model_of(model), mlm_head_of(model), model.config
    # BertConfig and DistilBertConfig share hidden_size and num_hidden_layers; the FFN width has two names
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    ffn = cfg.intermediate_size if cfg.model_type == "bert" else cfg.hidden_dim
    backbone_macs = layers * (4 * d * d + 2 * d * ffn)  # per token, attention scores aside
    head_macs = d * d + d * vocab
    out = {"backbone_macs_per_token": backbone_macs, "head_macs_per_token": head_macs,
           "flop_bound_ratio": round(1 + head_macs / backbone_macs, 4)}
    for length in config.query_lengths:
        ids = torch.tensor([token_items(1, length, seed=length)[0].ids[MODEL_KEY]], device=model.device)
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = head(hidden)
            weights = torch.rand(1, length, device=model.device)
            timings = interleaved({
                "backbone_ms": lambda: base(input_ids=ids, attention_mask=mask),
                "head_ms": lambda: head(hidden[:, 1:]),
                "math_ms": lambda: R.aggregate_full(R.term_weighted_mlm(logits, weights, mask)),
            }, repeats=config.encoder_repeats)
        row = {k: round(t["p50"], 3) for k, t in timings.items()}
        row["measured_bound_ratio"] = ratio(row["backbone_ms"] + row["head_ms"] + row["math_ms"], row["backbone_ms"])
        out[f"len{length}"] = row
    return out


def run(config, device: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="densehybrid-bench-") as tmp:
        model_dir = write_random_checkpoint(Path(tmp) / "model", config.encoder_shape)
        cache = Path(tmp) / "onnx"
        return {"shape": config.encoder_shape, "threads": torch.get_num_threads(),
                "query_latency_ms": query_latency(config, model_dir, device, cache),
                "mlm_breakdown": mlm_breakdown(config, model_dir, device, cache),
                "passage_throughput": passage_throughput(config, model_dir, device, cache)}

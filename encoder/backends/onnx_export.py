"""Export a transformers model to the two ONNX graphs the ONNX Runtime backend runs.

``backbone.onnx``: (input_ids, attention_mask) -> last_hidden_state (B, L, d), batch and
length dynamic. ``mlm_head.onnx``: hidden rows (N, d) -> logits (N, V), only when the
model has an MLM head. ``export.json`` records the opset, sizes and the key of the
weights they came from. The representation math is not exported: it stays in torch, shared
with the torch path (measured: it is ~2 ms of a 32-token query, the head GEMM ~10 ms).

Exports go to a temporary directory published by one rename, so a reader never
sees half a graph; :func:`ensure_exported` caches them by a hash of the weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

OPSET = 17
BACKBONE_FILE = "backbone.onnx"
HEAD_FILE = "mlm_head.onnx"
META_FILE = "export.json"


def base_model_of(model: torch.nn.Module) -> torch.nn.Module:
    """The encoder stack of a transformers model, with or without an MLM head on top."""
    return getattr(model, "base_model", model)


def mlm_head_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The MLM head of a transformers masked-LM model as one module ``(..., d) -> (..., V)``; None if absent."""
    if hasattr(model, "vocab_projector"):  # DistilBertForMaskedLM keeps its head as loose layers
        return torch.nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)
    for name in ("cls", "lm_head"):  # BertForMaskedLM, RobertaForMaskedLM
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    return None


class _HiddenStates(torch.nn.Module):
    def __init__(self, base: torch.nn.Module):
        super().__init__()
        self.base = base

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def weights_key(model: torch.nn.Module) -> str:
    """sha256 over parameter and buffer names, shapes and bytes: the cache key of an export."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _example_inputs(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # A padded row makes the tracer record the masking path: with an all-ones mask
    # transformers may drop the mask altogether and the graph would ignore padding.
    input_ids = torch.randint(1000, min(vocab_size, 2000), (2, 8))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    return input_ids, attention_mask


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: dict, outputs: dict, opset: int) -> None:
    # torch.onnx.export restores the wrapper's train/eval mode recursively afterwards, so the
    # wrapper must be in eval mode too or the caller's model comes back in training mode (dropout on).
    module.eval()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
        torch.onnx.export(module, args, str(path), input_names=list(inputs), output_names=list(outputs),
                          dynamic_axes={**inputs, **outputs}, opset_version=opset, dynamo=False)


def export_model(model: torch.nn.Module, out_dir: str | Path, *, opset: int = OPSET, key: str | None = None) -> Path:
    """Write ``backbone.onnx`` (+ ``mlm_head.onnx``) and ``export.json`` into ``out_dir`` atomically."""
    out_dir = Path(out_dir)
    base, head = base_model_of(model).eval(), mlm_head_of(model)
    config = base.config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}-"))
    try:
        seq = {0: "batch", 1: "length"}
        _export(_HiddenStates(base).eval(), _example_inputs(config.vocab_size), tmp / BACKBONE_FILE,
                {"input_ids": seq, "attention_mask": seq}, {"last_hidden_state": seq}, opset)
        if head is not None:
            _export(head.eval(), (torch.randn(3, config.hidden_size),), tmp / HEAD_FILE,
                    {"rows": {0: "rows"}}, {"logits": {0: "rows"}}, opset)
        meta = {"opset": opset, "hidden_size": int(config.hidden_size), "vocab_size": int(config.vocab_size),
                "has_mlm_head": head is not None, "model_class": type(model).__name__,
                "weights_key": key or weights_key(model), "torch": torch.__version__}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s to ONNX (opset %d) in %s", type(model).__name__, opset, out_dir)
    return out_dir


def read_meta(export_dir: str | Path) -> dict:
    path = Path(export_dir) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ONNX export here (expected {META_FILE} beside {BACKBONE_FILE})")
    return json.loads(path.read_text())


def ensure_exported(model: torch.nn.Module, cache_root: str | Path, *, key: str | None = None) -> Path:
    """The export of ``model`` under ``cache_root/<key>``, exporting it on first use."""
    key = key or weights_key(model)
    target = Path(cache_root) / key[:32]
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        if read_meta(target).get("weights_key") == key:
            return target
    return export_model(model, target, key=key)

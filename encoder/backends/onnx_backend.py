"""ONNX Runtime behind the :class:`~encoder.backends.backbone.Backbone` interface.

Runs the graphs written by :mod:`encoder.backends.onnx_export`: the CPU provider
here, the CUDA provider when ``onnxruntime-gpu`` (the ``gpu`` extra) is installed and
a GPU is present. Inputs and outputs are torch tensors, so an encoder's §2 math
is the same code for both backends; outputs equal torch to ~1e-5 (tested).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from encoder.backends.backbone import BackboneError, TorchBackbone
from encoder.backends.onnx_export import BACKBONE_FILE, HEAD_FILE, ensure_exported, read_meta

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def _ort():
    try:
        import onnxruntime
    except ImportError as exc:  # a core dependency, but a broken env deserves the exact fix
        raise BackboneError("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu)") from exc
    return onnxruntime


def providers_for(device: str) -> list[str]:
    """ONNX Runtime providers for a device string ("cpu", "cuda", "cuda:1"), most preferred first."""
    if device.startswith("cuda"):
        available = _ort().get_available_providers()
        if CUDA_PROVIDER not in available:
            raise BackboneError(f"device {device!r} asks for {CUDA_PROVIDER}, which this onnxruntime lacks "
                                f"(has {available}); pip install 'densehybrid[gpu]' (onnxruntime-gpu)")
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def _provider_options(device: str) -> list[dict]:
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return [{"device_id": index}, {}]
    return [{}]


class OnnxBackbone:
    """The exported backbone (+ MLM head) of one model, run by ONNX Runtime sessions."""

    def __init__(self, export_dir: str | Path, *, device: str = "cpu", threads: int | None = None):
        ort = _ort()
        self.export_dir = Path(export_dir)
        meta = read_meta(self.export_dir)
        self.hidden_size = int(meta["hidden_size"])
        self.vocab_size = int(meta["vocab_size"])
        self.has_mlm_head = bool(meta["has_mlm_head"])
        self.device = device
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3

        def session(name: str):
            return ort.InferenceSession(str(self.export_dir / name), sess_options=options,
                                        providers=providers_for(device), provider_options=_provider_options(device))

        self._backbone = session(BACKBONE_FILE)
        self._head = session(HEAD_FILE) if self.has_mlm_head else None
        log.info("ONNX Runtime backbone from %s on %s (providers %s)", self.export_dir, device,
                 self._backbone.get_providers())

    @property
    def providers(self) -> list[str]:
        return self._backbone.get_providers()

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": _int64(input_ids), "attention_mask": _int64(attention_mask)}
        return torch.from_numpy(self._backbone.run(None, feeds)[0])

    def mlm_logits(self, rows: torch.Tensor) -> torch.Tensor:
        if self._head is None:
            raise BackboneError(f"{self.export_dir} has no {HEAD_FILE}: the model was exported without an MLM head")
        if rows.shape[0] == 0:
            return torch.zeros(0, self.vocab_size)
        return torch.from_numpy(self._head.run(None, {"rows": rows.detach().float().cpu().contiguous().numpy()})[0])


def _int64(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().to(torch.int64).contiguous().numpy()


def onnx_backbone_for(model: torch.nn.Module, cache_root: str | Path, *, device: str = "cpu",
                      key: str | None = None, threads: int | None = None) -> OnnxBackbone:
    """Export ``model`` once (cached under ``cache_root`` by weights) and open it with ONNX Runtime."""
    return OnnxBackbone(ensure_exported(model, cache_root, key=key), device=device, threads=threads)


def make_backbone(model: torch.nn.Module, backend: str, *, cache_root: str | Path | None = None,
                  device: str = "cpu", key: str | None = None) -> TorchBackbone | OnnxBackbone:
    """The backend switch: ``"torch"`` or ``"onnx"`` over the same transformers model."""
    if backend == "torch":
        return TorchBackbone(model)
    if backend == "onnx":
        if cache_root is None:
            from encoder.zoo import cache_dir
            cache_root = cache_dir() / "onnx"
        return onnx_backbone_for(model, cache_root, device=device, key=key)
    raise ValueError(f"unknown backend {backend!r}; choose 'torch' or 'onnx'")

"""ONNX Runtime as an encoder backend: the same checkpoints, the same representation math, another runtime.

:func:`runtime_backbone` is where ``load_encoder`` picks the runtime. For ONNX it
exports each transformers model once (cached by a hash of its weights, see
:mod:`encoder.backends.onnx_export`) and returns an :class:`OnnxBackbone` in place
of the torch one, whose modules are then dropped: only the graphs stay resident.
The graphs cover the transformer and the MLM head; tokenization, the small heads
(pooler, term weights) and the representation math stay the torch code they were, so the two
backends can only differ by float rounding: |onnx - torch| <= 1e-5 + 1e-5·|torch|
(tested on every kind).

``precision="int8"`` runs the backbone's dynamically quantized graph instead
(:mod:`encoder.backends.onnx_quantize`, made once beside the float32 one); the MLM head stays float32.

Providers: CPU here; CUDA when ``onnxruntime-gpu`` (the ``gpu`` extra) is installed and
the encoder's device is a GPU. The MLM head runs only on unpadded rows.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from densehybrid.encoder.backbone import Backbone, TorchBackbone
from densehybrid.encoder.choices import ROLES, Backend, Precision, Role
from densehybrid.encoder.tokenization import RoleTokenizer

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


class OnnxBackendError(RuntimeError):
    """The ONNX backend cannot run here (missing package or provider, unsupported encoder, no head)."""


def _ort():
    try:
        import onnxruntime
    except ImportError as exc:  # a core dependency, but a broken env deserves the exact fix
        raise OnnxBackendError("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu)") from exc
    return onnxruntime


def providers_for(device: str) -> list[str]:
    """ONNX Runtime providers for a device string ("cpu", "cuda", "cuda:1"), most preferred first."""
    if device.startswith("cuda"):
        available = _ort().get_available_providers()
        if CUDA_PROVIDER not in available:
            raise OnnxBackendError(f"device {device!r} asks for {CUDA_PROVIDER}, which this onnxruntime lacks "
                                   f"(has {available}); pip install 'densehybrid[gpu]' (onnxruntime-gpu)")
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def provider_options(device: str) -> list[dict]:
    if device.startswith("cuda"):
        return [{"device_id": int(device.split(":", 1)[1]) if ":" in device else 0}, {}]
    return [{}]


class OnnxModel:
    """One exported model: ``hidden_states`` (backbone) and ``mlm_logits`` (head) sessions."""

    def __init__(self, export_dir: str | Path, *, device: str = "cpu", threads: int | None = None,
                 precision: Precision = "fp32"):
        from densehybrid.encoder.backends.onnx_export import BACKBONE_FILE, HEAD_FILE, read_meta
        from densehybrid.encoder.backends.onnx_quantize import ensure_quantized

        ort = _ort()
        self.export_dir = Path(export_dir)
        meta = read_meta(self.export_dir)
        self.hidden_size, self.vocab_size = int(meta["hidden_size"]), int(meta["vocab_size"])
        self.has_mlm_head = bool(meta["has_mlm_head"])
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # ORT's idle threads spin by default; on a small CPU they would steal the cores the torch
        # post-processing (representation math, heads) runs on right after each forward.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")

        def session(name: str):
            return ort.InferenceSession(str(self.export_dir / name), sess_options=options,
                                        providers=providers_for(device), provider_options=provider_options(device))

        self.precision = precision
        if precision == "int8" and device.startswith("cuda"):
            raise OnnxBackendError("int8 runs on ONNX Runtime's CPU kernels; use precision fp32 on a GPU")
        backbone_file = ensure_quantized(self.export_dir, BACKBONE_FILE).name if precision == "int8" else BACKBONE_FILE
        self._backbone = session(backbone_file)
        self._head = session(HEAD_FILE) if self.has_mlm_head else None
        self.providers = self._backbone.get_providers()

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L), (B, L) -> (B, L, d) float32 (CPU)."""
        feeds = {"input_ids": _int64(input_ids), "attention_mask": _int64(attention_mask)}
        return torch.from_numpy(self._backbone.run(None, feeds)[0])

    def mlm_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """(N, d) hidden rows -> (N, V) float32 (CPU)."""
        if self._head is None:
            raise OnnxBackendError(f"{self.export_dir}: exported without an MLM head")
        if rows.shape[0] == 0:
            return torch.zeros(0, self.vocab_size)
        return torch.from_numpy(self._head.run(None, {"rows": rows.detach().float().cpu().contiguous().numpy()})[0])

    def mlm_logits_at(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L, d), (B, L) -> (B, L, V) logits at unmasked positions, 0 at padding (never read by the representation math)."""
        if bool(mask.all()):
            return self.mlm_logits(hidden.reshape(-1, hidden.shape[-1])).reshape(*hidden.shape[:2], -1)
        keep = mask.bool().cpu()
        logits = torch.zeros(*hidden.shape[:2], self.vocab_size)
        logits[keep] = self.mlm_logits(hidden.cpu()[keep])
        return logits


def _int64(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().to(torch.int64).contiguous().numpy()


class OnnxBackbone(Backbone):
    """A :class:`Backbone` whose forward runs ONNX Runtime sessions; no torch transformer is kept."""

    backend = "onnx"

    def __init__(self, runners: dict[Role, OnnxModel], tokenizer: RoleTokenizer, with_mlm: bool):
        self.runners, self.tokenizer, self.with_mlm = runners, tokenizer, with_mlm
        self.precision = runners["query"].precision

    @property
    def tied(self) -> bool:
        return self.runners["query"] is self.runners["passage"]

    @property
    def hidden_size(self) -> int:
        return self.runners["query"].hidden_size

    @property
    def vocab_size(self) -> int:
        return self.runners["query"].vocab_size

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, role: Role) -> tuple[torch.Tensor, torch.Tensor | None]:
        runner = self.runners[role]
        hidden = runner.hidden_states(input_ids, mask)
        logits = runner.mlm_logits_at(hidden, mask) if self.with_mlm else None
        device = input_ids.device  # CUDA provider outputs come back to the encoder's device
        return hidden.to(device), None if logits is None else logits.to(device)


def onnx_backbone(backbone: TorchBackbone, device: torch.device, cache_root: Path,
                  precision: Precision = "fp32") -> OnnxBackbone:
    """Export (or find in the cache) each model of ``backbone``; the result shares none of its torch modules."""
    from densehybrid.encoder.backends.onnx_export import ensure_exported

    by_model: dict[int, OnnxModel] = {}
    for role in ROLES:  # a tied backbone shares one module, hence one export and one session
        model = backbone.models[role]
        if id(model) not in by_model:
            by_model[id(model)] = OnnxModel(ensure_exported(model.cpu(), cache_root), device=str(device),
                                            precision=precision)
    runners = {role: by_model[id(backbone.models[role])] for role in ROLES}
    log.info("running on ONNX Runtime (%s, %s)", ", ".join(runners["query"].providers), precision)
    return OnnxBackbone(runners, backbone.tokenizer, backbone.with_mlm)


def default_cache_root() -> Path:
    from densehybrid.encoder.zoo import cache_dir

    return cache_dir() / "onnx"


def onnx_serves(device: torch.device) -> bool:
    """Whether ``auto`` picks ONNX Runtime: a CPU device with onnxruntime installed.

    On the CPU it runs the same graphs about twice as fast as torch eager (MiniLM, 2 threads: 3.9 vs
    8.0 ms for one query, 109 vs 222 ms for 32 x 48 tokens; docs/performance.md); on a GPU torch is the backend
    (docs/gpu.md, "Backends on a GPU")."""
    if device.type != "cpu":
        return False
    try:
        _ort()
    except OnnxBackendError:
        return False
    return True


def runtime_backbone(backbone: TorchBackbone, backend: Backend, device: torch.device, *,
                     cache_root: str | Path | None = None, model_id: str = "", precision: Precision = "fp32") -> Backbone:
    """The backbone a freshly loaded torch ``backbone`` runs as: ``"torch"`` (itself), ``"onnx"``, or
    ``"auto"``: ONNX Runtime where :func:`onnx_serves`, falling back to torch (with a warning) when the
    export fails, since both give the same vectors. int8 runs on ONNX Runtime only, never falling back."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    if backend == "onnx" or precision == "int8":
        return onnx_backbone(backbone, device, root, precision)
    if backend == "auto" and onnx_serves(device):
        try:
            return onnx_backbone(backbone, device, root)
        except Exception as exc:  # noqa: BLE001 - any export/session failure: torch serves the same vectors
            log.warning("ONNX Runtime cannot run %s (%s: %s); serving it with torch", model_id,
                        type(exc).__name__, exc)
            backbone.to(device)
    return backbone

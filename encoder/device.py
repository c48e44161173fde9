"""The one place that decides where and how the encoders run.

CUDA when present unless the caller names a device; fp16 autocast on CUDA only
(CPU stays float32, so CPU results are the reference); thread count for CPU.
The CUDA branch is deliberately thin: everything it does is also done on CPU.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from densehybrid.encoder.errors import DeviceError

log = logging.getLogger(__name__)


def pick_device(requested: str | None = None) -> torch.device:
    """``None``/``"auto"`` -> ``cuda`` if available else ``cpu``; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` as given."""
    if requested in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise DeviceError(f"unknown device {requested!r}; use cpu, cuda, cuda:N or auto") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {requested!r} requested but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {requested!r} requested but only {torch.cuda.device_count()} CUDA devices exist")
    elif device.type != "cpu":
        raise DeviceError(f"unsupported device {requested!r}; use cpu, cuda, cuda:N or auto")
    return device


def autocast(device: torch.device, *, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
    """fp16 autocast on CUDA; a no-op on CPU (float32 there). ``cache_enabled=False`` for a CUDA graph capture."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16, cache_enabled=cache_enabled)
    return contextlib.nullcontext()


def to_host(*tensors: torch.Tensor | None) -> list[np.ndarray | None]:
    """Tensors -> numpy arrays (floating ones as float32; None stays None). From a GPU, every copy is queued
    into pinned memory before one wait, where each ``.cpu()`` would wait for the device on its own."""
    copies = []
    for tensor in tensors:
        if tensor is not None and tensor.is_floating_point():
            tensor = tensor.float()
        if tensor is not None and tensor.is_cuda:
            tensor = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)
        copies.append(tensor)
    for device in {tensor.device for tensor in tensors if tensor is not None and tensor.is_cuda}:
        torch.cuda.current_stream(device).synchronize()
    return [None if copy is None else copy.numpy() for copy in copies]

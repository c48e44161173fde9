"""Which runtime extra is installed: exactly one of ``densehybrid[cpu]`` and ``densehybrid[gpu]``.

Both extras install the ``onnxruntime`` module (one as ``onnxruntime``, one as ``onnxruntime-gpu``),
so with both present whichever was installed last wins by chance; with neither, Faiss or ONNX
Runtime is missing. Either way the command stops at start with one sentence instead of an
ImportError deep in a request.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from densehybrid.encoder.errors import EncoderError

INSTALL_HINT = "pip install 'densehybrid[cpu]' (CPU) or pip install 'densehybrid[gpu]' (CUDA GPU)"
CPU_ONLY = ("onnxruntime",)
GPU_ONLY = ("onnxruntime-gpu",)
SHARED = ("faiss-cpu",)


class MissingExtraError(EncoderError):
    """Neither or both of the runtime extras are installed."""


def installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def installed_extra() -> str:
    """``"cpu"`` or ``"gpu"``; :class:`MissingExtraError` naming both installs otherwise."""
    cpu = all(installed(d) for d in CPU_ONLY)
    gpu = all(installed(d) for d in GPU_ONLY)
    missing = [d for d in SHARED if not installed(d)]
    if cpu and gpu:
        raise MissingExtraError("both onnxruntime and onnxruntime-gpu are installed, and they replace each other's "
                                f"files; keep one extra: pip uninstall -y onnxruntime onnxruntime-gpu, then {INSTALL_HINT}")
    if not (cpu or gpu) or missing:
        absent = missing + ([] if cpu or gpu else ["onnxruntime"])
        raise MissingExtraError(f"densehybrid's runtime extra is not installed (missing: {', '.join(absent)}); "
                                f"install one: {INSTALL_HINT}")
    return "gpu" if gpu else "cpu"

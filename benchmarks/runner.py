"""Run the benchmark sections in order, collect one results dict (what the JSON file holds)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import platform
import time

import torch

from densehybrid.bench.load import service
from densehybrid.bench.parts import encoder, memory, search
from densehybrid.bench.config import BenchConfig
from densehybrid.bench.targets import check_all

log = logging.getLogger(__name__)


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    try:
        import faiss
        import onnxruntime

        info.update(faiss=faiss.__version__, onnxruntime=onnxruntime.__version__,
                    onnx_providers=onnxruntime.get_available_providers())
    except ImportError:
        pass
    return info


def set_threads(threads: int | None) -> None:
    """One thread count for torch (and so ONNX Runtime, which follows it) and Faiss's OpenMP."""
    if threads is None:
        return
    import faiss

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


def run(config: BenchConfig) -> dict:
    set_threads(config.threads)
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    results: dict = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "config": config.to_dict(), "device": device, "machine": machine(), "seconds": {}}
    steps = {
        "memory": lambda: memory.run(config),
        "search": lambda: search.run(config, device, results.get("memory", {})),
        "encoder": lambda: encoder.run(config, device),
        "service": lambda: service.run(config, device),
    }
    for name in config.sections:
        log.info("benchmark section %s ...", name)
        start = time.perf_counter()
        results[name] = steps[name]()
        results["seconds"][name] = round(time.perf_counter() - start, 1)
    results["targets"] = check_all(results)
    results["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return results

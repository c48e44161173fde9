"""Int8 graphs beside the float32 export: ONNX Runtime dynamic quantization.

``backbone.int8.onnx`` is ``backbone.onnx`` with its MatMul/Gemm weights stored as int8,
one scale per output channel, and activations quantized per batch at run time
(``quantize_dynamic``). Each graph is first run through ONNX Runtime's pre-processing
(shape inference and graph optimization) so that quantization sees fused ops.
The MLM head stays float32: SPLADE's log(1 + relu) turns logit errors near zero into
terms switched on or off, and the DLR gates are decided there; the quality gate measured
int8 with the head in float32 (docs/precision.md).

Files are written under a temporary name and renamed into place, so a reader
never sees half a graph; :func:`ensure_quantized` makes them once per export.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

INT8_SUFFIX = ".int8.onnx"


def quantized_name(graph_file: str) -> str:
    """``backbone.onnx`` -> ``backbone.int8.onnx``."""
    return graph_file.removesuffix(".onnx") + INT8_SUFFIX


def quantize_graph(source: Path, target: Path) -> Path:
    """Write the dynamically quantized (int8 weights, per channel) ``source`` to ``target`` atomically."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fd, staged = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-", suffix=".onnx")
    os.close(fd)
    prepared = Path(staged).with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(str(prepared), staged, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Gemm"])
        os.replace(staged, target)
    finally:
        for leftover in (Path(staged), prepared):
            leftover.unlink(missing_ok=True)
    log.info("quantized %s to int8 (%s)", source, target.name)
    return target


def ensure_quantized(export_dir: str | Path, graph_file: str) -> Path:
    """The int8 graph of ``export_dir/graph_file``, quantizing it on first use."""
    export_dir = Path(export_dir)
    target = export_dir / quantized_name(graph_file)
    if target.is_file():
        return target
    return quantize_graph(export_dir / graph_file, target)

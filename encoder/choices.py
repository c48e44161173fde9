"""The closed sets of names the encoder layer accepts, each written once.

Everything above this layer (index manifests, service settings, CLI choices)
imports them from here, so a new kind or pooling is one line.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["query", "passage"]
Kind = Literal["aggretriever", "dhr", "dlr", "fusion", "cls"]
# how the V-dim lexical vector is made: term-weighted MLM, the skip-MLM fast path, or SPLADE-style
Lexical = Literal["delade", "skip_mlm", "splade"]
Pooling = Literal["cls", "mean"]
# the runtime of the transformer forward; "auto" is ONNX Runtime on a CPU, torch elsewhere
Backend = Literal["auto", "torch", "onnx"]
# the numbers the transformer forward runs in: float32, or int8 weights (ONNX Runtime dynamic quantization)
Precision = Literal["fp32", "int8"]
# which end of an over-long text is cut: "right" keeps its first tokens, "left" its last ones
Direction = Literal["right", "left"]

ROLES: tuple[Role, ...] = get_args(Role)
KINDS: tuple[Kind, ...] = get_args(Kind)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
GATED_KINDS: frozenset[str] = frozenset({"dhr", "dlr", "fusion"})
SCALED_KINDS: frozenset[str] = frozenset({"dhr", "fusion"})

"""Which kinds may encode in int8: only those whose retrieval quality was measured to hold.

int8 is admitted for a kind when, on msmarco-dl-5k with the offline models, nDCG@10
drops by at most 0.005 against float32 and the DLR gates agree on at least 99% of
entries (``densehybrid.bench.parts.int8_gate`` measures it; docs/precision.md has the table).
A kind that was not measured, or failed, is refused with the reason.
"""

from __future__ import annotations

from densehybrid.encoder.choices import PRECISIONS
from densehybrid.encoder.errors import EncoderError

# kind -> what the quality gate measured (docs/precision.md, densehybrid.bench.parts.int8_gate)
INT8_ADMITTED: dict[str, str] = {
    "cls": "minilm on msmarco-dl-5k: nDCG@10 0.7982 fp32, 0.7946 int8",
    "dlr": "splade-tiny on msmarco-dl-5k: nDCG@10 0.8082 fp32, 0.8099 int8; gates agree on 99.42% of entries",
    "fusion": "splade-tiny + minilm (zscore) on msmarco-dl-5k: nDCG@10 0.8215 fp32, 0.8200 int8",
}
INT8_REFUSED: dict[str, str] = {}
NOT_MEASURED = "no offline model of this kind to measure int8 quality on"


class PrecisionError(EncoderError):
    """A precision this encoder cannot run in (unknown, refused for its kind, or not on this runtime)."""


def check_precision(kind: str, precision: str) -> None:
    """Raise :class:`PrecisionError` unless ``kind`` may encode in ``precision``."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "int8" and kind not in INT8_ADMITTED:
        why = INT8_REFUSED.get(kind, NOT_MEASURED)
        raise PrecisionError(f"int8 is not admitted for {kind} models ({why}); use precision fp32 for them")

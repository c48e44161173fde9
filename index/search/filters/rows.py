"""A parsed filter evaluated over the payload columns: a row mask (numpy, arrays in, arrays out) and the
:class:`Selection` a filtered search is given."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from densehybrid.index.search.filters.grammar import And, Eq, Exists, Filter, In, Not, Or
from densehybrid.index.storage.payload import Column, Payload


def _matches(column: Column, wanted: tuple) -> np.ndarray:
    """Rows whose value (any element, for a keyword list) is one of ``wanted``."""
    if column.kind == "keyword":
        return column.present & np.isin(column.data, column.code_of(wanted))
    if column.kind == "keyword_list":
        hit = np.isin(column.data, column.code_of(wanted))
        mask = np.zeros(len(column.present), dtype=bool)
        mask[column.element_rows()[hit]] = True
        return mask
    if column.kind == "integer":
        wanted = int64_only(wanted)
    return column.present & np.isin(column.data, np.array(wanted, dtype=column.data.dtype))


def int64_only(values: tuple) -> tuple:
    """The values an int64 column can hold: one beyond it (JSON integers have no size limit) equals no row."""
    info = np.iinfo(np.int64)
    return tuple(v for v in values if info.min <= v <= info.max)


def beyond_int64(bound: int) -> bool:
    info = np.iinfo(np.int64)
    return bound > info.max or bound < info.min


def integer_bound(op: str, bound: float) -> tuple[str, int]:
    """An integer column compared with a fractional bound: the same rows, compared with an integer."""
    if float(bound).is_integer():
        return op, int(bound)
    return {"gt": ("gte", math.ceil(bound)), "gte": ("gte", math.ceil(bound)),
            "lt": ("lte", math.floor(bound)), "lte": ("lte", math.floor(bound))}[op]


def _in_range(column: Column, bounds: tuple) -> np.ndarray:
    mask = column.present.copy()
    data = column.data
    for op, bound in bounds:
        if column.kind == "integer":
            op, bound = integer_bound(op, bound)
            if beyond_int64(bound):  # beyond every stored value
                mask &= (op in ("lt", "lte")) == (bound > 0)
                continue
        bound = data.dtype.type(bound)
        mask &= {"gt": data > bound, "gte": data >= bound, "lt": data < bound, "lte": data <= bound}[op]
    return mask


def evaluate(node: Filter, payload: Payload) -> np.ndarray:
    """(N,) bool: the rows of ``payload`` that ``node`` keeps."""
    if isinstance(node, (And, Or)):
        combine = np.logical_and if isinstance(node, And) else np.logical_or
        mask = evaluate(node.parts[0], payload).copy()
        for part in node.parts[1:]:
            combine(mask, evaluate(part, payload), out=mask)
        return mask
    if isinstance(node, Not):
        return ~evaluate(node.part, payload)
    column = payload.columns[node.field]
    if isinstance(node, Eq):
        return _matches(column, (node.value,))
    if isinstance(node, In):
        return _matches(column, node.values)
    if isinstance(node, Exists):
        return column.present.copy()
    return _in_range(column, node.bounds)


def row_mask(node: Filter, payload: Payload) -> np.ndarray:
    """:func:`evaluate`, cached per payload for repeated filters (read only)."""
    return payload.cached_mask(node, lambda: evaluate(node, payload))


# -- what a search is given ---------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """The rows a filtered search may return: a mask (local stores) and/or a Milvus expression, and their count."""

    count: int
    total: int
    mask: np.ndarray | None = None
    expression: str | None = None

    @property
    def everything(self) -> bool:
        return self.count == self.total

    @property
    def fraction(self) -> float:
        return self.count / self.total if self.total else 1.0


def select_rows(node: Filter, payload: Payload) -> Selection:
    mask = row_mask(node, payload)
    return Selection(int(np.count_nonzero(mask)), payload.count, mask=mask)


def rows_below(limit: int, total: int, within: Selection | None = None) -> Selection:
    """Rows ``0 .. limit - 1`` of ``total`` (of those ``within`` keeps, when given): a mask, and the same
    rows as a Milvus expression over the collection's primary key ``row``.

    A Milvus selection has no mask to count: its count is then at most ``min(limit, within.count)``.
    """
    expression = f"row < {limit}"
    if within is not None and within.expression is not None:
        expression = f"({within.expression}) and {expression}"
    mask = np.zeros(total, dtype=bool)
    mask[:max(0, limit)] = True
    if within is not None and within.mask is not None:
        mask &= within.mask
    elif within is not None:  # a Milvus filter: its rows are counted in Milvus, not here
        return Selection(min(limit, within.count), total, expression=expression)
    return Selection(int(np.count_nonzero(mask)), total, mask=mask, expression=expression)

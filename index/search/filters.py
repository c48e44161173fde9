"""Search filters over payload columns: parse and type-check, evaluate to a row mask, translate for Milvus.

Grammar (JSON)::

    {"field": F, "eq": V} | {"field": F, "in": [V, ...]} |
    {"field": F, "range": {"gt"|"gte"|"lt"|"lte": N, ...}} | {"field": F, "exists": true} |
    {"and": [...]} | {"or": [...]} | {"not": {...}}

On a keyword list, ``eq``/``in`` match when any element matches. A row without the field matches
no ``eq``/``in``/``range``/``exists`` (so ``not`` of one matches it). Parsed filters are trees of
frozen nodes (hashable: equal filters share a search group and a cached mask). Evaluation is numpy
over the columns, arrays in, arrays out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from densehybrid.index.storage.payload import Column, Payload

MAX_DEPTH = 8
MAX_NODES = 128
MAX_IN_VALUES = 1024
RANGE_OPS = ("gt", "gte", "lt", "lte")
_LEAF_KEYS = ("eq", "in", "range", "exists")


class FilterError(ValueError):
    """A filter that does not fit the index's fields; ``field`` names the field (or the filter part)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Eq:
    field: str
    value: object


@dataclass(frozen=True)
class In:
    field: str
    values: tuple


@dataclass(frozen=True)
class Range:
    field: str
    bounds: tuple  # ((op, number), ...) in RANGE_OPS order


@dataclass(frozen=True)
class Exists:
    field: str


@dataclass(frozen=True)
class And:
    parts: tuple


@dataclass(frozen=True)
class Or:
    parts: tuple


@dataclass(frozen=True)
class Not:
    part: object


Filter = Eq | In | Range | Exists | And | Or | Not


def check_size(raw, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Refuse a filter nested deeper than ``max_depth`` or with more than ``max_nodes`` parts, without
    recursion (run before anything walks it recursively)."""
    stack, nodes = [(raw, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > max_depth:
            raise FilterError("filter", f"filter nests deeper than {max_depth} levels")
        if nodes > max_nodes:
            raise FilterError("filter", f"filter has more than {max_nodes} parts")
        if isinstance(node, dict):
            for key in ("and", "or"):
                if isinstance(node.get(key), list):
                    stack.extend((part, depth + 1) for part in node[key])
            if "not" in node:
                stack.append((node["not"], depth + 1))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_leaf_value(name: str, kind: str, value, op: str):
    scalar = {"keyword": "keyword", "keyword_list": "keyword"}.get(kind, kind)
    if scalar == "keyword" and isinstance(value, str):
        return value
    if scalar == "bool" and isinstance(value, bool):
        return value
    if scalar == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if scalar == "integer" and _number(value) and float(value).is_integer():
        return int(value)
    if scalar == "float" and _number(value):
        return float(value)
    raise FilterError(name, f"filter: field {name!r} is {kind}; {op} got {json.dumps(value)}")


def parse(raw, schema: dict[str, str]) -> Filter:
    """A JSON filter -> its node tree, checked against ``schema`` ({field: type}); FilterError naming the field."""
    check_size(raw)
    return _parse(raw, schema)


def _parse(raw, schema: dict[str, str]) -> Filter:
    if not isinstance(raw, dict):
        raise FilterError("filter", f"filter: expected an object, got {json.dumps(raw)[:80]}")
    for key, node in (("and", And), ("or", Or)):
        if key in raw:
            parts = raw[key]
            if len(raw) != 1 or not isinstance(parts, list) or not parts:
                raise FilterError("filter", f"filter: {key!r} takes a non-empty list of filters and nothing beside it")
            return node(tuple(_parse(p, schema) for p in parts))
    if "not" in raw:
        if len(raw) != 1:
            raise FilterError("filter", "filter: 'not' takes one filter and nothing beside it")
        return Not(_parse(raw["not"], schema))
    name = raw.get("field")
    ops = [k for k in raw if k != "field"]
    if not isinstance(name, str) or len(ops) != 1 or ops[0] not in _LEAF_KEYS:
        raise FilterError("filter", "filter: expected {'field': F} with one of eq, in, range, exists; or and, or, not")
    if name not in schema:
        known = ", ".join(sorted(schema)) or "none"
        raise FilterError(name, f"filter: unknown field {name!r} (the index's fields: {known})")
    kind, op, value = schema[name], ops[0], raw[ops[0]]
    if op == "eq":
        return Eq(name, _check_leaf_value(name, kind, value, "eq"))
    if op == "in":
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_IN_VALUES:
            raise FilterError(name, f"filter: field {name!r}: 'in' takes a list of 1 to {MAX_IN_VALUES} values")
        return In(name, tuple(dict.fromkeys(_check_leaf_value(name, kind, v, "in") for v in value)))
    if op == "exists":
        if value is not True:
            raise FilterError(name, f"filter: field {name!r}: 'exists' takes true (use 'not' for absent)")
        return Exists(name)
    if kind not in ("integer", "float"):
        raise FilterError(name, f"filter: field {name!r} is {kind}; range needs an integer or float field")
    if not isinstance(value, dict) or not value or set(value) - set(RANGE_OPS):
        raise FilterError(name, f"filter: field {name!r}: range takes an object of gt, gte, lt, lte")
    for bound in value.values():
        if not _number(bound):
            raise FilterError(name, f"filter: field {name!r}: range bounds must be finite numbers, got {json.dumps(bound)}")
    return Range(name, tuple((op, value[op]) for op in RANGE_OPS if op in value))


# -- evaluation -----------------------------------------------------------------------------

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
        wanted = _int64_only(wanted)
    return column.present & np.isin(column.data, np.array(wanted, dtype=column.data.dtype))


def _int64_only(values: tuple) -> tuple:
    """The values an int64 column can hold: one beyond it (JSON integers have no size limit) equals no row."""
    info = np.iinfo(np.int64)
    return tuple(v for v in values if info.min <= v <= info.max)


def _beyond_int64(bound: int) -> bool:
    info = np.iinfo(np.int64)
    return bound > info.max or bound < info.min


def _integer_bound(op: str, bound: float) -> tuple[str, int]:
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
            op, bound = _integer_bound(op, bound)
            if _beyond_int64(bound):  # beyond every stored value
                mask &= (op in ("lt", "lte")) == (bound > 0)
                continue
        bound = data.dtype.type(bound)
        mask &= {"gt": data > bound, "gte": data >= bound, "lt": data < bound, "lte": data <= bound}[op]
    return mask


def evaluate(node: Filter, payload: Payload) -> np.ndarray:
    """(N,) bool: the rows of ``payload`` that ``node`` keeps."""
    if isinstance(node, And):
        mask = evaluate(node.parts[0], payload).copy()
        for part in node.parts[1:]:
            mask &= evaluate(part, payload)
        return mask
    if isinstance(node, Or):
        mask = evaluate(node.parts[0], payload).copy()
        for part in node.parts[1:]:
            mask |= evaluate(part, payload)
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


# -- Milvus -------------------------------------------------------------------------------

def milvus_field(name: str) -> str:
    """The scalar field of payload field ``name`` in a collection (apart from row, doc_id, ...)."""
    return f"f_{name}"


def milvus_present(name: str) -> str:
    return f"has_{name}"


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def to_milvus(node: Filter, schema: dict[str, str]) -> str:
    """The Milvus boolean expression of ``node`` over the exported scalar fields."""
    if isinstance(node, (And, Or)):
        joiner = " and " if isinstance(node, And) else " or "
        return "(" + joiner.join(to_milvus(p, schema) for p in node.parts) + ")"
    if isinstance(node, Not):
        return f"(not {to_milvus(node.part, schema)})"
    name, kind = node.field, schema[node.field]
    column, present = milvus_field(name), milvus_present(name)
    if isinstance(node, Exists):
        return f"({present} == true)"
    nothing = f"({present} == true and {present} == false)"
    if isinstance(node, (Eq, In)):
        values = (node.value,) if isinstance(node, Eq) else node.values
        if kind == "integer":
            values = _int64_only(values)
            if not values:
                return nothing
        listed = "[" + ", ".join(_literal(v) for v in values) + "]"
        if kind == "keyword_list":
            return f"({present} == true and array_contains_any({column}, {listed}))"
        return f"({present} == true and {column} in {listed})"
    ops = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
    bounds = [_integer_bound(op, b) if kind == "integer" else (op, float(b)) for op, b in node.bounds]
    if kind == "integer":
        if any(_beyond_int64(b) and (op in ("lt", "lte")) != (b > 0) for op, b in bounds):
            return nothing
        bounds = [(op, b) for op, b in bounds if not _beyond_int64(b)]  # the others hold for every row
    parts = [f"{present} == true"] + [f"{column} {ops[op]} {_literal(bound)}" for op, bound in bounds]
    return "(" + " and ".join(parts) + ")"

"""The filter grammar: a JSON filter parsed and type-checked against the index's fields into frozen nodes.

Grammar (JSON)::

    {"field": F, "eq": V} | {"field": F, "in": [V, ...]} |
    {"field": F, "range": {"gt"|"gte"|"lt"|"lte": N, ...}} | {"field": F, "exists": true} |
    {"and": [...]} | {"or": [...]} | {"not": {...}}

On a keyword list, ``eq``/``in`` match when any element matches. A row without the field matches
no ``eq``/``in``/``range``/``exists`` (so ``not`` of one matches it). Parsed filters are trees of
frozen nodes (hashable: equal filters share a search group and a cached mask).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from densehybrid.index.storage.payload import MAX_KEYWORD_CHARS

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


def unknown_field(name: str, known) -> str:
    """What a request naming a field the index lacks is told (in a filter, or in ``fields``)."""
    return f"unknown field {name!r} (the index's fields: {', '.join(sorted(known)) or 'none'})"


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
        if len(value) > MAX_KEYWORD_CHARS:  # longer than any stored keyword
            raise FilterError(name, f"filter: field {name!r}: a keyword of {len(value)} characters "
                                    f"(at most {MAX_KEYWORD_CHARS})")
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
        raise FilterError(name, f"filter: {unknown_field(name, schema)}")
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

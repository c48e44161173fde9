"""A parsed filter as a Milvus boolean expression over a collection's exported scalar fields: it keeps the
same rows as :func:`~densehybrid.index.search.filters.rows.evaluate` over the payload."""

from __future__ import annotations

import json

from densehybrid.index.search.filters.grammar import And, Eq, Exists, Filter, In, Not, Or
from densehybrid.index.search.filters.rows import beyond_int64, int64_only, integer_bound


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
            values = int64_only(values)
            if not values:
                return nothing
        listed = "[" + ", ".join(_literal(v) for v in values) + "]"
        if kind == "keyword_list":
            return f"({present} == true and array_contains_any({column}, {listed}))"
        return f"({present} == true and {column} in {listed})"
    ops = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
    bounds = [integer_bound(op, b) if kind == "integer" else (op, float(b)) for op, b in node.bounds]
    if kind == "integer":
        if any(beyond_int64(b) and (op in ("lt", "lte")) != (b > 0) for op, b in bounds):
            return nothing
        bounds = [(op, b) for op, b in bounds if not beyond_int64(b)]  # the others hold for every row
    parts = [f"{present} == true"] + [f"{column} {ops[op]} {_literal(bound)}" for op, bound in bounds]
    return "(" + " and ".join(parts) + ")"

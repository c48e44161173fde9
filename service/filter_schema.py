"""The ``filter`` and ``fields`` of the request bodies, as models made for the served index's fields.

The OpenAPI document then states exactly what fits: each leaf names one of the index's fields and
takes a value of that field's type (``range`` only on numbers), ``fields`` lists field names, and a
written document's ``fields`` is an object of those fields. The filter models only state the schema:
a request's filter is validated once, by ``index.search.filters.parse`` (which bounds size and depth before
it recurses, and names an unknown or mistyped field), and the request holds the parsed node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, PlainValidator,
                      Strict, StringConstraints, Tag, create_model)

from pydantic_core import PydanticCustomError

from densehybrid.index.search import filters

from densehybrid.index.storage import payload
from densehybrid.service.json_types import json_number

Keyword = Annotated[str, Strict(), StringConstraints(max_length=payload.MAX_KEYWORD_CHARS)]
Integer = Annotated[int, BeforeValidator(json_number)]
Number = Annotated[float, AllowInfNan(False), BeforeValidator(json_number)]
Bool = Annotated[bool, Strict()]
Bound = Union[Annotated[int, Strict()], Number]
# what a leaf compares with, and what a written document holds, by field type
_VALUE = {"keyword": Keyword, "keyword_list": Keyword, "integer": Integer, "float": Number, "bool": Bool}
_STORED = {**_VALUE, "keyword_list": Annotated[list[Keyword], Field(max_length=payload.MAX_LIST_ITEMS)]}

_EXAMPLE_VALUES = {"keyword": "function", "keyword_list": "beta", "integer": 2024, "float": 0.5, "bool": True}


def document_example(field_types: dict[str, str]) -> dict:
    """A written document's ``fields`` with a value of each field's type."""
    return {n: [_EXAMPLE_VALUES[k]] if k == "keyword_list" else _EXAMPLE_VALUES[k] for n, k in field_types.items()}


def examples(field_types: dict[str, str]) -> list[dict]:
    """Filters over the index's own fields, one per shape the grammar has (none for an index without fields)."""
    if not field_types:
        return []
    (first, kind), *rest = field_types.items()
    value = _EXAMPLE_VALUES[kind]
    out = [{"field": first, "eq": value}, {"field": first, "in": [value]},
           {"not": {"field": first, "exists": True}}]
    numeric = next((n for n, k in field_types.items() if k in ("integer", "float")), None)
    if numeric is not None:
        out.append({"field": numeric, "range": {"gte": 0, "lt": 100}})
    if rest:
        second, second_kind = rest[0]
        out.append({"and": [{"field": first, "eq": value},
                            {"or": [{"field": second, "exists": True},
                                    {"not": {"field": second, "eq": _EXAMPLE_VALUES[second_kind]}}]}]})
    return out

DESCRIPTION = (
    "keep only documents whose fields match, applied before the top-k (exact: the hits are the best k of the "
    "matching documents). Leaves: eq, in, range (gt, gte, lt, lte; integer and float fields), exists; combine "
    "with and, or, not. On a keyword-list field, eq and in match when any element matches. A document without "
    "the field matches no leaf. /info lists the index's fields and types; an unknown field or a value of "
    f"another type is a 422 naming the field. At most {filters.MAX_DEPTH} levels and {filters.MAX_NODES} parts.")


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filter_tag: ClassVar[str | None] = None  # the shape of every filter object of a model: and, or, not, op:field


class RangeBounds(_Node):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    # no null: a bound is a number or left out
    gt: Bound = Field(None, json_schema_extra=lambda s: s.pop("default", None))
    gte: Bound = Field(None, json_schema_extra=lambda s: s.pop("default", None))
    lt: Bound = Field(None, json_schema_extra=lambda s: s.pop("default", None))
    lte: Bound = Field(None, json_schema_extra=lambda s: s.pop("default", None))


_LEAF_OPS = ("eq", "in", "range", "exists")


def _tag(value) -> str | None:
    """The shape of a filter object: and/or/not, or ``op:field`` for a leaf (one error per bad object)."""
    if isinstance(value, dict):
        for key in ("and", "or", "not"):
            if key in value:
                return key
        op = next((key for key in _LEAF_OPS if key in value), None)
        return None if op is None else f"{op}:{value.get('field')}"
    return value.filter_tag if isinstance(value, _Node) else None


def _leaves(name: str, kind: str) -> list[tuple[str, type[BaseModel]]]:
    """The leaf models of one field (class names must be unique in the OpenAPI document: the field is in them)."""
    named = (Literal[name], ...)
    value = _VALUE[kind]
    models = [("eq", create_model(f"Eq_{name}", __base__=_Node, field=named, eq=(value, ...))),
              ("in", create_model(f"In_{name}", __base__=_Node, field=named,
                                  in_=(list[value], Field(alias="in", min_length=1, max_length=filters.MAX_IN_VALUES)))),
              ("exists", create_model(f"Exists_{name}", __base__=_Node, field=named, exists=(Literal[True], ...)))]
    if kind in ("integer", "float"):
        models.append(("range", create_model(f"Range_{name}", __base__=_Node, field=named, range=(RangeBounds, ...))))
    for op, model in models:
        model.filter_tag = f"{op}:{name}"
    return models


def _filter_type(field_types: dict[str, str]):
    """The recursive filter union for an index with these fields."""
    leaves = [model for name, kind in field_types.items() for _, model in _leaves(name, kind)]
    and_ = create_model("AndFilter", __base__=_Node,
                        and_=(list["SearchFilter"], Field(alias="and", min_length=1, max_length=filters.MAX_NODES)))
    or_ = create_model("OrFilter", __base__=_Node,
                       or_=(list["SearchFilter"], Field(alias="or", min_length=1, max_length=filters.MAX_NODES)))
    not_ = create_model("NotFilter", __base__=_Node, not_=("SearchFilter", Field(alias="not")))
    combinators = {"and": and_, "or": or_, "not": not_}
    for tag, model in combinators.items():
        model.filter_tag = tag
    choices = [Annotated[model, Tag(model.filter_tag)] for model in [*combinators.values(), *leaves]]
    # a tagged union: its schema is a oneOf (exactly one shape fits), not an anyOf
    union = Annotated[Union[tuple(choices)], Discriminator(_tag)]
    for model in combinators.values():
        model.model_rebuild(_types_namespace={"SearchFilter": union})
    return union


def parsed_filter(field_types: dict[str, str], schema):
    """The ``filter`` type: validated once by the grammar against the index's fields, held as the parsed
    node (``index.search.filters``); ``schema`` is what the OpenAPI document shows."""
    def parse(value):
        if value is None:
            return None
        try:
            return filters.parse(value, field_types)
        except filters.FilterError as exc:
            raise PydanticCustomError("invalid_filter", str(exc).removeprefix("filter: ")) from None
    return Annotated[Any, PlainValidator(parse, json_schema_input_type=schema)]


def known_names(field_types: dict[str, str]):
    """A before-validator for ``fields: [...]``: an unknown name is refused naming it."""
    def check(value):
        if isinstance(value, list):
            unknown = [n for n in value if isinstance(n, str) and n not in field_types]
            if unknown:
                raise PydanticCustomError("unknown_field", filters.unknown_field(unknown[0], field_types))
        return value
    return check


def _document_fields(field_types: dict[str, str]) -> type[BaseModel]:
    """A written document's ``fields``: the index's fields, each of its type (null or left out: none)."""
    # python names apart from the JSON names: a field may be called "json" or "copy"
    definitions = {f"field_{i}": (_STORED[kind] | None, Field(None, alias=name))
                   for i, (name, kind) in enumerate(field_types.items())}
    return create_model("DocumentFields", __base__=_Node, **definitions)


@dataclass(frozen=True)
class FieldModels:
    """What the request models take for filters and fields on one index."""

    filter: Any  # the filter type, null included (an index without fields: only null)
    names: Any  # the item type of ``fields: [...]``
    max_names: int
    document_fields: type[BaseModel]


def field_models(field_types: dict[str, str] | None) -> FieldModels:
    field_types = dict(field_types or {})
    if not field_types:
        # nothing to filter on or return: no filter fits, and ``fields`` can only be empty
        return FieldModels(parsed_filter({}, None), Annotated[str, StringConstraints(max_length=64)], 0,
                           _document_fields({}))
    return FieldModels(parsed_filter(field_types, Optional[_filter_type(field_types)]), Literal[tuple(field_types)],
                       len(field_types), _document_fields(field_types))

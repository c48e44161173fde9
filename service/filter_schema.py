"""The ``filter`` of ``/search`` as request models: the grammar's shapes, with examples for the OpenAPI document.

The models check the shape only; whether the fields exist and the values fit their types is the
index's to say (``index.filters.parse``, a 422 naming the field). The size is bounded before the
nested models are validated, so no filter recurses without limit.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import AllowInfNan, BaseModel, ConfigDict, Discriminator, Field, Strict, StringConstraints, Tag

from densehybrid.index import filters

FieldName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
# JSON's own types, kept apart (true is not 1, 1 is not "1"): the field's type decides what fits
Value = Union[Annotated[bool, Strict()], Annotated[int, Strict()], Annotated[float, Strict(), AllowInfNan(False)],
              Annotated[str, Strict(), StringConstraints(max_length=1024)]]
Bound = Union[Annotated[int, Strict()], Annotated[float, Strict(), AllowInfNan(False)]]

EXAMPLES = [
    {"field": "kind", "eq": "function"},
    {"field": "module", "in": ["json", "csv"]},
    {"and": [{"field": "kind", "eq": "class"}, {"not": {"field": "module", "eq": "typing"}}]},
    {"field": "year", "range": {"gte": 2020, "lt": 2024}},
    {"or": [{"field": "tags", "eq": "beta"}, {"not": {"field": "tags", "exists": True}}]},
]
DESCRIPTION = (
    "keep only documents whose fields match, applied before the top-k (exact: the hits are the best k of the "
    "matching documents). Leaves: eq, in, range (gt, gte, lt, lte; integer and float fields), exists; combine "
    "with and, or, not. On a keyword-list field, eq and in match when any element matches. A document without "
    "the field matches no leaf. /info lists the index's fields and types; an unknown field or a value of "
    f"another type is a 422 naming the field. At most {filters.MAX_DEPTH} levels and {filters.MAX_NODES} parts.")


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EqFilter(_Node):
    field: FieldName
    eq: Value


class InFilter(_Node):
    field: FieldName
    in_: list[Value] = Field(alias="in", min_length=1, max_length=filters.MAX_IN_VALUES)


class RangeBounds(_Node):
    gt: Bound | None = None
    gte: Bound | None = None
    lt: Bound | None = None
    lte: Bound | None = None


class RangeFilter(_Node):
    field: FieldName
    range: RangeBounds


class ExistsFilter(_Node):
    field: FieldName
    exists: Literal[True]


class AndFilter(_Node):
    and_: list[SearchFilter] = Field(alias="and", min_length=1, max_length=filters.MAX_NODES)


class OrFilter(_Node):
    or_: list[SearchFilter] = Field(alias="or", min_length=1, max_length=filters.MAX_NODES)


class NotFilter(_Node):
    not_: SearchFilter = Field(alias="not")


_KEYS = ("and", "or", "not", "eq", "in", "range", "exists")
_TAGS = {AndFilter: "and", OrFilter: "or", NotFilter: "not", EqFilter: "eq", InFilter: "in", RangeFilter: "range",
         ExistsFilter: "exists"}


def _kind(value) -> str | None:
    """Which shape a filter object has, by the key that names it (one error per bad object, not seven)."""
    if isinstance(value, dict):
        return next((key for key in _KEYS if key in value), None)
    return _TAGS.get(type(value))


SearchFilter = Annotated[
    Union[Annotated[AndFilter, Tag("and")], Annotated[OrFilter, Tag("or")], Annotated[NotFilter, Tag("not")],
          Annotated[EqFilter, Tag("eq")], Annotated[InFilter, Tag("in")], Annotated[RangeFilter, Tag("range")],
          Annotated[ExistsFilter, Tag("exists")]],
    Discriminator(_kind, custom_error_type="filter_shape",
                  custom_error_message="a filter is an object with one of and, or, not, eq, in, range, exists")]

for _model in (AndFilter, OrFilter, NotFilter):
    _model.model_rebuild()


def check_filter_size(value):
    """Before the nested models validate: refuse a filter too deep or too large (a 422, no recursion)."""
    if value is not None:
        filters.check_size(value)
    return value


def as_json(flt: BaseModel) -> dict:
    """The request's filter as the grammar's JSON (what ``index.filters.parse`` reads)."""
    return flt.model_dump(by_alias=True, exclude_none=True)

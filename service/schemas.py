"""Request bodies of the HTTP API (the response bodies are in ``service.responses``).

Limits live in field constraints. The request models depend on configured
limits (max k, max batch), so :func:`request_models` builds them for one
:class:`~service.settings.Limits`; the OpenAPI schema then shows the real
bounds. Unknown fields are rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Le
from pydantic import (AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict, StringConstraints, field_validator,
                      model_validator)

from densehybrid.encoder.choices import Role
from densehybrid.index.fusion import FusionMethod
from densehybrid.service import filter_schema
from densehybrid.service.settings import Limits

# A text must contain something besides whitespace; over-long texts are truncated, not rejected.
# The class spells out the union of what Python, Rust (pydantic-core) and ECMAScript (OpenAPI
# clients) call whitespace, so that every engine agrees on which texts are blank.
WHITESPACE = r"\t-\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
Text = Annotated[str, StringConstraints(min_length=1, pattern=f"[^{WHITESPACE}]")]
DocId = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def _json_number(value):
    # JSON's numbers only: 3.0 is an integer in JSON Schema, but true and "3" are not numbers
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_number)]
JsonFloat = Annotated[float, BeforeValidator(_json_number)]
PositiveInt = Annotated[int, Ge(1), BeforeValidator(_json_number)]  # constraint first: it reaches the JSON schema
JsonBool = Annotated[bool, Strict()]
Lambda = Annotated[float, Ge(0), Le(1e4), AllowInfNan(False), BeforeValidator(_json_number)]  # constraints first: they reach the JSON schema
FirstStage = Literal["ip", "approx_gip"]
# index.fusion.FUSION_METHODS, spelled out for the schema


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(value):
    """JSON may escape a lone UTF-16 surrogate ("\\ud800"), which no UTF-8 text holds: each becomes U+FFFD.

    Walks strings inside lists and objects, keys included; other values are returned as they are."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {replace_lone_surrogates(key): replace_lone_surrogates(item) for key, item in value.items()}
    return value


class RequestBody(BaseModel):
    """Base of every request body: any JSON string is accepted, lone surrogates replaced (a JSON Schema
    string allows them, and pydantic's strings cannot hold them)."""

    @model_validator(mode="before")
    @classmethod
    def _replace_lone_surrogates(cls, data):
        return replace_lone_surrogates(data)


class _Strict(RequestBody):
    model_config = ConfigDict(extra="forbid")


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


@dataclass(frozen=True)
class RequestModels:
    search: type[BaseModel]
    encode: type[BaseModel]
    explain: type[BaseModel]


def request_models(limits: Limits, field_types: dict[str, str] | None = None) -> RequestModels:
    """The three request bodies with the given limits in their constraints (and the index's payload fields)."""
    fields_of = filter_schema.field_models(field_types)
    Texts = Annotated[list[Text], Field(min_length=1, max_length=limits.max_request_texts)]

    class SearchRequest(_Strict):
        """One ``query`` or a batch of ``queries`` (exactly one of the two)."""

        # exactly one of query/queries, stated in the schema too; neither accepts null
        model_config = ConfigDict(extra="forbid", title="SearchRequest", json_schema_extra={
            "oneOf": [{"required": ["query"]}, {"required": ["queries"]}]})
        query: Text = Field(None, description="a single query; the response's `results` is a list of hits",
                            json_schema_extra=_no_default)
        queries: Texts = Field(None, description="a batch of queries; `results` is a list of hit lists",
                               json_schema_extra=_no_default)
        k: JsonInt = Field(10, ge=1, le=limits.max_k, description="hits per query (fewer if the index is smaller)")
        first_stage: FirstStage = Field("ip", description="ip: Faiss inner product; approx_gip: gated, dims above theta")
        candidates: JsonInt = Field(1000, ge=1, le=limits.max_candidates, description="first-stage depth K1 (raised to k)")
        theta: JsonFloat = Field(0.1, ge=0, le=1e6, allow_inf_nan=False, description="approx_gip query threshold")
        rerank: JsonBool = Field(True, description="exact GIP rerank of the candidates (kinds with gates)")
        lam: Lambda | None = Field(None, alias="lambda",
                                  description="weight of the query's dense part; default: the index's")
        fusion: FusionMethod | None = Field(
            None, description="dhr/fusion: how the lexical and dense parts mix (zscore, minmax: normalised per query "
                              "over candidates taken from each part; adaptive: zscore with a per-query weight from "
                              "each part's score distribution; lambda: raw sum; lexical, dense: one part alone); default: the "
                              "index's, or lambda when `lambda` is given")
        return_text: JsonBool = Field(False, description="include each hit's title and text")
        explain: JsonBool = Field(False, description="include each hit's matched terms and score split")
        filter: fields_of.filter | None = Field(
            None, description=filter_schema.DESCRIPTION,
            json_schema_extra={"examples": filter_schema.examples(field_types or {})} if field_types else None)
        fields: Annotated[list[fields_of.names], Field(max_length=fields_of.max_names)] | None = Field(
            None, description="payload fields to return with each hit, as `fields: {name: value}` (absent "
                              "values left out); /info lists them", examples=[list(field_types or {})[:2]])

        _bounded_filter = field_validator("filter", mode="before")(filter_schema.prechecked(field_types or {}))
        _known_fields = field_validator("fields", mode="before")(filter_schema.known_names(field_types or {}))

        @model_validator(mode="after")
        def _one_of_query_or_queries(self):
            if (self.query is None) == (self.queries is None):
                raise ValueError("give exactly one of 'query' or 'queries'")
            return self

    class EncodeRequest(_Strict):
        model_config = ConfigDict(extra="forbid", title="EncodeRequest")
        texts: Texts = Field(description="texts to encode; over-long texts are truncated to the role's max length")
        role: Role = Field("query", description="'query' (the default) or 'passage': which encoder side and max "
                                                "length; encode with 'passage' to get vectors as the index stores them")

    class ExplainRequest(_Strict):
        model_config = ConfigDict(extra="forbid", title="ExplainRequest")
        query: Text
        id: DocId = Field(description="document id in the index")
        lam: Lambda | None = Field(None, alias="lambda", description="weight of the query's dense part")

    return RequestModels(SearchRequest, EncodeRequest, ExplainRequest)


def documents_request_model(limits: Limits, field_types: dict[str, str] | None = None) -> type[BaseModel]:
    """The body of ``POST /documents`` with the configured batch and length limits (over them: 413), and the
    index's payload fields."""
    DocumentFields = filter_schema.field_models(field_types).document_fields
    Chars = Annotated[str, StringConstraints(max_length=limits.max_document_chars)]

    class NewDocument(_Strict):
        model_config = ConfigDict(extra="forbid", title="NewDocument")
        id: DocId
        title: Chars = Field("", description="optional title, encoded before the text")
        text: Annotated[Chars, StringConstraints(min_length=1, pattern=f"[^{WHITESPACE}]")]
        fields: DocumentFields | None = Field(
            None, description="payload field values, of the index's fields and types (/info); searches filter on "
                              "them as on the built ones", examples=[filter_schema.document_example(field_types or {})])

    class DocumentsRequest(_Strict):
        model_config = ConfigDict(extra="forbid", title="DocumentsRequest")
        documents: list[NewDocument] = Field(min_length=1, max_length=limits.max_write_documents,
                                             description="documents to add; an existing id is replaced, and an id "
                                                         "given twice in one request keeps its last document")

        @model_validator(mode="after")
        def _last_of_each_id(self):
            # the same rule as across requests (a later write replaces), so JSON Schema's view holds
            self.documents = list({doc.id: doc for doc in self.documents}.values())
            return self

    return DocumentsRequest


# -- responses ---------------------------------------------------------------

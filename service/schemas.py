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

from annotated_types import Ge, Gt, Le
from pydantic_core import PydanticCustomError
from pydantic import (AfterValidator, AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict,
                      StringConstraints, WithJsonSchema, field_validator, model_validator)

from densehybrid.encoder.choices import Direction, Role
from densehybrid.encoder.prompts import PASSAGE_NAME, Prompts
from densehybrid.index.search.fusion import DEFAULT_RRF_K, FusionMethod
from densehybrid.service import filter_schema
from densehybrid.service.json_types import json_number
from densehybrid.service.settings import Limits

# A text must contain something besides whitespace; over-long texts are truncated, not rejected.
# The class spells out the union of what Python, Rust (pydantic-core) and ECMAScript (OpenAPI
# clients) call whitespace, so that every engine agrees on which texts are blank.
WHITESPACE = r"\t-\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
Text = Annotated[str, StringConstraints(min_length=1, pattern=f"[^{WHITESPACE}]")]
DocId = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


JsonInt = Annotated[int, BeforeValidator(json_number)]
JsonFloat = Annotated[float, BeforeValidator(json_number)]
PositiveInt = Annotated[int, Ge(1), BeforeValidator(json_number)]  # constraint first: it reaches the JSON schema
JsonBool = Annotated[bool, Strict()]
Lambda = Annotated[float, Ge(0), Le(1e4), AllowInfNan(False), BeforeValidator(json_number)]  # constraints first: they reach the JSON schema
RrfK = Annotated[int, Ge(0), Le(1_000_000), BeforeValidator(json_number)]  # constraints first: they reach the JSON schema
FirstStage = Literal["ip", "approx_gip"]
# index.fusion.FUSION_METHODS, spelled out for the schema


# truncation and prompts: the same fields on every route that encodes
TRUNCATE_HELP = ("cut a text over the role's max length (prompt and special tokens included) to it; false: such a "
                 "text gets 413 naming its token count and the limit; default: the server's auto_truncate")
DIRECTION_HELP = "which end truncation cuts: right keeps the first tokens, left the last ([CLS]/[SEP] stay in place)"
PROMPT_NAME_HELP = ("a prompt of the index (GET /info lists them) to put before each text; default: the role's "
                    "prompt. Passages only take the 'passage' prompt; an unknown name is 422")
SEARCH_PROMPT_HELP = ("must be the index's query prompt name when given (searches always use it; any other is 422); "
                      "GET /info lists the prompts")


def prompt_name_type(names, what: str = "prompts"):
    """``prompt_name``'s type for the served prompts: one of ``names`` or null (only null without any); the
    schema lists the names a request may send, and the error names the one it sent."""
    names = list(names)

    def known(value):
        if value is not None and value not in names:
            listed = ", ".join(repr(n) for n in names) or "none"
            raise PydanticCustomError("unknown_prompt", "{value} is not one of the {what} served here ({listed}); "
                                      "GET /info lists them", {"value": repr(value), "what": what, "listed": listed})
        return value

    enum = {"anyOf": [{"type": "string", "enum": names}, {"type": "null"}]} if names else {"type": "null"}
    return Annotated[str | None, AfterValidator(known), WithJsonSchema(enum)]


def passage_prompt_rule(prompts: Prompts, role_field: str) -> dict:
    """JSON Schema: when ``role_field`` is "passage", ``prompt_name`` may only name the passage prompt."""
    if not prompts:
        return {}
    allowed = [PASSAGE_NAME] if PASSAGE_NAME in prompts.prompts else []
    return {"if": {"properties": {role_field: {"const": "passage"}}, "required": [role_field]},
            "then": {"properties": {"prompt_name": {"enum": [*allowed, None]}}}}


def truncate_field():
    return Field(None, description=TRUNCATE_HELP, examples=[True])


def direction_field():
    return Field("right", description=DIRECTION_HELP, examples=["left"])


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


class StrictBody(RequestBody):
    """A request body that refuses unknown fields."""

    model_config = ConfigDict(extra="forbid")


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


@dataclass(frozen=True)
class RequestModels:
    search: type[BaseModel]
    encode: type[BaseModel]
    explain: type[BaseModel]


def request_models(limits: Limits, prompts: Prompts = Prompts(),
                   field_types: dict[str, str] | None = None) -> RequestModels:
    """The three request bodies with the given limits in their constraints, the served prompts' names and
    the index's payload fields."""
    fields_of = filter_schema.field_models(field_types)
    Texts = Annotated[list[Text], Field(min_length=1, max_length=limits.max_request_texts)]
    PromptName = prompt_name_type(list(prompts.prompts))
    SearchPromptName = prompt_name_type([prompts.query_name] if prompts.query_name else [], "query prompts")

    class SearchRequest(StrictBody):
        """One ``query`` or a batch of ``queries`` (exactly one of the two)."""

        # exactly one of query/queries, stated in the schema too; neither accepts null
        model_config = ConfigDict(extra="forbid", title="SearchRequest", json_schema_extra={
            "oneOf": [{"required": ["query"]}, {"required": ["queries"]}],
            "examples": [{"query": "what is a dense retriever", "k": 10},
                         {"query": "a long question whose point comes last ...", "truncation_direction": "left"},
                         {"queries": ["sort a list", "open a file"], "k": 3, "truncate": False}]})
        query: Text = Field(None, description="a single query; the response's `results` is a list of hits",
                            json_schema_extra=_no_default)
        queries: Texts = Field(None, description="a batch of queries; `results` is a list of hit lists",
                               json_schema_extra=_no_default)
        k: JsonInt = Field(10, ge=1, le=limits.max_k, description="hits per query (fewer if the index is smaller)")
        offset: JsonInt = Field(
            0, ge=0, le=limits.max_k - 1, examples=[0, 10],
            description=f"hits to skip before the first returned (pagination): the response holds hits offset+1 to "
                        f"offset+k of one order (score descending, then index row ascending), and ranks count from "
                        f"offset+1. offset + k must not exceed max_k ({limits.max_k}). Pages of one query agree "
                        f"(offset 0, k 20 = offset 0, k 10 then offset 10, k 10) when they use the same "
                        f"`candidates` and it is at least the deepest page's offset + k")
        first_stage: FirstStage = Field("ip", description="ip: Faiss inner product; approx_gip: gated, dims above theta")
        candidates: JsonInt = Field(1000, ge=1, le=limits.max_candidates, description="first-stage depth K1 (raised to k)")
        # the bounds inside the type, before the validator: on an optional field that is how they reach the schema
        ef_search: Annotated[int, Ge(1), Le(limits.max_ef_search), BeforeValidator(json_number)] | None = Field(
            None, examples=[64, 256],
            description="an hnsw first stage: candidates the graph walk keeps per query (larger: slower, closer to "
                        "the exact top-k; raised to the first-stage depth); default: the index's; an exact first "
                        "stage ignores it. /info and each answer's `index` block name the first stage")
        nprobe: Annotated[int, Ge(1), Le(limits.max_nprobe), BeforeValidator(json_number)] | None = Field(
            None, examples=[8, 64],
            description="a Milvus IVF collection: inverted lists scanned per query (larger: slower, closer to the exact "
                        "top-k); default: the index's; other first stages ignore it. /info and each answer's "
                        "`index` block name the first stage")
        margin: Annotated[float, Ge(0), Le(10), BeforeValidator(json_number)] | None = Field(
            None, examples=[0.06, 0.1],
            description="a pqscan first stage: candidates whose product-code score is within margin x |query| of "
                        "the k-th best are scored again exactly (larger: slower, closer to the exact top-k; a "
                        "query far from the corpus gets more of them); default: the index's, calibrated at "
                        "build; other first stages ignore it")
        rescore: Annotated[int, Ge(1), Le(limits.max_rescore), BeforeValidator(json_number)] | None = Field(
            None, examples=[50, 300],
            description="a pqscan first stage: the least candidates of the product-code scan scored again exactly "
                        "per query, whatever the margin (with margin 0, exactly this many); default: the index's; "
                        "other first stages ignore it")
        recall: Annotated[float, Gt(0), Le(1), BeforeValidator(json_number)] | None = Field(
            None, examples=[0.95, 0.99],
            description="an approximate first stage: the recall@10 (share of the exact top 10 found) to keep, "
                        "instead of a breadth: the search uses the cheapest breadth whose recall the index's "
                        "build measured at or above it (or the best it measured); each answer's "
                        "`index.first_stage` names the breadth used and that recall. A breadth of the index's "
                        "first stage given too (ef_search, nprobe or margin) wins. An exact first stage keeps "
                        "any recall")
        theta: JsonFloat = Field(0.1, ge=0, le=1e6, allow_inf_nan=False, description="approx_gip query threshold")
        rerank: JsonBool = Field(True, description="exact GIP rerank of the candidates (kinds with gates)")
        lam: Lambda | None = Field(None, alias="lambda",
                                  description="weight of the query's dense part; default: the index's")
        fusion: FusionMethod | None = Field(
            None, description="dhr/fusion: how the lexical and dense parts mix (auto: the mix the index chose from "
                              "its corpus at build, see GET /info; zscore, minmax: normalised per query "
                              "over candidates taken from each part; adaptive: zscore with a per-query weight from "
                              "each part's score distribution; rrf: reciprocal-rank fusion, 1/(rrf_k + rank in the "
                              "lexical part) + 1/(rrf_k + rank in the dense part) over the same candidates; lambda: raw "
                              "sum; lexical, dense: one part alone); default: the index's, or lambda when `lambda` is "
                              "given", examples=["rrf", "zscore"])
        rrf_k: RrfK | None = Field(
            None, examples=[DEFAULT_RRF_K],
            description=f"the constant k of fusion=rrf (larger: the parts' lower ranks count more); default: the "
                        f"index's ({DEFAULT_RRF_K} unless it records another)")
        return_text: JsonBool = Field(False, description="include each hit's title and text")
        explain: JsonBool = Field(False, description="include each hit's matched terms and score split")
        truncate: JsonBool | None = truncate_field()
        truncation_direction: Direction = direction_field()
        prompt_name: SearchPromptName = Field(None, description=SEARCH_PROMPT_HELP)
        filter: fields_of.filter = Field(
            None, description=filter_schema.DESCRIPTION,
            json_schema_extra={"examples": filter_schema.examples(field_types or {})} if field_types else None)
        fields: Annotated[list[fields_of.names], Field(max_length=fields_of.max_names)] | None = Field(
            None, description="payload fields to return with each hit, as `fields: {name: value}` (absent "
                              "values left out); /info lists them", examples=[list(field_types or {})[:2]])

        _known_fields = field_validator("fields", mode="before")(filter_schema.known_names(field_types or {}))

        @model_validator(mode="after")
        def _one_of_query_or_queries(self):
            if (self.query is None) == (self.queries is None):
                raise ValueError("give exactly one of 'query' or 'queries'")
            return self

        @model_validator(mode="after")
        def _page_within_max_k(self):
            # the one bound of a page JSON Schema cannot state: a sum of two fields
            if self.offset + self.k > limits.max_k:
                raise PydanticCustomError("page_over_max_k", "offset + k = {total} exceeds max_k = {max_k}; lower "
                                          "offset or k", {"total": self.offset + self.k, "max_k": limits.max_k})
            return self

    class EncodeRequest(StrictBody):
        model_config = ConfigDict(extra="forbid", title="EncodeRequest", json_schema_extra={"examples": [
            {"texts": ["what is a dense retriever"], "role": "query"},
            {"texts": ["a very long passage ..."], "role": "passage", "truncate": True, "truncation_direction": "left"},
            {"texts": ["how do I sort a list"], "truncate": False}], **passage_prompt_rule(prompts, "role")})
        texts: Texts = Field(description="texts to encode; over-long ones are cut to the role's max length unless "
                                         "truncate is false")
        role: Role = Field("query", description="'query' (the default) or 'passage': which encoder side, max "
                                                "length and prompt; encode with 'passage' to get vectors as the index "
                                                "stores them")
        truncate: JsonBool | None = truncate_field()
        truncation_direction: Direction = direction_field()
        prompt_name: PromptName = Field(None, description=PROMPT_NAME_HELP)

    class ExplainRequest(StrictBody):
        model_config = ConfigDict(extra="forbid", title="ExplainRequest")
        query: Text
        id: DocId = Field(description="document id in the index")
        lam: Lambda | None = Field(None, alias="lambda", description="weight of the query's dense part")
        truncate: JsonBool | None = truncate_field()
        truncation_direction: Direction = direction_field()

    return RequestModels(SearchRequest, EncodeRequest, ExplainRequest)


def documents_request_model(limits: Limits, field_types: dict[str, str] | None = None) -> type[BaseModel]:
    """The body of ``POST /documents`` with the configured batch and length limits (over them: 413), and the
    index's payload fields."""
    DocumentFields = filter_schema.field_models(field_types).document_fields
    Chars = Annotated[str, StringConstraints(max_length=limits.max_document_chars)]

    class NewDocument(StrictBody):
        model_config = ConfigDict(extra="forbid", title="NewDocument")
        id: DocId
        title: Chars = Field("", description="optional title, encoded before the text")
        text: Annotated[Chars, StringConstraints(min_length=1, pattern=f"[^{WHITESPACE}]")]
        fields: DocumentFields | None = Field(
            None, description="payload field values, of the index's fields and types (/info); searches filter on "
                              "them as on the built ones", examples=[filter_schema.document_example(field_types or {})])

    class DocumentsRequest(StrictBody):
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

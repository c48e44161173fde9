"""Request and response bodies of the HTTP API (DESIGN §5).

Limits live in field constraints. The request models depend on configured
limits (max k, max batch), so :func:`request_models` builds them for one
:class:`~service.settings.Limits`; the OpenAPI schema then shows the real
bounds. Unknown fields are rejected. Response models are fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Le
from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, Field, Strict, StringConstraints, model_validator

from densehybrid.index.fusion import FusionMethod
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
Role = Literal["query", "passage"]


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


def request_models(limits: Limits) -> RequestModels:
    """The three request bodies with the given limits in their constraints."""
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


def documents_request_model(limits: Limits) -> type[BaseModel]:
    """The body of ``POST /documents`` with the configured batch and length limits (over them: 413)."""
    Chars = Annotated[str, StringConstraints(max_length=limits.max_document_chars)]

    class NewDocument(_Strict):
        model_config = ConfigDict(extra="forbid", title="NewDocument")
        id: DocId
        title: Chars = Field("", description="optional title, encoded before the text")
        text: Annotated[Chars, StringConstraints(min_length=1, pattern=f"[^{WHITESPACE}]")]

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
class SearchTiming(BaseModel):
    queue_ms: float
    encode_ms: float
    search_ms: float
    rerank_ms: float
    total_ms: float


class EncodeTiming(BaseModel):
    queue_ms: float
    tokenize_ms: float
    encode_ms: float
    total_ms: float


class ExplainTiming(BaseModel):
    queue_ms: float
    encode_ms: float
    explain_ms: float
    total_ms: float


class Term(BaseModel):
    token_id: int
    term: str
    query_weight: float
    passage_weight: float
    contribution: float


class Explanation(BaseModel):
    terms: list[Term] = Field(description="matched lexical terms, largest contribution first")
    lexical: float = Field(description="gated (lexical) part of the score")
    semantic: float = Field(description="dense part of the score, lambda applied")
    total: float


class Hit(BaseModel):
    id: str
    score: float
    rank: int = Field(ge=1)
    title: str | None = None
    text: str | None = None
    explanation: Explanation | None = None


class IndexSummary(BaseModel):
    name: str
    documents: int
    kind: str


class SearchResponse(BaseModel):
    results: list[Hit] | list[list[Hit]] = Field(description="hits for `query`, or one hit list per entry of `queries`")
    timing: SearchTiming
    index: IndexSummary


class EncodeResponse(BaseModel):
    vectors: list[list[float]] = Field(description="(n, dim) values; the dense part unscaled")
    gates: list[list[int]] | None = Field(description="(n, gated_dim) DLR indexes, for kinds with gates")
    dim: int
    gated_dim: int
    kind: str
    role: Role
    truncated: list[bool] = Field(description="whether each text was cut to the max length")
    timing: EncodeTiming


class ExplainResponse(Explanation):
    id: str
    timing: ExplainTiming


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    ready: bool
    status: str


class ModelInfo(BaseModel):
    model_id: str
    dense_model_id: str | None
    kind: str
    dim: int
    gated_dim: int
    lam: float
    skip_mlm: bool
    device: str
    backend: str = Field(description="the encoder's runtime: torch or onnx (what backend=auto chose)")
    max_query_length: int
    max_passage_length: int
    truncation: str


class IndexInfo(BaseModel):
    name: str
    documents: int
    dim: int
    lam: float


class Info(BaseModel):
    model: ModelInfo
    index: IndexInfo | None
    search_lambda: float | None = Field(description=(
        "the λ /search and /explain apply when a request sends no 'lambda': the index's (its manifest); "
        "model.lam is only the model's default that index build started from; null without an index"))
    limits: dict[str, int]
    ready: bool
    model_id: str = Field(description="TEI's field: the served model")
    max_input_length: int = Field(description="TEI's field: the longest text in tokens (passage side)")
    max_client_batch_size: int = Field(description="TEI's field: texts per request")
    max_batch_tokens: int = Field(description="TEI's field: padded tokens per forward")


class StoredDocument(BaseModel):
    id: str
    title: str
    text: str


class WriteResult(BaseModel):
    ids: list[str] = Field(description="the ids written (added or replaced) or deleted")
    seq: int = Field(description="sequence number of the change in the write-ahead log")
    documents: int = Field(description="documents in the index after the change")
    timing: dict[str, float]


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    code: str


class OpenAIErrorBody(BaseModel):
    """The error object of the OpenAI-compatible routes."""

    error: OpenAIErrorDetail

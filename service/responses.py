"""Response bodies of the HTTP API: fixed models, so the OpenAPI document states every answer's shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from densehybrid.encoder.choices import Role
from densehybrid.service.hit_responses import Explanation, Hit
from densehybrid.service.recall_responses import LiveRecall, Steering


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


class GroupRecall(BaseModel):
    recall_at_10: float
    exact_top10: float


class CalibrationPoint(BaseModel):
    breadth: float = Field(description="the first stage's breadth (ef_search, nprobe or a pqscan margin)")
    recall_at_10: float = Field(description="mean share of each calibration query's exact top 10 found")
    exact_top10: float = Field(description="share of calibration queries whose top 10 was the exact one entire")
    p50_ms: float = Field(description="median single-query first stage, candidates rescored, at build time")
    p99_ms: float
    groups: dict[str, GroupRecall] | None = Field(None, description="each group of calibration queries' own recall "
                                                                   "(recall_at_10 and exact_top10 above are the "
                                                                   "lowest group's)")


class CalibrationGroup(BaseModel):
    name: str = Field(description="in_domain (sentences cut from the corpus, their rows held out while measured), "
                                  "other_domain (docstring sentences of Python's standard library), file "
                                  "(--calibration-queries) or rows (stored rows, held out)")
    source: str = Field(description="where the group's queries came from")
    queries: int = Field(description="queries in the group")


class Calibration(BaseModel):
    knob: str = Field(description="the breadth measured: ef_search (hnsw) or margin (pqscan)")
    target_recall: float | None = Field(description="the recall@10 the build was asked to keep (--target-recall); "
                                                    "null where a breadth was given instead")
    reached: bool | None = Field(description="whether a measured breadth kept the target; if not, the default is "
                                             "the best one measured")
    queries: int = Field(description="calibration queries searched, all groups together")
    source: str = Field(description="where they came from, group by group: cut from sampled passages, Python's "
                                    "docstrings, a file, or stored rows")
    groups: list[CalibrationGroup] | None = Field(None, description="the groups of queries; the recall stated is "
                                                                    "the lowest group's")
    held_out_rows: int | None = Field(None, description="rows left out of the first stage while it was measured "
                                                        "(the rows the in-domain queries were cut from), added after")
    measured_rows: int | None = Field(None, description="the rows the index had when the curve was measured")
    measured_at: str | None = Field(None, description="when the curve was measured (UTC, ISO 8601)")
    stale: bool | None = Field(None, description="true once folds changed the first stage past what was measured "
                                                 "(codebooks or lists retrained, the graph rebuilt, or more than a "
                                                 "tenth of measured_rows added or dropped): answers still state the "
                                                 "curve's recall, the live recall measures the index as it is")
    rows_changed: int | None = Field(None, description="rows folds added or dropped since the curve was measured")
    seconds: float | None = Field(None, description="what measuring the curve took at build time")
    exact_p50_ms: float | None = Field(None, description="the exact scan's median single query at build time: below "
                                                         "it, --ann flat answers exactly and as fast")
    curve: list[CalibrationPoint]


class FirstStage(BaseModel):
    type: Literal["flat", "hnsw", "pqscan", "milvus"] = Field(
        description="what found the candidates: flat (an exact scan), hnsw or pqscan (approximate; the scores are "
                    "still exact), milvus (a collection)")
    ef_search: int | None = Field(None, description="hnsw: the graph breadth per query (in an answer: the one it used)")
    nprobe: int | None = Field(None, description="a Milvus IVF collection: the inverted lists scanned per query (in "
                                                 "an answer: the ones it used)")
    margin: float | None = Field(None, description="pqscan: how far below the k-th best code score (x |query|) "
                                                   "candidates are rescored (in an answer: the margin it used)")
    rescore: int | None = Field(None, description="pqscan: the least candidates rescored per query (in an answer: "
                                                  "the number it used)")
    scan_threads: int | None = Field(None, description="/info's, pqscan: the threads one query's code scan may use")
    index_type: str | None = Field(None, description="milvus: the collection's vector index type (FLAT, HNSW, ...)")
    recall_at_10: float | None = Field(None, description="an answer's: the recall@10 the build measured for such a "
                                                         "search at the breadth used (1.0 for an exact scan); null "
                                                         "where it measured no such search (see recall_note)")
    recall_note: str | None = Field(None, description="an answer's: why it states no recall (a filter, approx_gip, hits "
                                                      "past the top 10, a smaller rescore, no calibration); the live "
                                                      "recall in /info measures such searches too")
    reached: bool | None = Field(None, description="an answer to a `recall` request: whether the breadth used keeps "
                                                   "it (false: the best the build measured within the server's "
                                                   "limits falls short)")
    calibration: Calibration | None = Field(None, description="/info's: the build's recall against latency per breadth")
    live_recall: LiveRecall | None = Field(None, description="/info's: the recall measured on sampled live queries "
                                                             "(a local index; recall_sample_rate)")
    steering: Steering | None = Field(None, description="/info's, with recall_steering on: the default breadth the live "
                                                        "recall keeps at the target, and its changes")


class RecallResponse(BaseModel):
    recall_at_10: float = Field(description="mean share of each query's exact top 10 (over the rows the filter "
                                            "keeps) that the first stage found")
    exact_top10: float = Field(description="share of the queries whose whole exact top 10 was found")
    queries: int
    source: str = Field(description="what the queries were: the texts sent, or sampled rows of the index")
    per_query: list[float]
    first_stage: FirstStage = Field(description="the first stage measured, the breadth used and the recall its build "
                                                "states for such a search")
    timing: dict[str, float]


class IndexSummary(BaseModel):
    name: str
    documents: int
    kind: str
    first_stage: FirstStage


class ExplainedHits(BaseModel):
    hits: int = Field(description="hits with an `explanation`: the first ones in answer order (the first query's "
                                  "hits by rank, then the next query's, ...)")
    unexplained: int = Field(description="the hits after those, without an `explanation` (0 unless the answer "
                                         "holds more than max_explain_hits hits)")
    max_explain_hits: int = Field(description="the server's cap on explained hits per request (/info's limits)")


class SearchResponse(BaseModel):
    results: list[Hit] | list[list[Hit]] = Field(description="hits for `query`, or one hit list per entry of `queries`")
    timing: SearchTiming
    index: IndexSummary
    explained: ExplainedHits | None = Field(None, description=(
        "with explain=true: which hits carry an explanation. At most max_explain_hits hits are explained per "
        "request; when queries x k passes it the answer is still complete, and the hits past the cap come "
        "without `explanation`"))


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
    precision: str = Field("fp32", description="what queries and texts are encoded in: fp32 or int8")
    max_query_length: int
    max_passage_length: int
    truncation: str


class IndexInfo(BaseModel):
    name: str
    documents: int
    dim: int
    lam: float
    fields: dict[str, str] = Field({}, description="payload fields a search can filter on and return, with their "
                                                   "types (keyword, integer, float, bool, keyword_list)")
    fusion: dict[str, Any] | None = Field(None, description=(
        "dhr/fusion: the manifest's fusion entry: the default method (auto: the mix chosen from the corpus at "
        "build, recorded under 'auto' with its statistics), the fixed methods' dense_weight and rrf_k; a "
        "request's 'fusion' overrides the method; null for other kinds"))
    identifiers_first: dict[str, Any] | None = Field(None, description=(
        "under the auto mix: an identifier asked alone has the hits among the mix's best `depth` that hold it whole "
        "ranked first (`exact_match`, score + `score_bonus`); null when the default method is not auto"))
    precision: str = Field("fp32", description="what the index's passages were encoded in: fp32 or int8")
    first_stage: FirstStage


class PromptsInfo(BaseModel):
    """The served prompts, in sentence-transformers' shape: the index's (its manifest), else the server's."""

    prompts: dict[str, str] = Field(description="name -> text put before the input; 'passage' is the passages' "
                                                "prompt, 'query' the queries' unless default_prompt_name names another",
                                    examples=[{"query": "query: ", "passage": "passage: "}])
    default_prompt_name: str | None = Field(description="the prompt queries get, when not 'query'")


class Info(BaseModel):
    model: ModelInfo
    index: IndexInfo | None
    search_lambda: float | None = Field(description=(
        "the λ /search and /explain apply when a request sends no 'lambda': the index's (its manifest); "
        "model.lam is only the model's default that index build started from; null without an index"))
    limits: dict[str, int]
    ready: bool
    prompts: PromptsInfo
    model_id: str = Field(description="TEI's field: the served model")
    max_input_length: int = Field(description="TEI's field: the longest text in tokens, special tokens and prompt "
                                              "included, on the passage side (queries: model.max_query_length); "
                                              "longer ones are cut or refused (auto_truncate)")
    max_client_batch_size: int = Field(description="TEI's field: texts per request (max_request_texts); more is 413")
    max_batch_tokens: int = Field(description="TEI's field: padded tokens (texts x longest) the encoder worker puts "
                                              "in one batch of requests; a request over it runs alone, not refused")
    auto_truncate: bool = Field(description="TEI's field: whether over-long texts are cut when a request does not "
                                            "send `truncate`")


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

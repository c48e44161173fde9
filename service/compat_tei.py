"""Text-embeddings-inference routes: ``POST /embed``, ``/embed_sparse``, ``/rerank``, ``/``.

For TEI clients (``huggingface_hub.InferenceClient``, LlamaIndex's and Haystack's TEI components).
``/embed`` returns the ``/encode`` rows, L2-normalized unless ``normalize`` is false. ``/rerank``
scores each text as a passage against the query with the served model's own score (GIP for kinds
with gates, inner product otherwise); ``/embed_sparse`` returns each text's V-dim lexical vector
(before DLR or aggregation, docs/concepts.md) as its non-zero ``{"index", "value"}`` entries, and a 422
for dense-only (``cls``) models; ``raw_scores`` false applies a sigmoid as TEI does, which keeps
the order but saturates near 1 for large scores. As in TEI, ``truncate`` left out follows the
server's ``--auto-truncate`` (on by default); false makes an over-long text a 413 that names its token
count and the limit; ``truncation_direction`` is ``Right`` or ``Left`` (any case). ``prompt_name``
picks one of the served prompts (``GET /info``), as TEI's does from the model's. ``POST /`` is TEI's
generic route: ``inputs`` (a text or texts -> embeddings; ``{"source_sentence", "sentences"}`` ->
similarities) with optional ``parameters``. ``POST /tokenize`` and ``POST /decode`` are TEI's: the
query-side tokenizer's tokens with their character offsets in the prompted text (untruncated; the
prompt is the query prompt unless ``prompt_name`` names another, as ``/embed`` puts it first), and the
text of token ids. Every answer carries TEI's timing headers (milliseconds).
"""


from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Body, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from densehybrid.encoder.prompts import Prompts
from densehybrid.service import handlers
from densehybrid.service.errors import InvalidRequest
from densehybrid.service.routes import error_responses
from densehybrid.service.runtime import Runtime
from densehybrid.service.schemas import (DIRECTION_HELP, PROMPT_NAME_HELP, TRUNCATE_HELP, JsonBool, Role, StrictBody,
                                         Text, json_number, passage_prompt_rule, prompt_name_type)

TIMING_HEADERS = {"x-total-time": "total_ms", "x-tokenization-time": "tokenize_ms",
                  "x-queue-time": "queue_ms", "x-inference-time": "encode_ms"}
Direction = Literal["Right", "right", "Left", "left"]


class SparseValue(BaseModel):
    index: int = Field(description="token id in the model's vocabulary")
    value: float


class SimpleToken(BaseModel):
    id: int
    text: str = Field(description="the input's characters [start, stop), or the special token itself")
    special: bool
    start: int | None = Field(description="character offset in the input (after the prompt, if any); null for special tokens")
    stop: int | None


class RerankHit(BaseModel):
    index: int
    score: float
    text: str | None = None


def request_models(max_texts: int, prompts: Prompts = Prompts(), vocab_size: int | None = None) -> dict[str, type[BaseModel]]:
    Texts = Annotated[list[Text], Field(min_length=1, max_length=max_texts)]
    TokenId = Annotated[int, Field(ge=0, lt=vocab_size), BeforeValidator(json_number)]  # constraint first: it reaches the schema
    PromptName = prompt_name_type(list(prompts.prompts))

    class InputOptions(StrictBody):
        model_config = ConfigDict(extra="forbid", json_schema_extra=passage_prompt_rule(prompts, "input_type"))
        truncate: JsonBool | None = Field(None, description=TRUNCATE_HELP)
        truncation_direction: Direction | None = Field(None, description=DIRECTION_HELP)
        prompt_name: PromptName = Field(None, description=PROMPT_NAME_HELP)
        input_type: Role = Field("query", description="extension: encoder side for asymmetric models")

    class EmbedOptions(InputOptions):
        normalize: JsonBool = Field(True, description="L2-normalize each vector")

    class EmbedRequest(EmbedOptions):
        model_config = ConfigDict(extra="forbid", title="TeiEmbedRequest")
        inputs: Text | Texts

    class EmbedSparseRequest(InputOptions):
        model_config = ConfigDict(extra="forbid", title="TeiEmbedSparseRequest")
        inputs: Text | Texts

    class RerankRequest(StrictBody):
        model_config = ConfigDict(extra="forbid", title="TeiRerankRequest")
        query: Text
        texts: Texts
        return_text: JsonBool = False
        raw_scores: JsonBool = Field(False, description="false: sigmoid of the score (TEI's default)")
        truncate: JsonBool | None = Field(None, description=TRUNCATE_HELP)
        truncation_direction: Direction | None = Field(None, description=DIRECTION_HELP)

    class SimilarityInputs(StrictBody):
        source_sentence: Text
        sentences: Texts

    class GenericRequest(EmbedOptions):
        """/embed's body (options at the top level, as huggingface_hub sends them, or in ``parameters``)."""

        model_config = ConfigDict(extra="forbid", title="TeiGenericRequest")
        inputs: Text | Texts | SimilarityInputs
        parameters: EmbedOptions | None = Field(None, description="options of /embed, e.g. normalize")

    class TokenizeRequest(StrictBody):
        model_config = ConfigDict(extra="forbid", title="TeiTokenizeRequest", json_schema_extra={
            "examples": [{"inputs": "what is a dense retriever"},
                         {"inputs": ["sort a list", "open a file"], "add_special_tokens": False}]})
        inputs: Text | Texts
        add_special_tokens: JsonBool = Field(True, description="include [CLS]/[SEP] as the encoder sees them")
        prompt_name: PromptName = Field(None, description="a served prompt to put first (GET /info lists them)")

    class DecodeRequest(StrictBody):
        model_config = ConfigDict(extra="forbid", title="TeiDecodeRequest",
                                  json_schema_extra={"examples": [{"ids": [101, 7592, 2088, 102]}]})
        ids: Annotated[list[TokenId], Field(min_length=1)] | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=max_texts)]
        skip_special_tokens: JsonBool = True

    return {"embed": EmbedRequest, "sparse": EmbedSparseRequest, "options": EmbedOptions, "rerank": RerankRequest,
            "generic": GenericRequest, "similarity": SimilarityInputs, "tokenize": TokenizeRequest,
            "decode": DecodeRequest}


def _with_timing(request: Request, response: Response, answer: list) -> list:
    """``answer``, with TEI's timing headers set from the request's stage times."""
    timing = getattr(request.state, "timing", None) or {}
    for header, stage in TIMING_HEADERS.items():
        if stage in timing:
            response.headers[header] = f"{timing[stage]:g}"
    return answer


def build_router(runtime: Runtime) -> APIRouter:
    models = request_models(runtime.settings.max_request_texts, handlers.served_prompts(runtime),
                            runtime.encoder.spec.vocab_size)
    EmbedRequest, RerankRequest, GenericRequest = models["embed"], models["rerank"], models["generic"]
    router = APIRouter(tags=["tei"], responses=error_responses())

    @router.post("/embed", response_model=list[list[float]])
    async def embed(request: Request, response: Response, body: EmbedRequest = Body()) -> list:  # type: ignore[valid-type]
        """TEI's embed: one vector per input (a list of lists even for one text)."""
        return _with_timing(request, response, await embed_inputs(runtime, request, body.inputs, body))

    @router.post("/embed_sparse", response_model=list[list[SparseValue]])
    async def embed_sparse(request: Request, response: Response, body: models["sparse"] = Body()) -> list:  # type: ignore[valid-type]
        """TEI's embed_sparse: each text's lexical vector over the vocabulary, its non-zero entries."""
        return _with_timing(request, response, await sparse_inputs(runtime, request, body))

    @router.post("/rerank", response_model=list[RerankHit], response_model_exclude_none=True)
    async def rerank(request: Request, response: Response, body: RerankRequest = Body()) -> list:  # type: ignore[valid-type]
        """TEI's rerank: the texts' scores for the query, best first."""
        return _with_timing(request, response, await rerank_texts(runtime, request, body))

    @router.post("/", response_model=list[list[float]] | list[float])
    async def generic(request: Request, response: Response, body: GenericRequest = Body()) -> list:  # type: ignore[valid-type]
        """TEI's generic route: embeddings of ``inputs``, or similarities for a source sentence."""
        return _with_timing(request, response, await generic_inputs(runtime, request, body, models))

    @router.post("/tokenize", response_model=list[list[SimpleToken]])
    async def tokenize(body: models["tokenize"] = Body()) -> list:  # type: ignore[valid-type]
        """TEI's tokenize: each input's tokens (id, text, special, start, stop), untruncated."""
        return await tokenize_inputs(runtime, body)

    @router.post("/decode", response_model=list[str])
    async def decode(body: models["decode"] = Body()) -> list:  # type: ignore[valid-type]
        """TEI's decode: the text of each list of token ids."""
        return await decode_ids(runtime, body)

    return router


async def tokenize_inputs(rt: Runtime, body) -> list[list[dict]]:
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    prompt = handlers.text_options(rt, "query", prompt_name=body.prompt_name).prompt  # what /embed puts first
    tokens = await run_in_threadpool(rt.encoder.tokens, [prompt + text for text in texts],
                                     add_special_tokens=body.add_special_tokens)
    return [[vars(token) for token in row] for row in tokens]


async def decode_ids(rt: Runtime, body) -> list[str]:
    batch = body.ids if isinstance(body.ids[0], list) else [body.ids]
    try:
        return [rt.encoder.decode(row, skip_special_tokens=body.skip_special_tokens) for row in batch]
    except ValueError as exc:  # an id outside the vocabulary
        raise InvalidRequest(str(exc)) from None


async def embed_inputs(rt: Runtime, request: Request, inputs, options) -> list[list[float]]:
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    done = await handlers.encode_texts(rt, request, texts, options.input_type,
                                       handlers.request_text_options(rt, options.input_type, options))
    values = done.encoded.values.astype(np.float32)
    if options.normalize:
        values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
    return values.tolist()


async def sparse_inputs(rt: Runtime, request: Request, body) -> list[list[dict]]:
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    done = await handlers.encode_texts(rt, request, texts, body.input_type,
                                       handlers.request_text_options(rt, body.input_type, body), output="lexical")
    return [[{"index": int(i), "value": float(v)} for i, v in zip(sparse.indices, sparse.values)]
            for sparse in done.encoded]


async def rerank_texts(rt: Runtime, request: Request, body) -> list[dict]:
    scores = await handlers.rerank(rt, request, body.query, list(body.texts), truncate=body.truncate,
                                   direction=body.truncation_direction or "right")
    shown = scores if body.raw_scores else 1.0 / (1.0 + np.exp(-scores.astype(np.float64)))
    order = np.argsort(-scores, kind="stable")
    return [{"index": int(i), "score": float(shown[i]), "text": body.texts[i] if body.return_text else None}
            for i in order]


async def generic_inputs(rt: Runtime, request: Request, body, models: dict) -> list:
    inputs, options = body.inputs, models["options"]
    given = body.model_dump(include=set(options.model_fields), exclude_unset=True)
    if body.parameters is not None:
        given.update(body.parameters.model_dump(exclude_unset=True))
    merged = options.model_validate(given)
    if isinstance(inputs, models["similarity"]):  # the model's score; only truncation applies
        scores = await handlers.rerank(rt, request, inputs.source_sentence, list(inputs.sentences),
                                       truncate=merged.truncate,
                                       direction=merged.truncation_direction or "right")
        return [float(s) for s in scores]
    return await embed_inputs(rt, request, inputs, merged)

"""OpenAI-compatible embeddings: ``POST /v1/embeddings`` and ``GET /v1/models``.

For the ``openai`` SDK and LangChain's ``OpenAIEmbeddings`` pointed at this server. The embedding of a
text is its row of ``POST /encode`` (gated part, then the dense part unscaled; gates are left out, ask
``/encode`` for them). ``input_type`` ("query", the default, or "passage") is an extension field that
picks the encoder side of asymmetric models; ``truncate``, ``truncation_direction`` and ``prompt_name``
are the same extension fields as on ``/encode``; the openai SDK sends them with ``extra_body``. Errors on
these routes use OpenAI's error object (see :mod:`densehybrid.service.errors`).
"""


import base64
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from densehybrid.service import handlers
from densehybrid.service.errors import InvalidRequest
from densehybrid.service.routes import error_responses
from densehybrid.service.runtime import Runtime
from densehybrid.service.responses import OpenAIErrorBody
from densehybrid.encoder.prompts import Prompts
from densehybrid.service.schemas import (PROMPT_NAME_HELP, Direction, JsonBool, JsonInt, RequestBody, Role, Text,
                                         direction_field, passage_prompt_rule, prompt_name_type, truncate_field)

TOKEN_IDS_REFUSED = ("token ids are not accepted: send the text itself (LangChain's OpenAIEmbeddings: set "
                     "check_embedding_ctx_length=False so that it sends text)")


def _no_token_ids(value):
    if isinstance(value, list) and any(isinstance(v, list) or (isinstance(v, int) and not isinstance(v, bool))
                                       for v in value):
        raise ValueError(TOKEN_IDS_REFUSED)
    return value


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "densehybrid"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


def embeddings_request(max_texts: int, prompts: Prompts = Prompts()) -> type[BaseModel]:
    Texts = Annotated[list[Text], Field(min_length=1, max_length=max_texts)]
    PromptName = prompt_name_type(list(prompts.prompts))

    class EmbeddingsRequest(RequestBody):
        model_config = ConfigDict(extra="forbid", title="OpenAIEmbeddingsRequest",
                                  json_schema_extra=passage_prompt_rule(prompts, "input_type"))
        input: Annotated[Text | Texts, BeforeValidator(_no_token_ids)] = Field(
            description=f"a text or a list of up to {max_texts} texts (token ids are refused)")
        model: str = Field(description="the served model's id (GET /v1/models)")
        encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32")
        dimensions: JsonInt | None = Field(None, description="must equal the model's dim when given")
        user: str | None = Field(None, description="accepted and ignored")
        input_type: Role = Field("query", description="extension: encoder side for asymmetric models")
        truncate: JsonBool | None = truncate_field()
        truncation_direction: Direction = direction_field()
        prompt_name: PromptName = Field(None, description="extension: " + PROMPT_NAME_HELP)

    return EmbeddingsRequest


def _encoded_row(row: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode("ascii")
    return row.tolist()


def build_router(runtime: Runtime) -> APIRouter:
    EmbeddingsRequest = embeddings_request(runtime.settings.max_request_texts, handlers.served_prompts(runtime))
    router = APIRouter(prefix="/v1", tags=["openai"])

    errors = error_responses(OpenAIErrorBody, {404: "the model is not the served one"})

    @router.post("/embeddings", response_model=EmbeddingList, responses=errors)
    async def embeddings(request: Request, body: EmbeddingsRequest = Body()) -> dict:  # type: ignore[valid-type]
        """OpenAI's create-embeddings: one embedding per input text, in order, with token usage."""
        return await create_embeddings(runtime, request, body)

    @router.get("/models", response_model=ModelList, responses={401: errors[401]})
    async def models() -> dict:
        """The one served model."""
        return {"data": [ModelCard(id=handlers.require_model(runtime, None))]}

    return router


async def create_embeddings(rt: Runtime, request: Request, body) -> dict:
    model = handlers.require_model(rt, body.model)
    if body.dimensions is not None and body.dimensions != rt.encoder.spec.dim:
        raise InvalidRequest(f"dimensions must be the model's dim {rt.encoder.spec.dim} (no shortening)")
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    done = await handlers.encode_texts(rt, request, texts, body.input_type,
                                       handlers.request_text_options(rt, body.input_type, body))
    data = [{"index": i, "embedding": _encoded_row(row, body.encoding_format)}
            for i, row in enumerate(done.encoded.values)]
    return {"data": data, "model": model, "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens}}

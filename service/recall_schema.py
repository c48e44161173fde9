"""The body of ``POST /recall``: query texts or a sample of the index's rows, searched with a search's first-stage
fields (the same types, limits and descriptions as ``/search``'s, taken from its model)."""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Le
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from densehybrid.service.json_types import json_number
from densehybrid.service.schemas import StrictBody, Text, _no_default
from densehybrid.service.settings import Limits

# the fields of a search that decide what its first stage finds: a measured recall takes them as a search does
SEARCH_FIELDS = ("filter", "ef_search", "nprobe", "margin", "rescore", "recall", "lam")
MAX_SAMPLE = 1000


class RecallBody(StrictBody):
    """``queries`` or ``sample`` (exactly one of the two)."""

    model_config = ConfigDict(extra="forbid", title="RecallRequest", json_schema_extra={
        "oneOf": [{"required": ["queries"]}, {"required": ["sample"]}],
        "examples": [{"queries": ["what is a dense retriever"], "recall": 0.95}, {"sample": 200, "nprobe": 64}]})

    @model_validator(mode="after")
    def _one_source(self):
        if (self.queries is None) == (self.sample is None):
            raise ValueError("give exactly one of 'queries' or 'sample'")
        return self


def recall_request_model(search: type[BaseModel], limits: Limits) -> type[BaseModel]:
    """``POST /recall``'s body with ``search``'s first-stage fields and the server's batch limit."""
    texts = Annotated[list[Text], Field(min_length=1, max_length=limits.max_request_texts)]
    sample = Annotated[int, Ge(1), Le(MAX_SAMPLE), BeforeValidator(json_number)]
    fields = {name: (search.model_fields[name].annotation, search.model_fields[name]) for name in SEARCH_FIELDS}
    return create_model(
        "RecallRequest", __base__=RecallBody,
        queries=(texts, Field(None, description="query texts to measure on (encoded as a search's are)",
                              json_schema_extra=_no_default)),
        sample=(sample, Field(None, description="instead of texts, this many seeded random rows of the index as "
                                                "queries (a rough guide: a passage's vector is not a query's, and it "
                                                "finds itself)", json_schema_extra=_no_default)),
        seed=(Annotated[int, Ge(0), BeforeValidator(json_number)], Field(0, description="the sample's seed")),
        **fields)

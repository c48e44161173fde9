"""The service's configuration: one settings object (docs/configuration.md).

Every field reads from an environment variable ``DENSEHYBRID_<FIELD>`` (e.g.
``DENSEHYBRID_MAX_BATCH_SIZE=64``) and is mirrored by a ``densehybrid serve``
flag; flags win over the environment. Secrets are ``SecretStr`` so that the
effective settings can be logged at start without leaking them.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from densehybrid.encoder.choices import Backend, Kind, Pooling, Precision
from densehybrid.encoder.config import (
    DEFAULT_AGG_DIM, DEFAULT_DLR_DIM, DEFAULT_LAMBDA, DEFAULT_MAX_PASSAGE_LENGTH, DEFAULT_MAX_QUERY_LENGTH, EncoderConfig,
)

log = logging.getLogger(__name__)

# the encoder settings default to None: the index's value, else the model directory's, else this
_UNSET = " (default: the index's, the model's, else {})"


class ServiceSettings(BaseSettings):
    """Settings of one ``densehybrid serve`` process (one model, at most one index)."""

    model_config = SettingsConfigDict(env_prefix="DENSEHYBRID_", extra="ignore", validate_default=True)
    # Whether these settings start a listening server: only then do host, API key and allow_open
    # have to agree (OfflineSettings below does not listen).
    listens: ClassVar[bool] = True

    model: str | None = Field(None, description="model directory or zoo name; defaults to the one the index manifest names")
    index: Path | None = Field(None, description="index directory; without one the service is encode-only")
    milvus_uri: str | None = Field(None, description="serve a Milvus collection instead of --index: a Milvus Lite "
                                   "file (*.db) or http://host:19530")
    collection: str | None = Field(None, description="the Milvus collection (with milvus_uri); its manifest names the model")
    milvus_timeout_s: float = Field(10.0, gt=0, description="Milvus connect and call timeout")
    store_check_s: float = Field(1.0, gt=0, description="how often /ready re-checks a remote vector store")
    kind: Kind | None = Field(None, description="model kind when the model directory does not state it (no index)")
    dense_model: str | None = Field(None, description="dense model of a fusion retriever (no index)")
    # the rest of the encoder flags `index build` takes (None: the index's, else the model directory's)
    skip_mlm: bool | None = Field(None, description="Aggretriever 'w/o MLM': lexical part without the MLM head")
    agg_dim: int | None = Field(None, ge=1, description=f"Aggretriever aggregated dims{_UNSET.format(DEFAULT_AGG_DIM)}")
    dlr_dim: int | None = Field(None, ge=1, description=f"DLR dims (dhr, dlr, fusion){_UNSET.format(DEFAULT_DLR_DIM)}")
    lam: float | None = Field(None, allow_inf_nan=False, validation_alias=AliasChoices("lam", "densehybrid_lambda"),
                              description=f"weight of the query's dense part (dhr, fusion){_UNSET.format(DEFAULT_LAMBDA)}")
    pooling: Pooling | None = Field(None, description="cls kind: [CLS] or mean pooling")
    normalize: bool | None = Field(None, description="cls kind: L2-normalise the pooled vector")
    max_query_length: int | None = Field(None, ge=1, description=f"query tokens kept{_UNSET.format(DEFAULT_MAX_QUERY_LENGTH)}")
    max_passage_length: int | None = Field(None, ge=1,
                                           description=f"passage tokens kept{_UNSET.format(DEFAULT_MAX_PASSAGE_LENGTH)}")
    device: str | None = Field(None, description="torch device (cpu, cuda, cuda:1); default: a GPU if present")
    search_device: str = Field("auto", description="where the first stage and rerank run: auto (a GPU when torch sees "
                               "one and the index is exact FlatIP), cpu (Faiss), cuda (every GPU), cuda:N (one GPU)")
    backend: Backend = Field(
        "auto", description="encoder runtime: torch, onnx (ONNX Runtime, same outputs to 1e-5), or auto: onnx on the "
                            "CPU (about 2x faster there), torch on a GPU")
    precision: Precision | None = Field(
        None, description="encoder precision: fp32, or int8 (ONNX Runtime's quantized graphs on the CPU, for the kinds "
                          "whose retrieval quality was measured to hold; docs/precision.md); default: the index's, "
                          "else fp32")
    cuda_graphs: bool = Field(True, description="on a GPU, replay batches of up to 64 short texts from CUDA graphs "
                              "(the query buckets are captured during warm-up); off: every forward runs eagerly")
    allow_precision_mismatch: bool = Field(False, description="encode queries in another precision than the index's "
                                           "passages (refused otherwise)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 picks a free one)")

    # encoder worker (docs/configuration.md)
    # 64: smaller batches lost throughput under many one-query clients; 64 did not
    # (docs/performance.md, "What each change measured")
    max_batch_size: int = Field(64, ge=1, le=4096, description="texts per encoder forward")
    max_batch_tokens: int = Field(16384, ge=1, description="padded tokens (texts x longest) per forward")
    # 0: batches still form while a forward runs (requests queue behind it); a wait only delays lone
    # requests (docs/performance.md, "What each change measured")
    max_wait_ms: float = Field(0.0, ge=0, le=1000, description="how long the worker waits to fill a batch")
    queue_size: int = Field(1024, ge=1, description="texts waiting for the encoder before 429")
    retry_after_s: int = Field(1, ge=1, description="Retry-After sent with 429")
    request_timeout_s: float = Field(30.0, gt=0, description="longest a request waits for encoding and search")
    search_threads: int = Field(1, ge=1, le=64, description="threads running first stage + rerank")
    scan_threads: int = Field(0, ge=0, le=64, description="threads one query's pqscan code scan is split over, used "
                              "while the searches in flight leave cores idle (0: the cores this process may run on, "
                              "at most 4, and one per 100k rows)")

    # inputs: truncation and prompts
    auto_truncate: bool = Field(True, description="cut over-long texts to the role's max length when a request does "
                                "not say (its `truncate` wins); off: such a text gets 413 naming its token count")
    query_prompt: str | None = Field(None, description="put before every query (encode-only servers; with an index "
                                     "it must equal the index's, which is always used)")
    passage_prompt: str | None = Field(None, description="put before every passage (encode-only servers; with an "
                                       "index it must equal the index's)")

    # live recall: a sampled share of searches scanned exactly off the request path (service.live_recall)
    recall_sample_rate: float = Field(0.01, ge=0.0, le=1.0, description="share of searched queries whose first-stage "
                                      "recall@10 is measured against an exact scan, off the request path (0: off)")
    recall_sample_queue: int = Field(32, ge=1, le=10000, description="sampled queries waiting for their exact scan; "
                                     "past it a sample is dropped and counted, never waited for")
    recall_window: int = Field(1000, ge=1, le=1_000_000, description="the last sampled queries the live recall in "
                               "/info and /metrics is the mean of")

    recall_steering: bool = Field(False, description="move the first stage's default breadth one measured step wider "
                                  "when the live recall falls under the index's target, one narrower when it is "
                                  "recall_steering_slack above it (within max_ef_search/max_nprobe; logged, in /info)")
    recall_steering_samples: int = Field(200, ge=10, le=100_000, description="unfiltered live samples at the default "
                                         "breadth that recall steering compares with the target before each step")
    recall_steering_slack: float = Field(0.02, ge=0.0, le=1.0, description="how far above the target the live recall "
                                         "must be before recall steering narrows the breadth")

    # request limits (422 above the value limits, 413 above the size limits)
    max_k: int = Field(1000, ge=1, description="largest k in /search")
    max_candidates: int = Field(10000, ge=1, le=10000, description="largest first-stage depth K1")
    max_ef_search: int = Field(2048, ge=1, le=10000, description="largest ef_search (graph breadth) a search of an "
                               "hnsw first stage may ask for")
    max_nprobe: int = Field(1024, ge=1, le=65536, description="largest nprobe (inverted lists scanned) a search of "
                            "a Milvus IVF collection may ask for")
    max_rescore: int = Field(5000, ge=1, le=10000, description="largest rescore (candidates scored again exactly) a "
                             "search of a pqscan first stage may ask for")
    max_request_texts: int = Field(64, ge=1, description="largest batch of queries (/search) or texts (/encode)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body; checked before parsing")
    max_explain_hits: int = Field(100, ge=1, description="largest queries x k of a /search with explain=true")
    max_explain_terms: int = Field(64, ge=1, description="matched terms listed per explanation (largest first)")
    max_return_text_bytes: int = Field(1 << 20, ge=1024, description="largest total of titles and texts a /search returns")

    # security and ops
    api_key: SecretStr | None = Field(None, description="when set, required as 'Authorization: Bearer <key>'")
    allow_open: bool = Field(False, description="serve without an API key on a non-loopback host")
    cors_origins: list[str] = Field(default_factory=list, description="allowed CORS origins; empty = CORS off")
    log_level: str = Field("INFO", description="logging level")
    log_json: bool = Field(True, description="JSON log lines (false: plain text)")
    warmup: bool = Field(True, description="run one query through model and index before /ready")

    # tracing: off unless an OTLP endpoint is given (service.tracing; needs the [otel] extra)
    otlp_endpoint: str | None = Field(None, description="send OpenTelemetry traces over OTLP/HTTP (protobuf) to this "
                                      "collector URL, e.g. http://localhost:4318 (/v1/traces is added to a URL "
                                      "without a path); unset: tracing off")
    otlp_service_name: str = Field("densehybrid", min_length=1, description="service.name of the traces sent")

    # writes: POST/DELETE /documents on a local index
    writes: bool = Field(True, description="accept document adds and deletes on the served index (--index DIR)")
    write_api_key: SecretStr | None = Field(None, description="when set, required for writes instead of api_key")
    write_log: Path | None = Field(None, description="write-ahead log directory; default: <index>.wal beside the index")
    max_write_documents: int = Field(64, ge=1, description="largest batch of documents in one POST /documents")
    max_document_chars: int = Field(100_000, ge=1, description="longest title or text of a written document")
    compact_after_changes: int = Field(1000, ge=1, description="logged changes that start a background compaction")
    write_share: float = Field(0.33, gt=0, le=1, description="while searches are being served, the most of the time "
                               "writes may keep the server busy (writes wait their turn); 1: writes never wait")
    max_waiting_writes: int = Field(64, ge=1, description="writes waiting their turn before 429")

    @model_validator(mode="after")
    def _one_index_source(self) -> "ServiceSettings":
        if (self.milvus_uri is None) != (self.collection is None):
            raise ValueError("milvus_uri and collection go together")
        if self.milvus_uri is not None and self.index is not None:
            raise ValueError("give either index or milvus_uri + collection, not both")
        return self

    @classmethod
    def env_var(cls, field_name: str) -> str:
        """The environment variable that sets ``field_name``."""
        alias = cls.model_fields[field_name].validation_alias
        names = alias.choices if isinstance(alias, AliasChoices) else []
        env = [name for name in names if name.lower().startswith("densehybrid_")]
        return env[0].upper() if env else f"DENSEHYBRID_{field_name.upper()}"

    @field_validator("index", mode="before")
    @classmethod
    def _empty_index_is_no_index(cls, value):
        """An empty DENSEHYBRID_INDEX unsets the image's default (the Compose profile "milvus" serves a collection)."""
        return None if value == "" else value

    @field_validator("api_key", "write_api_key")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from urllib.parse import urlsplit

        url = urlsplit(value.strip())
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL of an OTLP/HTTP receiver (e.g. http://localhost:4318)")
        return value.strip()

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError(f"unknown log level {value!r}")
        return level

    @model_validator(mode="after")
    def _no_open_service_by_accident(self) -> "ServiceSettings":
        # Safe by default: a keyless service is fine on loopback (development, tests),
        # anywhere else the operator must say so.
        if self.listens and self.api_key is None and not self.allow_open and not is_loopback(self.host):
            raise ValueError(f"no API key set while listening on {self.host}: set DENSEHYBRID_API_KEY "
                             "(deploy/init-env.sh generates one), or DENSEHYBRID_ALLOW_OPEN=true to serve without one")
        return self

    def redacted(self) -> dict:
        """The effective settings with secrets hidden, for the start-up log line."""
        data = self.model_dump(mode="json")
        data["api_key"] = "**********" if self.api_key is not None else None
        data["write_api_key"] = "**********" if self.write_api_key is not None else None
        return data

    @property
    def write_log_dir(self) -> Path | None:
        """Where the write-ahead log lives, or None when writes are off or there is no index."""
        if not self.writes or self.index is None:
            return None
        return self.write_log or self.index.with_name(self.index.name + ".wal")

    @property
    def limits(self) -> "Limits":
        return Limits(self.max_k, self.max_candidates, self.max_request_texts, self.max_write_documents,
                      self.max_document_chars, self.max_ef_search, self.max_nprobe, self.max_rescore)

    def encoder_config(self) -> EncoderConfig:
        """The model and encoder settings given (``None`` where not: the index's or the model's decide)."""
        return EncoderConfig(**{name: getattr(self, name) for name in EncoderConfig.field_names()})


class OfflineSettings(ServiceSettings):
    """The same settings for a command that loads model and index but never listens (``models
    export-onnx``): the listening checks do not apply, so the image's DENSEHYBRID_HOST=0.0.0.0 without
    an API key (the Compose setup run) is no error there."""

    listens: ClassVar[bool] = False


@dataclass(frozen=True)
class Limits:
    """The request limits the schemas enforce in their field constraints."""

    max_k: int
    max_candidates: int
    max_request_texts: int
    max_write_documents: int = 64
    max_document_chars: int = 100_000
    max_ef_search: int = 2048
    max_nprobe: int = 1024
    max_rescore: int = 5000


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def log_effective(settings: ServiceSettings) -> None:
    log.info("effective settings", extra={"fields": {"settings": settings.redacted()}})

"""``EncoderConfig``: what to load, as one value that every entry point fills.

The CLI flags, the service settings and an index manifest all describe an
encoder the same way; each builds an :class:`EncoderConfig` and hands it to
:func:`encoder.loading.load_encoder`. ``None`` means "not given": the model
directory's ``densehybrid.json``, the zoo's defaults for a named model, then
the defaults below decide, in that order. Where and how it runs (device,
backend) is not part of it: the same encoder can run anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from densehybrid.encoder.base import EncoderSpec
from densehybrid.encoder.choices import Kind, Pooling

# the defaults of every setting not given anywhere (the published checkpoints' values)
DEFAULT_AGG_DIM, DEFAULT_DLR_DIM = 640, 768
DEFAULT_MAX_QUERY_LENGTH, DEFAULT_MAX_PASSAGE_LENGTH = 32, 128
DEFAULT_LAMBDA = 1.0
DEFAULT_POOLING: Pooling = "cls"


@dataclass(frozen=True)
class EncoderConfig:
    """A model id (zoo name, local directory or hub id) and the settings given for it."""

    model: str | None = None
    kind: Kind | None = None
    skip_mlm: bool | None = None
    agg_dim: int | None = None
    dlr_dim: int | None = None
    lam: float | None = None
    dense_model: str | None = None
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_query_length: int | None = None
    max_passage_length: int | None = None

    @classmethod
    def from_spec(cls, spec: EncoderSpec) -> "EncoderConfig":
        """The configuration that rebuilds the encoder an index was built with (its manifest's spec).

        How the lexical vector is made follows from these and the model directory, so it is not repeated.
        """
        return cls(model=spec.model_id, kind=spec.kind, skip_mlm=spec.skip_mlm,
                   agg_dim=spec.agg_dim, dlr_dim=spec.dlr_dim, lam=spec.lam, dense_model=spec.dense_model_id,
                   pooling=spec.pooling, normalize=spec.normalize, max_query_length=spec.max_query_length,
                   max_passage_length=spec.max_passage_length)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def given(self) -> dict:
        """The fields that are not ``None``."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    def updated(self, overrides: "EncoderConfig") -> "EncoderConfig":
        """This configuration with every field ``overrides`` gives replacing it."""
        return replace(self, **overrides.given())

"""The encoder flags every model-loading command shares (encode, index build, search, eval, export-onnx).

The flags are the settings model's (``cli.settings_flags``: the same names, help
and defaults as ``serve``), parsed into one :class:`EncoderOptions`::

    @app.command("build")
    @with_encoder_options
    def build(corpus: Path, encoder: EncoderOptions) -> None:
        enc = encoder.load()

``None`` means "not given": the index's manifest, the model directory's
``densehybrid.json`` or the zoo's defaults decide (``encoder.config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import typer

from densehybrid.cli.settings_flags import with_flags
from densehybrid.encoder.config import EncoderConfig

if TYPE_CHECKING:
    from densehybrid.encoder.base import Encoder

ENCODER_FLAGS: tuple[str, ...] = (*EncoderConfig.field_names(), "device", "precision")


class BuildBackend(str, Enum):
    """encoder runtime of an index build: torch, or onnx (ONNX Runtime); default: torch, onnx for --precision int8"""

    torch = "torch"
    onnx = "onnx"


@dataclass(frozen=True)
class EncoderOptions:
    """The encoder flags as given: what to load, where, and whether λ is to be chosen from the corpus."""

    config: EncoderConfig = field(default_factory=EncoderConfig)
    device: str | None = None
    lambda_auto: bool = False  # --lambda auto: only an index build can choose λ (from its corpus)
    precision: str | None = None  # None: fp32, or the index's for the commands that read one

    @classmethod
    def from_flags(cls, flags: dict) -> "EncoderOptions":
        lam = flags["lam"]
        config = EncoderConfig(**{**{k: flags[k] for k in EncoderConfig.field_names()},
                                  "lam": None if lam == "auto" else lam})
        return cls(config, flags["device"], lam == "auto", flags["precision"])

    @property
    def model(self) -> str | None:
        return self.config.model

    def load(self) -> "Encoder":
        """Load the encoder these options describe."""
        from densehybrid.index.building.commands import load_model

        if not self.model:
            raise typer.BadParameter("--model is required (a zoo name, a local directory or a hub id)")
        return load_model(self.config, self.device, precision=self.precision)

    def fixed_lambda(self, command: str) -> float | None:
        """λ for a command that has no corpus to choose it from (search, eval, serve)."""
        if self.lambda_auto:
            raise ValueError(lambda_auto_error(command))
        return self.config.lam

    def serve_settings(self) -> dict:
        """The options given, as ServiceSettings fields."""
        self.fixed_lambda("serve")
        return {**self.config.given(), **({"device": self.device} if self.device is not None else {}),
                **({"precision": self.precision} if self.precision is not None else {})}


def lambda_auto_error(command: str) -> str:
    return (f"--lambda auto chooses λ from the corpus at 'index build' only; give {command} a number "
            "(e.g. --lambda 0.5) or leave it out to use the index's λ")


def with_encoder_options(command):
    """Decorate a typer command that takes ``encoder: EncoderOptions`` to expose the shared flags."""
    return with_flags(ENCODER_FLAGS, "encoder", EncoderOptions.from_flags)(command)

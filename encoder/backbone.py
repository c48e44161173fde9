"""The transformer forward behind every encoder, on one runtime or another.

:class:`Backbone` is the small interface the encoders call: a tokenizer per role,
sizes, and ``forward(ids, mask, role) -> (hidden states, MLM logits or None)``.
:class:`TorchBackbone` runs transformers modules (one per role, one shared when
tied); ``encoder.backends.onnx_backend.OnnxBackbone`` runs the same graphs on ONNX
Runtime and holds no torch transformer. The encoders' heads and representation math are torch
either way, so the two can only differ by float rounding.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import nn

from densehybrid.encoder.choices import Role
from densehybrid.encoder.tokenization import RoleTokenizer


class Backbone(abc.ABC):
    """``models``-free view of a transformer per role: what the encoders need of it."""

    tokenizer: RoleTokenizer
    with_mlm: bool  # whether forward returns MLM logits (False: the model was loaded without its head)
    backend: str
    precision: str = "fp32"  # what the forward computes in (int8: ONNX Runtime's quantized graphs)

    @property
    @abc.abstractmethod
    def tied(self) -> bool:
        """Whether queries and passages run the same weights."""

    @property
    @abc.abstractmethod
    def hidden_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    def to(self, device: torch.device) -> "Backbone":
        return self

    @abc.abstractmethod
    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, role: Role) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) ids and mask -> last hidden states (B, L, d) and MLM logits (B, L, V) or None."""


@dataclass
class TorchBackbone(Backbone):
    """``models[role]`` is a masked-LM model when ``with_mlm``, else the bare encoder (no MLM head)."""

    models: dict[Role, nn.Module]
    tokenizer: RoleTokenizer
    with_mlm: bool
    backend = "torch"

    @property
    def tied(self) -> bool:
        return self.models["query"] is self.models["passage"]

    @property
    def config(self):
        return self.models["query"].config

    @property
    def hidden_size(self) -> int:
        config = self.config
        return getattr(config, "hidden_size", None) or config.dim  # DistilBERT calls it ``dim``

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def to(self, device: torch.device) -> "TorchBackbone":
        for model in {id(m): m for m in self.models.values()}.values():
            model.to(device)
        return self

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, role: Role) -> tuple[torch.Tensor, torch.Tensor | None]:
        model = self.models[role]
        if not self.with_mlm:
            return model(input_ids=input_ids, attention_mask=mask).last_hidden_state, None
        out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        return out.hidden_states[-1], out.logits

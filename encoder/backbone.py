"""A transformers checkpoint per role (one shared module when tied) and its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from densehybrid.encoder.base import Role
from densehybrid.encoder.tokenization import RoleTokenizer


@dataclass
class Backbone:
    """``models[role]`` is a masked-LM model when ``with_mlm``, else the bare encoder (no MLM head)."""

    models: dict[Role, nn.Module]
    tokenizer: RoleTokenizer
    with_mlm: bool

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

    @property
    def max_positions(self) -> int:
        return getattr(self.config, "max_position_embeddings", 512)

    def to(self, device: torch.device) -> "Backbone":
        for model in {id(m): m for m in self.models.values()}.values():
            model.to(device)
        return self

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, role: Role) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) ids and mask -> last hidden states (B, L, d) and MLM logits (B, L, V) or None."""
        model = self.models[role]
        if not self.with_mlm:
            return model(input_ids=input_ids, attention_mask=mask).last_hidden_state, None
        out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        return out.hidden_states[-1], out.logits

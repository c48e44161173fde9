"""The one interface an encoder needs from its network, with the torch implementation.

An encoder's forward splits into two network calls and pure math (§2):

    hidden_states(input_ids, attention_mask) -> (B, L, d) last-layer states
    mlm_logits(rows)                         -> (N, V) MLM logits of N hidden rows

Splitting the MLM head from the backbone lets an encoder run the head only on
the rows it needs (real tokens, no [CLS], no padding), and lets the skip-MLM and
[CLS] paths never touch it. :class:`TorchBackbone` runs a transformers model;
``encoder.backends.onnx_backend.OnnxBackbone`` runs the same graphs exported to
ONNX Runtime. Heads that are a single linear layer (pooler, term weights) stay in
torch for both: they cost microseconds.
"""

from __future__ import annotations

from typing import Protocol

import torch


class BackboneError(RuntimeError):
    """The network cannot provide what was asked (e.g. MLM logits from a model without a head)."""


class Backbone(Protocol):
    hidden_size: int
    vocab_size: int
    has_mlm_head: bool

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids, (B, L) mask -> (B, L, d) float32 last hidden states."""

    def mlm_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """(N, d) hidden rows -> (N, V) float32 MLM logits."""


def base_model_of(model: torch.nn.Module) -> torch.nn.Module:
    """The encoder stack of a transformers model, with or without an MLM head on top."""
    return getattr(model, "base_model", model)


def mlm_head_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The MLM head of a transformers masked-LM model as one module ``(..., d) -> (..., V)``; None if absent."""
    if hasattr(model, "vocab_projector"):  # DistilBertForMaskedLM keeps its head as loose layers
        return torch.nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)
    for name in ("cls", "lm_head"):  # BertForMaskedLM, RobertaForMaskedLM
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    return None


class TorchBackbone:
    """A transformers model (``*ForMaskedLM`` or a bare ``*Model``) behind :class:`Backbone`."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()
        self.base = base_model_of(model)
        self.head = mlm_head_of(model)
        self.hidden_size = int(self.base.config.hidden_size)
        self.vocab_size = int(self.base.config.vocab_size)
        self.has_mlm_head = self.head is not None

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def mlm_logits(self, rows: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            raise BackboneError(f"{type(self.model).__name__} has no MLM head (loaded without it, e.g. for skip-MLM)")
        return self.head(rows)

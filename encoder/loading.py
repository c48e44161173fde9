"""``load_encoder``: the one factory every command uses (index build, search, serve)."""

from __future__ import annotations

from encoder.base import Encoder


def load_encoder(model: str, *, kind=None, skip_mlm=None, agg_dim=640, dlr_dim=768, lam=None, dense_model=None,
                 pooling=None, normalize=None, device=None, max_query_length=None,
                 max_passage_length=None) -> Encoder:
    raise NotImplementedError("work in progress on branch enc")

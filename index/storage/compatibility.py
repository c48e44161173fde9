"""Whether a model may serve an index: the spec fields and tokenizer/config files that must agree."""

from __future__ import annotations

import logging

from densehybrid.encoder.base import EncoderSpec
from densehybrid.index.errors import IndexMismatchError

log = logging.getLogger(__name__)

# spec fields that must agree between an index and the encoder serving it
COMPATIBILITY_FIELDS = ("kind", "dim", "gated_dim", "skip_mlm", "lexical", "agg_dim", "dlr_dim",
                        "pooling", "normalize", "vocab_size", "weights_hash")


def check_compatible(index_spec: EncoderSpec, model_spec: EncoderSpec) -> None:
    """Raise :class:`IndexMismatchError` naming the first field where the model differs from the index."""
    for name in COMPATIBILITY_FIELDS:
        want, got = getattr(index_spec, name), getattr(model_spec, name)
        if want != got:
            raise IndexMismatchError(f"model does not match the index: {name} is {got!r} for the model "
                                     f"but {want!r} for the index")
    check_identity_files(index_spec.identity_files, model_spec.identity_files)


def check_identity_files(index_files: dict[str, str], model_files: dict[str, str]) -> None:
    """Refuse a model whose tokenizer or config files differ from those the index was built with.

    Indexes written before these digests were recorded have none: they still load, with a warning.
    """
    if not index_files:
        if model_files:
            log.warning("the index records no tokenizer/config digests (built before they were locked): "
                        "a changed tokenizer cannot be detected; rebuild the index to lock them")
        return
    for name in sorted(set(index_files) | set(model_files)):
        want, got = index_files.get(name), model_files.get(name)
        if want == got:
            continue
        if got is None:
            change = "is missing from the model"
        elif want is None:
            change = "is new in the model"
        else:
            change = f"changed (sha256 {got[:12]} for the model, {want[:12]} for the index)"
        raise IndexMismatchError(f"model does not match the index: tokenizer/config file {name} {change}; "
                                 "serve the model the index was built with, or rebuild the index")

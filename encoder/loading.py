"""``load_encoder``: the one factory every command uses (index build, search, serve).

Settings are decided in this order, first given wins: the caller's
:class:`~encoder.config.EncoderConfig`, the model directory's ``densehybrid.json``,
the zoo's defaults for a named model, the defaults in :mod:`encoder.config`.

Kind defaults: lexical ``delade`` for ``aggretriever``/``dhr`` (``skip_mlm`` when
``skip_mlm``); for ``dlr`` ``delade`` when the directory has a term-weight head,
else ``splade``; fusion's lexical half is ``splade``; λ = 1; max lengths 32/128
(capped at the model's positions); pooling ``cls``, no normalisation.

The runtime is chosen here too (``backend``, ``precision``): an ONNX encoder is built on an
ONNX backbone from the start and keeps no torch transformer; int8 runs on ONNX Runtime,
for the kinds :mod:`encoder.precision` admits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from densehybrid.encoder import zoo
from densehybrid.encoder.backbone import Backbone, TorchBackbone
from densehybrid.encoder.base import Encoder, EncoderSpec
from densehybrid.encoder.choices import BACKENDS, GATED_KINDS, KINDS, Backend, Precision
from densehybrid.encoder.config import (
    DEFAULT_AGG_DIM, DEFAULT_DLR_DIM, DEFAULT_LAMBDA, DEFAULT_MAX_PASSAGE_LENGTH, DEFAULT_MAX_QUERY_LENGTH,
    DEFAULT_POOLING, EncoderConfig,
)
from densehybrid.encoder.device import pick_device
from densehybrid.encoder.encoders import ENCODER_CLASSES, CLSEncoder, FusionEncoder, LexicalEncoder, TransformerEncoder
from densehybrid.encoder.errors import ModelDirError
from densehybrid.encoder.precision import PrecisionError, check_precision
from densehybrid.encoder.heads import POOLER, TERM_WEIGHT, head_exists, load_head, save_head
from densehybrid.encoder.model_dir import (
    PASSAGE_DIR, QUERY_DIR, ModelDir, ModelSettings, identity_files, load_tokenizer, load_transformer, locate,
    open_model_dir, save_transformer, weights_hash, write_settings,
)
from densehybrid.encoder.tokenization import RoleTokenizer

log = logging.getLogger(__name__)

FUSION_LEXICAL_DIR, FUSION_DENSE_DIR = "lexical", "dense"


@dataclasses.dataclass(frozen=True)
class _Runtime:
    device: torch.device
    backend: Backend
    cache_root: Path | None
    precision: Precision = "fp32"


def load_encoder(config: EncoderConfig | str, *, backend: Backend = "torch", device: str | None = None,
                 cache_root: str | Path | None = None, precision: Precision = "fp32", check_admission: bool = True,
                 cuda_graphs: bool | None = None, **fields) -> Encoder:
    """Load the encoder ``config`` describes, on ``device`` (``None``: a GPU if present), run by ``backend``.

    ``config`` may be a bare model id with its settings as keyword arguments
    (``load_encoder("splade-tiny", kind="dlr")`` is ``load_encoder(EncoderConfig("splade-tiny", kind="dlr"))``).
    ``backend``: ``"torch"``, ``"onnx"`` (ONNX Runtime; raises when it cannot run), or ``"auto"``
    (ONNX Runtime on a CPU, falling back to torch with a warning; torch on a GPU).
    ``precision``: ``"fp32"``, or ``"int8"`` (ONNX Runtime's quantized graphs on a CPU, for admitted kinds;
    raises :class:`~encoder.precision.PrecisionError` otherwise; ``check_admission=False`` is for the quality
    gate that decides which kinds are admitted).
    ``cuda_graphs``: replay batches of up to 64 short texts from CUDA graphs (``encoder.graphs``); None: on
    for torch on a GPU. True on a CPU runs the same padded buckets eagerly (for tests).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if isinstance(config, str):
        config = EncoderConfig(model=config, **fields)
    elif fields:
        raise TypeError(f"give settings in the EncoderConfig, not as keywords: {sorted(fields)}")
    if not config.model:
        raise ModelDirError("no model given (a zoo name, a local directory or a hub id)")
    model = config.model
    caller = ModelSettings(**{k: v for k, v in dataclasses.asdict(config).items() if k != "model"})
    model_dir = open_model_dir(locate(model))
    settings = caller.over(_recorded(model, model_dir))
    if settings.kind is None:
        raise ModelDirError(f"{model_dir.root}: no densehybrid.json records the kind; pass kind= one of {KINDS}")
    if config.kind is not None and model_dir.settings.kind not in (None, config.kind):
        log.info("%s: loading as kind %s (the directory records %s)", model, config.kind, model_dir.settings.kind)
    if check_admission:
        check_precision(settings.kind, precision)
    if precision == "int8" and backend == "torch":
        raise PrecisionError("int8 runs on ONNX Runtime: use backend onnx (or auto), not torch")
    runtime = _Runtime(pick_device(device), backend, Path(cache_root) if cache_root is not None else None, precision)
    if settings.kind == "fusion":
        encoder = _load_fusion(model, model_dir, settings, runtime)
    else:
        encoder = _load_single(model, model_dir, settings, runtime)
    if cuda_graphs if cuda_graphs is not None else runtime.device.type == "cuda":
        encoder.replay_short_batches()
    log.info("loaded %s: kind=%s dim=%d gated=%d lexical=%s device=%s backend=%s precision=%s", model,
             encoder.spec.kind, encoder.spec.dim, encoder.spec.gated_dim, encoder.spec.lexical, encoder.device,
             encoder.backend, encoder.precision)
    return encoder


def _recorded(model_id: str, model_dir: ModelDir) -> ModelSettings:
    """The directory's densehybrid.json over the zoo's defaults for a named model."""
    zoo_defaults = ModelSettings(**zoo.ZOO[model_id].settings) if model_id in zoo.ZOO else ModelSettings()
    return model_dir.settings.over(zoo_defaults)


def _backbone(model_id: str, model_dir: ModelDir, with_mlm: bool, settings: ModelSettings, runtime: _Runtime) -> Backbone:
    query = load_transformer(model_dir.query_path, with_mlm=with_mlm)
    passage = query if model_dir.tied else load_transformer(model_dir.passage_path, with_mlm=with_mlm)
    max_positions = getattr(query.config, "max_position_embeddings", 512)
    lengths = {"query": settings.max_query_length or DEFAULT_MAX_QUERY_LENGTH,
               "passage": settings.max_passage_length or DEFAULT_MAX_PASSAGE_LENGTH}
    for role, length in lengths.items():
        if length < 2:
            raise ModelDirError(f"max {role} length {length} leaves no room for [CLS] and [SEP]")
        if length > max_positions:
            log.warning("max %s length %d exceeds the model's %d positions; using %d", role, length, max_positions,
                        max_positions)
            lengths[role] = max_positions
    tokenizer = RoleTokenizer(load_tokenizer(model_dir.query_path), lengths)
    backbone = TorchBackbone({"query": query, "passage": passage}, tokenizer, with_mlm)
    if runtime.backend == "torch":  # load_encoder refused int8 on torch
        return backbone
    from densehybrid.encoder.backends.onnx_backend import runtime_backbone

    return runtime_backbone(backbone, runtime.backend, runtime.device, cache_root=runtime.cache_root,
                            model_id=model_id, precision=runtime.precision)


def _lexical_mode(kind: str, settings: ModelSettings, model_dir: ModelDir) -> str:
    if settings.skip_mlm:
        if kind not in ENCODER_CLASSES:
            raise ModelDirError(f"skip_mlm applies to {sorted(ENCODER_CLASSES)}, not {kind}")
        if settings.lexical not in (None, "skip_mlm"):
            raise ModelDirError(f"skip_mlm contradicts lexical={settings.lexical!r}")
        return "skip_mlm"
    if settings.lexical is not None:
        return settings.lexical
    if kind == "dlr" and not head_exists(model_dir.head_dir(TERM_WEIGHT.weights), TERM_WEIGHT):
        return "splade"
    return "delade"


def _spec(model_id: str, settings: ModelSettings, backbone: Backbone, hash_dirs: list[Path], **fields) -> EncoderSpec:
    lengths = backbone.tokenizer.max_lengths
    return EncoderSpec(lam=float(settings.lam) if settings.lam is not None else DEFAULT_LAMBDA,
                       max_query_length=lengths["query"], max_passage_length=lengths["passage"],
                       vocab_size=backbone.vocab_size, model_id=model_id, weights_hash=weights_hash(hash_dirs),
                       identity_files=identity_files(hash_dirs),
                       **fields)


def _load_single(model_id: str, model_dir: ModelDir, settings: ModelSettings, runtime: _Runtime) -> TransformerEncoder:
    kind = settings.kind
    if kind == "cls":
        if settings.skip_mlm:
            raise ModelDirError("skip_mlm applies to kinds with a lexical part, not cls")
        backbone = _backbone(model_id, model_dir, False, settings, runtime)
        spec = _spec(model_id, settings, backbone, [model_dir.root], kind="cls", dim=backbone.hidden_size,
                     pooling=settings.pooling or DEFAULT_POOLING, normalize=bool(settings.normalize))
        return CLSEncoder(spec, backbone, runtime.device)
    lexical = _lexical_mode(kind, settings, model_dir)
    backbone = _backbone(model_id, model_dir, lexical != "skip_mlm", settings, runtime)
    hidden = backbone.hidden_size
    term_weight = None
    if lexical != "splade":
        term_weight = load_head(model_dir.head_dir(TERM_WEIGHT.weights), TERM_WEIGHT, input_dim=hidden, output_dim=1)
    pooler = None
    if kind in ("aggretriever", "dhr"):
        pooler = load_head(model_dir.head_dir(POOLER.weights), POOLER, input_dim=hidden)
    agg_dim = settings.agg_dim or DEFAULT_AGG_DIM
    dlr_dim = settings.dlr_dim or DEFAULT_DLR_DIM
    lexical_dim = agg_dim if kind == "aggretriever" else dlr_dim
    if kind in GATED_KINDS and backbone.vocab_size // dlr_dim > 256:
        raise ModelDirError(f"a DLR of {dlr_dim} dims over {backbone.vocab_size} terms needs "
                            f"{backbone.vocab_size // dlr_dim} rows; uint8 gates hold 256 (use dlr_dim >= "
                            f"{-(-backbone.vocab_size // 256)})")
    spec = _spec(model_id, settings, backbone, [model_dir.root], kind=kind,
                 dim=lexical_dim + (pooler.output_dim if pooler else 0),
                 gated_dim=dlr_dim if kind in GATED_KINDS else 0, skip_mlm=lexical == "skip_mlm", lexical=lexical,
                 agg_dim=agg_dim if kind == "aggretriever" else None,
                 dlr_dim=dlr_dim if kind in GATED_KINDS else None)
    return ENCODER_CLASSES[kind](spec, backbone, runtime.device, term_weight=term_weight, pooler=pooler)


def _fusion_half(reference: str | None, root: Path, what: str) -> tuple[str, ModelDir]:
    """A fusion half named in densehybrid.json (a subfolder of ``root``) or by the caller (any model id)."""
    if reference is None:
        raise ModelDirError(f"fusion needs a {what} model (dense_model=...; a zoo name, directory or hub id)")
    inside = root / reference
    return (str(inside), open_model_dir(inside)) if inside.is_dir() else (reference, open_model_dir(locate(reference)))


def _load_fusion(model_id: str, model_dir: ModelDir, settings: ModelSettings, runtime: _Runtime) -> FusionEncoder:
    if settings.skip_mlm:
        raise ModelDirError("skip_mlm does not apply to fusion (its lexical half is SPLADE-style)")
    lexical_id, lexical_dir = model_id, model_dir
    if model_dir.settings.kind == "fusion":
        lexical_id, lexical_dir = _fusion_half(settings.lexical_model, model_dir.root, "lexical")
    dense_id, dense_dir = _fusion_half(settings.dense_model, model_dir.root, "dense")
    shared = {f: getattr(settings, f) for f in ("lam", "max_query_length", "max_passage_length")}
    lexical_settings = ModelSettings(kind="dlr", lexical=settings.lexical or "splade", dlr_dim=settings.dlr_dim,
                                     **shared)
    lexical = _load_single(lexical_id, lexical_dir, lexical_settings, runtime)
    dense_settings = ModelSettings(kind="cls", pooling=settings.pooling, normalize=settings.normalize,
                                   **shared).over(_recorded(dense_id, dense_dir))
    dense = _load_single(dense_id, dense_dir, dataclasses.replace(dense_settings, kind="cls"), runtime)
    spec = dataclasses.replace(
        lexical.spec, kind="fusion", dim=lexical.spec.dim + dense.spec.dim, pooling=dense.spec.pooling,
        normalize=dense.spec.normalize, model_id=model_id, dense_model_id=dense_id,
        max_query_length=min(lexical.spec.max_query_length, dense.spec.max_query_length),
        max_passage_length=min(lexical.spec.max_passage_length, dense.spec.max_passage_length),
        weights_hash=weights_hash([lexical_dir.root, dense_dir.root]),
        identity_files=identity_files([lexical_dir.root, dense_dir.root]))
    return FusionEncoder(spec, lexical, dense)


# -- saving ---------------------------------------------------------------------
def settings_of(spec: EncoderSpec) -> ModelSettings:
    """The densehybrid.json that reloads an encoder with this spec."""
    return ModelSettings(kind=spec.kind, lexical=spec.lexical, skip_mlm=spec.skip_mlm, agg_dim=spec.agg_dim,
                         dlr_dim=spec.dlr_dim, lam=spec.lam, pooling=spec.pooling,
                         normalize=spec.normalize if spec.kind in ("cls", "fusion") else None,
                         max_query_length=spec.max_query_length, max_passage_length=spec.max_passage_length)


def _save_transformer_encoder(encoder: TransformerEncoder, path: Path) -> None:
    backbone = encoder.backbone
    if not isinstance(backbone, TorchBackbone):
        raise ModelDirError(f"cannot save a {encoder.spec.kind} encoder running on {backbone.backend}: its "
                            "transformer weights are not kept (load it with backend='torch' to save it)")
    hf_tokenizer = backbone.tokenizer.hf_tokenizer
    if backbone.tied:
        save_transformer(backbone.models["query"], hf_tokenizer, path)
    else:
        save_transformer(backbone.models["query"], hf_tokenizer, path / QUERY_DIR)
        save_transformer(backbone.models["passage"], hf_tokenizer, path / PASSAGE_DIR)
    if isinstance(encoder, LexicalEncoder):
        if encoder.term_weight is not None:
            save_head(encoder.term_weight.cpu(), path, TERM_WEIGHT)
            encoder.term_weight.to(encoder.device)
        if encoder.pooler is not None:
            save_head(encoder.pooler.cpu(), path, POOLER)
            encoder.pooler.to(encoder.device)
    write_settings(path, settings_of(encoder.spec))


def save_encoder(encoder: Encoder, path: str | Path) -> Path:
    """Write a self-describing model directory (published format + densehybrid.json), atomically.

    ``path`` must not exist yet (or be an empty directory); the files are written
    into a temporary sibling and renamed into place, so a crash leaves no half model.
    """
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ModelDirError(f"{path}: exists and is not an empty directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        if isinstance(encoder, FusionEncoder):
            _save_transformer_encoder(encoder.lexical, staging / FUSION_LEXICAL_DIR)
            _save_transformer_encoder(encoder.dense, staging / FUSION_DENSE_DIR)
            write_settings(staging, dataclasses.replace(settings_of(encoder.spec), lexical_model=FUSION_LEXICAL_DIR,
                                                         dense_model=FUSION_DENSE_DIR))
        elif isinstance(encoder, TransformerEncoder):
            _save_transformer_encoder(encoder, staging)
        else:
            raise ModelDirError(f"cannot save a {type(encoder).__name__}: it has no model files")
        if path.exists():
            path.rmdir()
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("saved %s encoder to %s", encoder.spec.kind, path)
    return path

"""Model directories: the published castorini format plus our ``densehybrid.json`` (docs/indexes.md).

A model directory is a transformers checkpoint (``config.json``, weights,
tokenizer files) with, depending on the kind, ``pooler.pt`` and
``TermWeightTrans.pt`` heads (see :mod:`encoder.heads`). Untied encoders keep
their checkpoints in ``query_model/`` and ``passage_model/``; their heads (one
file with ``linear_q``/``linear_p``) live at the top level or in ``query_model/``.

``densehybrid.json`` (:class:`ModelSettings`) records the kind and its settings so
the directory describes itself; a published checkpoint without it loads with the
settings the caller gives. A ``fusion`` directory holds its two halves in
subfolders named by ``lexical_model`` and ``dense_model``.

Backbones load strictly: weights missing from the checkpoint or of the wrong
shape raise :class:`ModelDirError` naming the directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from torch import nn

from densehybrid.encoder import zoo
from densehybrid.encoder.choices import KINDS, Kind, Lexical, Pooling
from densehybrid.encoder.checksums import sha256_file
from densehybrid.encoder.errors import ModelDirError

log = logging.getLogger(__name__)

SETTINGS_FILE = "densehybrid.json"
SETTINGS_FORMAT = 1
QUERY_DIR, PASSAGE_DIR = "query_model", "passage_model"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# files besides the weights that change what a model computes: tokenizer and architecture (the settings in
# densehybrid.json that matter are spec fields, compared one by one)
IDENTITY_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                  "sentencepiece.bpe.model", "tokenizer.model")
# checkpoint keys a backbone-only load may leave unused without being wrong
_IGNORABLE_UNUSED = ("cls.", "lm_head.", "vocab_", "pooler.", "embeddings.position_ids")


@dataclass(frozen=True)
class ModelSettings:
    """The content of ``densehybrid.json``; ``None`` means "not recorded"."""

    kind: Kind | None = None
    lexical: Lexical | None = None
    skip_mlm: bool | None = None
    agg_dim: int | None = None
    dlr_dim: int | None = None
    lam: float | None = None
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_query_length: int | None = None
    max_passage_length: int | None = None
    lexical_model: str | None = None  # fusion: the lexical half (subfolder, path, zoo name or hub id)
    dense_model: str | None = None  # fusion: the dense half (idem)

    def __post_init__(self):
        if self.kind is not None and self.kind not in KINDS:
            raise ModelDirError(f"unknown kind {self.kind!r}; known: {', '.join(KINDS)}")

    def over(self, base: "ModelSettings") -> "ModelSettings":
        """These settings where given, ``base``'s elsewhere."""
        given = {k: v for k, v in asdict(self).items() if v is not None}
        return replace(base, **given)

    def to_json(self) -> dict:
        return {"format": SETTINGS_FORMAT, **{k: v for k, v in asdict(self).items() if v is not None}}

    @classmethod
    def from_json(cls, data: dict, source: str = SETTINGS_FILE) -> "ModelSettings":
        data = dict(data)
        version = data.pop("format", SETTINGS_FORMAT)
        if version != SETTINGS_FORMAT:
            raise ModelDirError(f"{source}: format {version} is not supported (expected {SETTINGS_FORMAT})")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ModelDirError(f"{source}: unknown settings {sorted(unknown)}")
        return cls(**data)


def read_settings(directory: Path) -> ModelSettings:
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        return ModelSettings()
    try:
        return ModelSettings.from_json(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: not valid JSON ({exc})") from exc


def write_settings(directory: Path, settings: ModelSettings) -> None:
    path = Path(directory) / SETTINGS_FILE
    path.write_text(json.dumps(settings.to_json(), indent=2, sort_keys=True) + "\n")


# -- locating a model ---------------------------------------------------------
def _download_from_hub(model_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id))
    except Exception as exc:  # offline, unknown repo, bad id: all end the same way for the user
        raise ModelDirError(f"{model_id!r} is not a local directory, and the Hugging Face hub could not provide it "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                            f"pass a local model directory or a zoo name ({', '.join(zoo.ZOO)})") from exc


def locate(model_id: str) -> Path:
    """A zoo name, a local directory or a hub id -> a local directory."""
    local = Path(zoo.resolve(model_id)).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise ModelDirError(f"{local}: is a file; expected a model directory")
    if model_id.startswith((".", "/", "~")) or model_id.count("/") != 1:
        raise ModelDirError(f"{model_id}: no such model directory (and not a hub id of the form owner/name)")
    return _download_from_hub(model_id)


@dataclass(frozen=True)
class ModelDir:
    """Where one (possibly untied) checkpoint's parts are."""

    root: Path
    settings: ModelSettings
    query_path: Path
    passage_path: Path

    @property
    def tied(self) -> bool:
        return self.query_path == self.passage_path

    def head_dir(self, weights_file: str) -> Path:
        """The top level if it holds the head file, else ``query_model/`` if that does (untied layouts)."""
        if not (self.root / weights_file).is_file() and (self.query_path / weights_file).is_file():
            return self.query_path
        return self.root


def open_model_dir(root: Path) -> ModelDir:
    """Inspect a local directory: settings, and tied vs ``query_model/`` + ``passage_model/``."""
    root = Path(root)
    settings = read_settings(root)
    query, passage = root / QUERY_DIR, root / PASSAGE_DIR
    if query.is_dir() or passage.is_dir():
        for sub in (query, passage):
            if not (sub / "config.json").is_file():
                raise ModelDirError(f"{sub / 'config.json'}: missing (untied encoders need both "
                                    f"{QUERY_DIR}/ and {PASSAGE_DIR}/ checkpoints)")
        return ModelDir(root, settings, query, passage)
    if settings.kind != "fusion" and not (root / "config.json").is_file():
        raise ModelDirError(f"{root / 'config.json'}: missing (expected a transformers checkpoint)")
    return ModelDir(root, settings, root, root)


def weights_hash(directories: list[Path]) -> str:
    """sha256 over every weight file (relative name and bytes) under the directories, in a stable order."""
    digest = hashlib.sha256()
    for directory in directories:
        directory = Path(directory)
        files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
        if not files:
            raise ModelDirError(f"{directory}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
        for path in files:
            digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
            digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def identity_files(directories: list[Path]) -> dict[str, str]:
    """sha256 of every tokenizer and config file (:data:`IDENTITY_FILES`) under the directories, by relative name.

    With several directories (fusion) each name starts with its directory's name.
    """
    directories = [Path(d) for d in directories]
    digests = {}
    for directory in directories:
        prefix = f"{directory.name}/" if len(directories) > 1 else ""
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name in IDENTITY_FILES):
            digests[prefix + path.relative_to(directory).as_posix()] = sha256_file(path)
    return digests


# -- transformers checkpoints ---------------------------------------------------
@contextlib.contextmanager
def _quiet_transformers():
    """transformers prints a load report and progress bars; we check and log ourselves."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _backbone_kwargs(config) -> dict:
    from transformers import AutoModel

    model_class = AutoModel._model_mapping[type(config)]
    accepts = inspect.signature(model_class.__init__).parameters
    return {"add_pooling_layer": False} if "add_pooling_layer" in accepts else {}


def load_transformer(path: Path, *, with_mlm: bool) -> nn.Module:
    """A masked-LM model (``with_mlm``) or its backbone only (no MLM head is built), in eval mode."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    path = Path(path)
    try:
        config = AutoConfig.from_pretrained(path)
        with _quiet_transformers():
            if with_mlm:
                model, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
            else:
                model, info = AutoModel.from_pretrained(path, output_loading_info=True, **_backbone_kwargs(config))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelDirError(f"{path}: cannot load a {'masked-LM' if with_mlm else ''} transformers checkpoint "
                            f"({exc})") from exc
    problems = [f"missing weights {sorted(info['missing_keys'])}"] if info["missing_keys"] else []
    if info["mismatched_keys"]:
        problems.append(f"weights of the wrong shape {sorted(map(str, info['mismatched_keys']))}")
    if problems:
        raise ModelDirError(f"{path}: {'; '.join(problems)} for {type(model).__name__}")
    unused = sorted(k for k in info["unexpected_keys"] if not k.startswith(_IGNORABLE_UNUSED))
    if unused:
        log.warning("%s: checkpoint weights not used by %s: %s", path, type(model).__name__, unused[:10])
    return model.eval()


def load_tokenizer(path: Path):
    """The checkpoint's fast tokenizer (converted from ``vocab.txt`` if needed)."""
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(Path(path))
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{path}: cannot load a tokenizer ({exc})") from exc
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ModelDirError(f"{path}: needs a fast (Rust) tokenizer; found {type(tokenizer).__name__}")
    return tokenizer


def save_transformer(model: nn.Module, tokenizer, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with _quiet_transformers():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

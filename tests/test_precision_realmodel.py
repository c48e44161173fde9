"""int8 on the offline MiniLM: vectors close to float32 on real passages.

Stated bound: cosine of int8 to float32 passage vectors >= 0.97 (the quality gate measured a minimum of
0.977 and a mean of 0.995 over the 5,000 passages of msmarco-dl-5k; docs/precision.md). The gate itself
(four 5k-passage builds) takes far longer than a test: ``python -m densehybrid.bench.parts.int8_gate``.
"""

import json
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from densehybrid.encoder.loading import load_encoder

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]

DATA = Path("/work/shared/data/msmarco-dl-5k")


def test_minilm_int8_passages_stay_close_to_float32(minilm_dir):
    if not (DATA / "corpus.jsonl").is_file():
        pytest.skip(f"{DATA} (the real evaluation set) is not on this machine")
    with open(DATA / "corpus.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in islice(f, 200)]
    fp32 = load_encoder("minilm", backend="onnx", device="cpu").encode(texts, "passage").values
    int8 = load_encoder("minilm", backend="onnx", precision="int8", device="cpu").encode(texts, "passage").values
    cos = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
    assert cos.min() >= 0.97, np.sort(cos)[:5]
    assert cos.mean() < 0.99999  # the quantized graph ran


def test_the_int8_gate_compares_both_precisions_on_a_judged_subset(tmp_path):
    """The gate end to end on splade-tiny over the first 40 judgements of three queries: both indexes built and
    evaluated, and a row whose figures are measured, not defaults."""
    from densehybrid.bench.parts.int8_gate import compare

    if not (DATA / "corpus.jsonl").is_file():
        pytest.skip(f"{DATA} (the real evaluation set) is not on this machine")
    data = tmp_path / "subset"
    (data / "qrels").mkdir(parents=True)
    with open(DATA / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in islice(f, 3)]
    wanted = {q["_id"] for q in queries}
    judged = [line for line in (DATA / "qrels" / "test.tsv").read_text().splitlines()
              if line.split("\t")[0] in wanted][:40]
    passages = {line.split("\t")[1] for line in judged}
    with open(DATA / "corpus.jsonl", encoding="utf-8") as f:
        corpus = [line for line in f if json.loads(line)["_id"] in passages]
    (data / "corpus.jsonl").write_text("".join(corpus), encoding="utf-8")
    (data / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    (data / "qrels" / "test.tsv").write_text("\n".join(judged) + "\n")
    row = compare("dlr", data, tmp_path / "work", max_drop=0.005, min_agreement=0.99)
    assert 0.0 < row.ndcg_fp32 <= 1.0 and 0.0 < row.ndcg_int8 <= 1.0
    assert 0.9 < row.min_cosine <= row.mean_cosine < 1.0  # the quantized graph ran, close to float32
    assert row.gate_agreement is not None and 0.9 < row.gate_agreement <= 1.0

"""Short batches run in padded (rows, length) buckets give every row the vector it gets alone.

On the CPU the buckets run eagerly (the twin of the CUDA graph replay, which the ``gpu``-marked cases at
the end check on a GPU against the eager CUDA forward). The reference is the plain path: the same encoder
without buckets, so both sides are float32 and the only difference is padding.
"""

from __future__ import annotations

import numpy as np
import pytest

from densehybrid.encoder.base import KINDS, TokenizedText
from densehybrid.encoder.encoders import MODEL_KEY
from densehybrid.encoder.graphs import Buckets
from densehybrid.encoder.loading import load_encoder

RNG = np.random.default_rng(5)


def items(count: int, lengths: tuple[int, int], vocab: int) -> list[TokenizedText]:
    """``count`` texts of random ids, [CLS] ... [SEP], between ``lengths`` tokens long."""
    rows = []
    for _ in range(count):
        n = int(RNG.integers(lengths[0], lengths[1] + 1))
        rows.append(TokenizedText({MODEL_KEY: [101, *RNG.integers(1000, vocab, n - 2).tolist(), 102]}))
    return rows


def test_buckets_pick_the_smallest_shape_that_holds_the_batch():
    buckets = Buckets(rows=(1, 2, 4, 8), lengths=(8, 16, 32))
    assert buckets.pick(1, 3) == (1, 8)
    assert buckets.pick(3, 9) == (4, 16)
    assert buckets.pick(8, 32) == (8, 32)
    assert buckets.pick(9, 5) is None and buckets.pick(2, 33) is None


def test_buckets_are_capped_at_the_role_length():
    assert Buckets(rows=(4, 1), lengths=(8, 16, 32)).capped(20) == Buckets(rows=(1, 4), lengths=(8, 16, 20))
    assert Buckets(lengths=(8, 16, 32)).capped(8).lengths == (8,)


def _pair(model_dir, kind, **options):
    plain = load_encoder(str(model_dir), kind=kind, device="cpu", cuda_graphs=False, **options)
    replayed = load_encoder(str(model_dir), kind=kind, device="cpu", cuda_graphs=True, **options)
    return plain, replayed


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_in_buckets_equals_the_plain_forward(tiny_bert_dir, kind):
    options = {"dense_model": str(tiny_bert_dir)} if kind == "fusion" else {}
    plain, replayed = _pair(tiny_bert_dir, kind, **options)
    vocab = plain.spec.vocab_size or 1000
    # 1 and 3 rows pad into buckets of 1 and 4; 70 rows exceed the largest bucket and run as before
    for count, lengths in ((1, (3, 5)), (3, (4, 30)), (70, (3, 12))):
        batch = items(count, lengths, vocab)
        if kind == "fusion":
            batch = [TokenizedText({"lexical": t.ids[MODEL_KEY], "dense": t.ids[MODEL_KEY]}) for t in batch]
        for role in ("query", "passage"):
            a, b = plain.encode_tokenized(batch, role), replayed.encode_tokenized(batch, role)
            np.testing.assert_allclose(b.values, a.values, rtol=1e-4, atol=1e-5)
            if a.gates is not None:
                np.testing.assert_array_equal(b.gates, a.gates)


def test_a_batch_replays_in_one_bucket_and_a_long_text_runs_outside(tiny_bert_dir):
    plain, replayed = _pair(tiny_bert_dir, "aggretriever")
    forward = replayed._replayed["query"]
    batch = items(5, (3, 9), plain.spec.vocab_size)
    replayed.encode_tokenized(batch, "query")
    assert list(forward._captured) == [(8, 16)]
    long_text = items(1, (40, 40), plain.spec.vocab_size)  # over the 32 tokens of the largest bucket
    np.testing.assert_allclose(replayed.encode_tokenized(long_text, "query").values,
                               plain.encode_tokenized(long_text, "query").values, rtol=1e-4, atol=1e-5)
    assert list(forward._captured) == [(8, 16)]


def test_prepare_replay_fills_every_bucket_of_the_role(tiny_bert_dir):
    encoder = load_encoder(str(tiny_bert_dir), kind="dhr", device="cpu", cuda_graphs=True)
    encoder.prepare_replay("query")
    forward = encoder._replayed["query"]
    assert sorted(forward._captured) == sorted(forward.buckets.all())
    assert not encoder._replayed["passage"]._captured


def test_graphs_stay_off_on_the_cpu_unless_asked(tiny_bert_dir):
    assert not load_encoder(str(tiny_bert_dir), kind="cls", device="cpu")._replayed


def test_onnx_backbones_do_not_replay(tiny_bert_dir, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    encoder = load_encoder(str(tiny_bert_dir), kind="cls", device="cpu", backend="onnx", cache_root=tmp_path,
                           cuda_graphs=True)
    assert not encoder._replayed


# -- on a GPU: the graphs themselves ----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cls", "aggretriever", "dhr"])
def test_graph_replay_equals_the_eager_cuda_forward(tiny_bert_dir, kind):
    eager = load_encoder(str(tiny_bert_dir), kind=kind, device="cuda", cuda_graphs=False)
    graphs = load_encoder(str(tiny_bert_dir), kind=kind, device="cuda", cuda_graphs=True)
    graphs.prepare_replay("query")
    assert all(b.graph is not None for b in graphs._replayed["query"]._captured.values())
    cases = [("query", 1, (3, 12)), ("query", 3, (4, 30)), ("query", 64, (3, 12)), ("query", 65, (3, 12)),
             ("passage", 8, (60, 128)), ("passage", 32, (3, 40))]
    for role, count, lengths in cases:
        batch = items(count, lengths, eager.spec.vocab_size)
        for _ in range(2):  # a second replay of the same bucket gives the same rows
            a, b = eager.encode_tokenized(batch, role), graphs.encode_tokenized(batch, role)
            np.testing.assert_allclose(b.values, a.values, rtol=1e-2, atol=2e-2)
            if a.gates is not None:
                assert np.mean(a.gates == b.gates) >= 0.99
    assert graphs._replayed["passage"].graph_count == 2  # both passage batches replayed from graphs

"""Encoders on tiny random BERT/DistilBERT checkpoints in the published format.

Outputs are checked against an independent numpy computation of the math in docs/concepts.md from
the raw transformers outputs; then padding invariance, chunking, round trips,
skip-MLM without a head, thread-safe tokenization.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from densehybrid.encoder import representations as R
from densehybrid.encoder.base import Encoder
from densehybrid.encoder.encoders import FusionEncoder, TransformerEncoder
from densehybrid.encoder.errors import DeviceError, ModelDirError
from densehybrid.encoder.heads import POOLER, TERM_WEIGHT, load_head
from densehybrid.encoder.loading import load_encoder, save_encoder
from densehybrid.encoder.device import autocast, pick_device
from densehybrid.encoder.tokenization import length_chunks

V = 30522
SHORT = "what is a dense retriever"
LONG = " ".join(["the history of the city school and the river bank with music and coffee"] * 12)

# (kind, load kwargs) covering every kind and lexical form
VARIANTS = {
    "aggretriever": dict(kind="aggretriever"),
    "aggretriever-skip-mlm": dict(kind="aggretriever", skip_mlm=True),
    "dhr": dict(kind="dhr"),
    "dlr": dict(kind="dlr"),
    "cls": dict(kind="cls"),
    "cls-mean-normalized": dict(kind="cls", pooling="mean", normalize=True),
}


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def tiny_dir(request, tiny_bert_dir, tiny_distilbert_dir):
    return tiny_bert_dir if request.param == "bert" else tiny_distilbert_dir


@pytest.fixture(scope="module")
def fusion(tiny_bert_dir, tiny_distilbert_dir):
    return load_encoder(str(tiny_bert_dir), kind="fusion", dense_model=str(tiny_distilbert_dir), pooling="mean",
                        normalize=True, lam=3.0)


# -- an independent numpy reading of docs/concepts.md ----------------------------------
def _raw(model_dir, text, with_mlm=True):
    """Unpadded ids, last hidden states (L, d) and MLM logits (L, V) straight from transformers."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    ids = tokenizer(text, truncation=True, max_length=128)["input_ids"]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return np.array(ids), out.hidden_states[-1][0].double().numpy(), out.logits[0].double().numpy()


def _head(model_dir, files, hidden, role="passage"):
    head = load_head(model_dir, files, input_dim=hidden.shape[1])
    layer = head.linear_q if role == "query" else head.linear_p
    return hidden @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()


def _np_delade(hidden, logits, w):
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return (w[1:, None] * p[1:]).max(0)  # real tokens: all but [CLS] (no padding here)


def _np_skip_mlm(ids, w):
    v = np.zeros(V)
    for token_id, weight in zip(ids[1:], w[1:]):
        v[token_id] = max(v[token_id], weight)
    return v


def _np_agg(v, d_agg=640):
    n = 2 * d_agg
    r = V % n
    r = r - n if r > 1000 else r
    x = v[r:] if r >= 0 else np.concatenate([v, np.zeros(-r)])
    m = x.reshape(-1, n).max(0)
    pos, neg = m[0::2], m[1::2]
    return np.where(pos > neg, pos, -neg)


def _np_dlr(v, dim=768):
    x = v[V % dim:].reshape(-1, dim)
    return x.max(0), x.argmax(0)


@pytest.mark.parametrize("variant", ["aggretriever", "aggretriever-skip-mlm", "dhr", "dlr"])
def test_lexical_kinds_match_numpy(tiny_dir, variant):
    ids, hidden, logits = _raw(tiny_dir, SHORT)
    w = _head(tiny_dir, TERM_WEIGHT, hidden)[:, 0]
    assert (w < 0).any() and (w > 0).any(), "test checkpoint should exercise both signs of term weights"
    v = _np_skip_mlm(ids, w) if variant.endswith("skip-mlm") else _np_delade(hidden, logits, w)
    dense = _head(tiny_dir, POOLER, hidden[:1])[0]
    encoded = load_encoder(str(tiny_dir), **VARIANTS[variant]).encode([SHORT], "passage")
    if variant.startswith("aggretriever"):
        expected = np.concatenate([_np_agg(v), dense])
        assert encoded.gates is None
    else:
        values, index = _np_dlr(v)
        expected = np.concatenate([values, dense]) if variant == "dhr" else values
        np.testing.assert_array_equal(encoded.gates[0], index.astype(np.uint8))
    np.testing.assert_allclose(encoded.values[0], expected, rtol=1e-5, atol=1e-6)


def test_splade_dlr_matches_numpy(tiny_bert_dir, fusion):
    ids, hidden, logits = _raw(tiny_bert_dir, SHORT)
    v = np.log1p(np.maximum(logits, 0)).max(0)  # the SPLADE vector: every token, [CLS] included
    values, index = _np_dlr(v)
    encoded = fusion.encode([SHORT], "query")
    np.testing.assert_allclose(encoded.values[0, :768], values, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(encoded.gates[0], index)
    assert fusion.spec.lexical == "splade" and fusion.spec.gated_dim == 768


def test_cls_pooling_matches_numpy(tiny_dir):
    _, hidden, _ = _raw(tiny_dir, SHORT)
    cls_vec = load_encoder(str(tiny_dir), kind="cls").encode([SHORT], "query").values[0]
    np.testing.assert_allclose(cls_vec, hidden[0], rtol=1e-5, atol=1e-6)
    mean = hidden.mean(0)
    mean_vec = load_encoder(str(tiny_dir), kind="cls", pooling="mean", normalize=True).encode([SHORT], "query")
    np.testing.assert_allclose(mean_vec.values[0], mean / np.linalg.norm(mean), rtol=1e-5, atol=1e-6)


def test_untied_checkpoints_use_their_role(tiny_untied_dir):
    encoder = load_encoder(str(tiny_untied_dir), kind="dhr")
    assert not encoder.backbone.tied and not encoder.pooler.tied
    query, passage = encoder.encode([SHORT], "query"), encoder.encode([SHORT], "passage")
    assert not np.allclose(query.values, passage.values)
    _, hidden, _ = _raw(tiny_untied_dir / "query_model", SHORT)
    np.testing.assert_allclose(query.values[0, 768:], _head(tiny_untied_dir, POOLER, hidden[:1], "query")[0],
                               rtol=1e-5, atol=1e-6)


# -- padding invariance, chunking ----------------------------------------------------
def _assert_same(a, b, atol=1e-5):
    np.testing.assert_allclose(a.values, b.values, rtol=0, atol=atol)
    if a.gates is not None:
        np.testing.assert_array_equal(a.gates, b.gates)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("role", ["query", "passage"])
def test_padding_invariance(tiny_dir, variant, role):
    encoder = load_encoder(str(tiny_dir), **VARIANTS[variant])
    alone = encoder.encode([SHORT], role)
    batch = encoder.encode([LONG, SHORT, "cat"], role)
    _assert_same(alone, batch[1:2])
    _assert_same(encoder.encode(["cat"], role), batch[2:3])


def test_padding_invariance_fusion(fusion):
    for role in ("query", "passage"):
        _assert_same(fusion.encode([SHORT], role), fusion.encode([LONG, SHORT], role)[1:2])


def test_length_chunks_respect_budget_and_cover_every_row():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=300).tolist()
    chunks = length_chunks(lengths, 512)
    assert sorted(i for c in chunks for i in c) == list(range(300))
    for chunk in chunks:
        longest = max(lengths[i] for i in chunk)
        assert len(chunk) * longest <= 512 or len(chunk) == 1
    assert length_chunks([600, 3], 512) == [[0], [1]]
    assert [len(c) for c in length_chunks([2] * 10, 512, max_rows=4)] == [4, 4, 2]
    assert length_chunks([], 512) == []


def test_mlm_batches_are_chunked_to_bound_memory(tiny_bert_dir):
    """A batch of 150-token passages never meets the MLM head at once (logits stay <= budget x V)."""
    encoder = load_encoder(str(tiny_bert_dir), kind="dhr", max_passage_length=150)
    assert encoder.token_budget * V * 4 <= 64 * 2**20  # one float32 logits tensor <= 64 MB
    plan = length_chunks([150] * 128, encoder.token_budget)  # a batch of 128 passages of 150 tokens
    assert len(plan) > 1 and max(len(c) for c in plan) * 150 <= encoder.token_budget
    shapes = []
    hook = encoder.backbone.models["passage"].register_forward_hook(
        lambda module, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        items = encoder.tokenize([LONG + f" {i}" for i in range(12)], "passage")
        assert {len(t.ids["model"]) for t in items} == {150}
        chunked = encoder.encode_tokenized(items, "passage")
    finally:
        hook.remove()
    assert len(shapes) > 1 and sum(b for b, _ in shapes) == 12
    assert all(b * length <= encoder.token_budget for b, length in shapes)
    assert encoder.max_rows * V * 4 <= 32 * 2**20  # short texts: the (rows, V) lexical vectors stay small
    encoder.token_budget = 10**9  # one forward: same result
    _assert_same(encoder.encode_tokenized(items[:7], "passage"), chunked[:7])


def test_empty_batch_has_the_layout(tiny_bert_dir, fusion):
    for encoder in (load_encoder(str(tiny_bert_dir), kind="dhr"), load_encoder(str(tiny_bert_dir), kind="cls"),
                    fusion):
        empty = encoder.encode([], "query")
        assert empty.values.shape == (0, encoder.spec.dim) and empty.values.dtype == np.float32
        assert (empty.gates is None) == (encoder.spec.gated_dim == 0)


# -- skip-MLM -----------------------------------------------------------------------
def _tensors(out):
    """Every tensor inside a forward output (tensor, tuple, or transformers ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return [out]
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else []
    return [t for item in items for t in _tensors(item)]


def test_skip_mlm_has_no_mlm_head_and_never_computes_logits(tiny_dir, monkeypatch):
    encoder = load_encoder(str(tiny_dir), kind="aggretriever", skip_mlm=True)
    assert encoder.spec.skip_mlm and encoder.spec.lexical == "skip_mlm"
    model = encoder.backbone.models["query"]
    assert not hasattr(model, "cls") and not hasattr(model, "vocab_projector")
    assert type(model).__name__ in ("BertModel", "DistilBertModel")
    # no layer of the loaded encoder can produce vocabulary-sized outputs ...
    for module in encoder.backbone.models["query"].modules():
        assert getattr(module, "out_features", 0) != V
    # ... and no output of any forward has a vocabulary-sized last dimension
    seen = []
    handles = [m.register_forward_hook(lambda mod, i, out: seen.append(out)) for m in model.modules()]

    def forbidden(*args, **kwargs):
        raise AssertionError("an MLM-logits function was called on the skip-MLM path")

    monkeypatch.setattr(R, "term_weighted_mlm", forbidden)
    monkeypatch.setattr(R, "splade_lexical", forbidden)
    try:
        encoded = encoder.encode([SHORT, LONG], "query")
    finally:
        for h in handles:
            h.remove()
    tensors = [t for out in seen for t in _tensors(out)]
    assert tensors and all(t.shape[-1] != V for t in tensors)
    assert encoded.values.shape == (2, 640 + 16)


def test_skip_mlm_differs_from_full_mlm(tiny_bert_dir):
    full = load_encoder(str(tiny_bert_dir), kind="aggretriever").encode([SHORT], "query")
    skip = load_encoder(str(tiny_bert_dir), kind="aggretriever", skip_mlm=True).encode([SHORT], "query")
    np.testing.assert_allclose(full.values[0, 640:], skip.values[0, 640:], rtol=1e-5, atol=1e-6)  # same [CLS]
    assert not np.allclose(full.values[0, :640], skip.values[0, :640])


# -- round trips ---------------------------------------------------------------------
ROUND_TRIP = ["aggretriever", "aggretriever-skip-mlm", "dhr", "dlr", "cls-mean-normalized"]


@pytest.mark.parametrize("variant", ROUND_TRIP)
def test_round_trip_published_then_saved(tiny_dir, tmp_path, variant):
    texts = [SHORT, LONG, "cat"]
    first = load_encoder(str(tiny_dir), **VARIANTS[variant], lam=2.5, max_query_length=24)
    saved = save_encoder(first, tmp_path / "saved")
    again = load_encoder(str(saved))  # no kind: densehybrid.json describes it
    assert again.spec == first.spec.__class__(**{**first.spec.to_dict(), "model_id": str(saved),
                                                   "weights_hash": again.spec.weights_hash,
                                                   "identity_files": again.spec.identity_files})
    for role in ("query", "passage"):
        a, b = first.encode(texts, role), again.encode(texts, role)
        np.testing.assert_array_equal(a.values, b.values)
        if a.gates is not None:
            np.testing.assert_array_equal(a.gates, b.gates)


def test_round_trip_untied(tiny_untied_dir, tmp_path):
    first = load_encoder(str(tiny_untied_dir), kind="dhr")
    again = load_encoder(str(save_encoder(first, tmp_path / "saved")))
    assert (tmp_path / "saved" / "query_model" / "config.json").is_file()
    for role in ("query", "passage"):
        np.testing.assert_array_equal(first.encode([SHORT], role).values, again.encode([SHORT], role).values)


def test_round_trip_fusion(fusion, tmp_path):
    again = load_encoder(str(save_encoder(fusion, tmp_path / "fusion")))
    assert isinstance(again, FusionEncoder)
    assert (again.spec.lam, again.spec.pooling, again.spec.normalize) == (3.0, "mean", True)
    a, b = fusion.encode([SHORT, LONG], "query"), again.encode([SHORT, LONG], "query")
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.gates, b.gates)


def test_save_refuses_a_non_empty_target(tiny_bert_dir, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(ModelDirError, match="not an empty directory"):
        save_encoder(load_encoder(str(tiny_bert_dir), kind="cls"), tmp_path / "taken")


# -- spec, hashing, tokenization, terms, devices -------------------------------------
def test_spec_layout_and_hash(tiny_bert_dir, tiny_distilbert_dir, fusion):
    dhr = load_encoder(str(tiny_bert_dir), kind="dhr", lam=0.5)
    assert (dhr.spec.dim, dhr.spec.gated_dim, dhr.spec.dlr_dim, dhr.spec.lam) == (768 + 16, 768, 768, 0.5)
    agg = load_encoder(str(tiny_bert_dir), kind="aggretriever", agg_dim=320)
    assert (agg.spec.dim, agg.spec.gated_dim, agg.spec.agg_dim) == (320 + 16, 0, 320)
    dlr = load_encoder(str(tiny_bert_dir), kind="dlr", dlr_dim=256)
    assert dlr.encode([SHORT], "query").gates.shape == (1, 256)
    again = load_encoder(str(tiny_bert_dir), kind="cls")
    other = load_encoder(str(tiny_distilbert_dir), kind="cls")
    assert len(dhr.spec.weights_hash) == 64 and dhr.spec.weights_hash == again.spec.weights_hash
    assert other.spec.weights_hash != dhr.spec.weights_hash
    assert fusion.spec.weights_hash not in (dhr.spec.weights_hash, other.spec.weights_hash)
    assert fusion.spec.dim == 768 + 32 and fusion.spec.dense_model_id == str(tiny_distilbert_dir)


def test_truncation_per_role(tiny_bert_dir):
    encoder = load_encoder(str(tiny_bert_dir), kind="dlr", max_query_length=8, max_passage_length=20)
    q, p = encoder.tokenize([LONG, "cat"], "query"), encoder.tokenize([LONG], "passage")
    assert len(q[0].ids["model"]) == 8 and q[0].truncated and not q[1].truncated
    assert len(p[0].ids["model"]) == 20 and q[0].ids["model"][-1] == 102  # [SEP] kept
    assert q[1].ids["model"][0] == 101


def test_tokenize_is_thread_safe(tiny_bert_dir, fusion):
    encoder = load_encoder(str(tiny_bert_dir), kind="dlr", max_query_length=8)
    texts = [f"{LONG[: (i * 37) % len(LONG)]} {i}" for i in range(64)]
    expected = {role: [t.ids for t in enc.tokenize(texts, role)]
                for enc in (encoder,) for role in ("query", "passage")}
    start = threading.Barrier(8)

    def work(i):
        role = ("query", "passage")[i % 2]
        start.wait()
        return role, [[t.ids for t in encoder.tokenize(texts, role)] for _ in range(5)]

    with ThreadPoolExecutor(8) as pool:
        for role, runs in pool.map(work, range(8)):
            assert all(run == expected[role] for run in runs)
    fusion_items = fusion.tokenize(texts, "query")
    assert all(set(t.ids) == {"lexical", "dense"} for t in fusion_items)


def test_term_returns_the_wordpiece(tiny_bert_dir, fusion):
    encoder = load_encoder(str(tiny_bert_dir), kind="dlr")
    ids = encoder.tokenize(["dense retrieval"], "query")[0].ids["model"]
    assert [encoder.term(i) for i in ids] == ["[CLS]", "dense", "retrieval", "[SEP]"]
    assert fusion.term(ids[1]) == "dense"
    with pytest.raises(KeyError):
        encoder.term(10**6)


def test_dlr_gates_name_the_text_terms(tiny_bert_dir):
    """Skip-MLM puts weight only on the text's own ids, so the DLR terms are exactly those words."""
    encoder = load_encoder(str(tiny_bert_dir), kind="dhr", skip_mlm=True)
    encoded = encoder.encode(["cat river music"], "query")
    positive = encoded.values[0, :768] > 0
    ids = R.dlr_term_ids(torch.from_numpy(encoded.gates[0]).long(), V)[torch.from_numpy(positive)]
    assert {encoder.term(int(i)) for i in ids} <= {"cat", "river", "music", "[SEP]"}


def test_device_choice():
    assert pick_device("cpu").type == "cpu"
    assert pick_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("auto") == pick_device(None)
    with pytest.raises(DeviceError):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            pick_device("cuda")
    with autocast(torch.device("cpu")):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.float32


@pytest.mark.gpu
def test_cuda_matches_cpu(tiny_bert_dir):
    cpu = load_encoder(str(tiny_bert_dir), kind="dhr", device="cpu")
    gpu = load_encoder(str(tiny_bert_dir), kind="dhr", device="cuda")
    assert gpu.device.startswith("cuda")
    a, b = cpu.encode([SHORT, LONG], "passage"), gpu.encode([SHORT, LONG], "passage")
    np.testing.assert_allclose(a.values, b.values, atol=5e-2)  # fp16 autocast
    assert b.values.dtype == np.float32


def test_encoders_implement_the_interface(tiny_bert_dir, fusion):
    for encoder in (load_encoder(str(tiny_bert_dir), kind="dhr"), fusion):
        assert isinstance(encoder, Encoder)
        assert encoder.device == "cpu" or encoder.device.startswith("cuda")
    assert isinstance(fusion.lexical, TransformerEncoder)

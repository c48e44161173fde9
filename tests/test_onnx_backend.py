"""ONNX Runtime backbone vs torch: same hidden states, logits and §2 vectors to a stated tolerance.

Tolerance: ONNX Runtime fuses and reorders float32 reductions, so outputs differ from
torch by rounding only. We require |onnx - torch| <= 1e-5 + 1e-5·|torch| on hidden
states, logits and every §2 vector (measured: ~3e-6 on DistilBERT-base shape).
"""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM, BertModel, DistilBertConfig, DistilBertForMaskedLM

from encoder import representations as R
from encoder.backends import onnx_backend, onnx_export
from encoder.backends.backbone import BackboneError, TorchBackbone
from encoder.backends.onnx_backend import OnnxBackbone, make_backbone, onnx_backbone_for, providers_for

ATOL = RTOL = 1e-5


def assert_close(got, expect):
    np.testing.assert_allclose(got.numpy(), expect.numpy(), rtol=RTOL, atol=ATOL)


def tiny_bert_mlm(seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return BertForMaskedLM(cfg).eval()


def tiny_distilbert_mlm(seed=0):
    torch.manual_seed(seed)
    cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    return DistilBertForMaskedLM(cfg).eval()


def padded_batch(seed=0, lengths=(19, 7, 12, 3)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[:, 0] = 101
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def pair(request, tmp_path_factory):
    model = tiny_bert_mlm() if request.param == "bert" else tiny_distilbert_mlm()
    return TorchBackbone(model), onnx_backbone_for(model, tmp_path_factory.mktemp("onnx"))


@torch.inference_mode()
def test_hidden_states_and_logits_match_torch_on_padded_batches(pair):
    torch_bb, onnx_bb = pair
    for seed, lengths in [(0, (19, 7, 12, 3)), (1, (5,)), (2, (40, 40))]:  # other shapes than the export example
        ids, mask = padded_batch(seed, lengths)
        valid = mask.bool()  # padded positions are never read by the §2 math
        h_torch, h_onnx = torch_bb.hidden_states(ids, mask), onnx_bb.hidden_states(ids, mask)
        assert h_onnx.shape == h_torch.shape
        assert_close(h_onnx[valid], h_torch[valid])
        rows = h_torch[valid]
        assert_close(onnx_bb.mlm_logits(rows), torch_bb.mlm_logits(rows))


@torch.inference_mode()
def test_onnx_honours_padding_a_text_alone_equals_it_in_a_batch(pair):
    _, onnx_bb = pair
    ids, mask = padded_batch(3, (4, 17))
    alone = onnx_bb.hidden_states(ids[:1, :4], mask[:1, :4])
    batched = onnx_bb.hidden_states(ids, mask)[:1, :4]
    assert_close(batched, alone)


@torch.inference_mode()
def test_every_lexical_form_and_pooling_matches_torch(pair):
    """The §2 vectors of every kind, computed on each backend's outputs (shared math)."""
    torch_bb, onnx_bb = pair
    ids, mask = padded_batch(4)
    term_layer = torch.nn.Linear(torch_bb.hidden_size, 1)

    def vectors(bb):
        h = bb.hidden_states(ids, mask)
        logits = bb.mlm_logits(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:2], -1)
        w = term_layer(h).squeeze(-1)
        delade = R.term_weighted_mlm(logits, w, mask)
        return {
            "aggretriever": R.aggregate_full(delade, 640),
            "aggretriever_skip_mlm": R.aggregate_full(R.skip_mlm_lexical(ids, w, mask, bb.vocab_size), 640),
            "dhr_values": R.densify(delade, 768)[0],
            "splade_dlr": R.densify(R.splade_lexical(logits, mask), 768)[0],
            "cls": R.cls_pool(h),
            "mean": R.l2_normalize(R.mean_pool(h, mask)),
        }

    got, expect = vectors(onnx_bb), vectors(torch_bb)
    for name in expect:
        assert_close(got[name], expect[name])


def test_model_without_head_exports_backbone_only(tmp_path):
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    onnx_bb = onnx_backbone_for(model, tmp_path)
    assert not onnx_bb.has_mlm_head and not (onnx_bb.export_dir / onnx_export.HEAD_FILE).exists()
    ids, mask = padded_batch(5)
    with torch.inference_mode():
        assert_close(onnx_bb.hidden_states(ids, mask)[mask.bool()], TorchBackbone(model).hidden_states(ids, mask)[mask.bool()])
    with pytest.raises(BackboneError, match="without an MLM head"):
        onnx_bb.mlm_logits(torch.zeros(2, 32))
    with pytest.raises(BackboneError, match="no MLM head"):
        TorchBackbone(model).mlm_logits(torch.zeros(2, 32))


def test_export_is_cached_by_weights_and_published_atomically(tmp_path):
    model = tiny_bert_mlm(seed=1)
    first = onnx_export.ensure_exported(model, tmp_path)
    stamp = (first / onnx_export.BACKBONE_FILE).stat().st_mtime_ns
    assert onnx_export.ensure_exported(model, tmp_path) == first
    assert (first / onnx_export.BACKBONE_FILE).stat().st_mtime_ns == stamp  # not exported again
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[5, 0] += 1.0
    second = onnx_export.ensure_exported(model, tmp_path)
    assert second != first
    meta = json.loads((second / onnx_export.META_FILE).read_text())
    assert meta["weights_key"] == onnx_export.weights_key(model) and meta["opset"] == onnx_export.OPSET
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])  # no temp dirs left


def test_missing_export_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="export.json"):
        OnnxBackbone(tmp_path)


def test_providers_cpu_and_cuda_twin(monkeypatch):
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    ort = onnx_backend._ort()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(BackboneError, match="onnxruntime-gpu"):
        providers_for("cuda")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert providers_for("cuda:1") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_backend._provider_options("cuda:1")[0] == {"device_id": 1}


def test_make_backbone_switch(tmp_path):
    model = tiny_bert_mlm(seed=2)
    assert isinstance(make_backbone(model, "torch"), TorchBackbone)
    assert isinstance(make_backbone(model, "onnx", cache_root=tmp_path), OnnxBackbone)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backbone(model, "tensorrt")


SENTENCES = [
    "what is a dense retriever",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "photosynthesis converts light energy into chemical energy stored in glucose",
]


@pytest.mark.realmodel
@torch.inference_mode()
def test_real_splade_tiny_lexical_vectors_match(splade_tiny_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(splade_tiny_dir)
    model = AutoModelForMaskedLM.from_pretrained(splade_tiny_dir).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def dlr(bb):
        h = bb.hidden_states(ids, mask)
        logits = bb.mlm_logits(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:2], -1)
        return R.densify(R.splade_lexical(logits, mask), 768)

    (v_onnx, g_onnx), (v_torch, g_torch) = dlr(onnx_backbone_for(model, tmp_path)), dlr(TorchBackbone(model))
    assert_close(v_onnx, v_torch)
    assert (v_torch > 0).sum() > 20  # a trained SPLADE model fires on real text
    # gates may flip only where two rows tie to rounding; none do on these texts
    assert torch.equal(g_onnx, g_torch)


@pytest.mark.realmodel
@torch.inference_mode()
def test_real_minilm_mean_pooled_vectors_match(minilm_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def pooled(bb):
        return R.l2_normalize(R.mean_pool(bb.hidden_states(ids, mask), mask))

    assert_close(pooled(onnx_backbone_for(model, tmp_path)), pooled(TorchBackbone(model)))


def test_export_leaves_the_torch_model_in_eval_mode(tmp_path):
    model = tiny_distilbert_mlm(seed=3)
    onnx_export.export_model(model, tmp_path / "x")
    assert not any(m.training for m in model.modules())

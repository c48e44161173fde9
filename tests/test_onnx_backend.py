"""ONNX Runtime backend vs torch: same hidden states, logits and encoder outputs for every kind.

Stated tolerance: ONNX Runtime fuses and reorders float32 reductions, so outputs differ
from torch by rounding only. Hidden states and logits: |onnx - torch| <= 1e-5 + 1e-5·|torch|.
Encoder vectors: max |onnx - torch| <= 1e-5 · max |torch| (relative to the vector's
scale, since DLR values of a random model are ~1e-3); gates equal.
"""

import json

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from densehybrid.encoder.random_checkpoint import random_masked_lm, write_random_checkpoint
from densehybrid.encoder.backends import onnx_backend, onnx_export
from densehybrid.encoder.backbone import TorchBackbone
from densehybrid.encoder.backends.onnx_backend import OnnxBackbone, OnnxBackendError, OnnxModel, providers_for
from densehybrid.encoder.loading import load_encoder

from support.fake_encoder import FakeEncoder

TEXTS = [
    "what is a dense retriever",
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France; it is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.",
    "photosynthesis converts light energy into chemical energy stored in glucose",
    "hi",
]


def assert_close(got, expect):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expect), rtol=1e-5, atol=1e-5)


def assert_same_encoding(got, expect):
    scale = float(np.abs(expect.values).max())
    assert scale > 0
    assert np.abs(got.values - expect.values).max() <= 1e-5 * scale
    if expect.gates is None:
        assert got.gates is None
    else:
        np.testing.assert_array_equal(got.gates, expect.gates)


def tiny_bert_mlm(seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return BertForMaskedLM(cfg).eval()


def padded_batch(seed=0, lengths=(19, 7, 12, 3)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[:, 0] = 101
    return ids.masked_fill(mask == 0, 0), mask


# -- the exported graphs against the transformers model -------------------------------------------

@pytest.fixture(scope="module", params=["bert", "distilbert"])
def model_pair(request, tmp_path_factory):
    model = tiny_bert_mlm() if request.param == "bert" else random_masked_lm("tiny")
    return model, OnnxModel(onnx_export.ensure_exported(model, tmp_path_factory.mktemp("onnx")))


@torch.inference_mode()
def test_hidden_states_and_logits_match_torch_on_padded_batches(model_pair):
    model, runner = model_pair
    for seed, lengths in [(0, (19, 7, 12, 3)), (1, (5,)), (2, (40, 40))]:  # shapes other than the export example
        ids, mask = padded_batch(seed, lengths)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        valid = mask.bool()  # padded positions are never read by the representation math
        hidden = runner.hidden_states(ids, mask)
        assert hidden.shape == out.hidden_states[-1].shape
        assert_close(hidden[valid], out.hidden_states[-1][valid])
        logits = runner.mlm_logits_at(hidden, mask)
        assert_close(logits[valid], out.logits[valid])
        assert (logits[~valid] == 0).all()  # the head never ran on padding


@torch.inference_mode()
def test_onnx_honours_padding_a_text_alone_equals_it_in_a_batch(model_pair):
    _, runner = model_pair
    ids, mask = padded_batch(3, (4, 17))
    alone = runner.hidden_states(ids[:1, :4], mask[:1, :4])
    assert_close(runner.hidden_states(ids, mask)[:1, :4], alone)


def test_model_without_head_exports_backbone_only(tmp_path):
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
                      add_pooling_layer=False).eval()
    runner = OnnxModel(onnx_export.ensure_exported(model, tmp_path))
    assert not runner.has_mlm_head and not (runner.export_dir / onnx_export.HEAD_FILE).exists()
    ids, mask = padded_batch(5)
    with torch.inference_mode():
        expect = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close(runner.hidden_states(ids, mask)[mask.bool()], expect[mask.bool()])
    with pytest.raises(OnnxBackendError, match="without an MLM head"):
        runner.mlm_logits(torch.zeros(2, 32))


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


def test_export_leaves_the_torch_model_in_eval_mode(tmp_path):
    # torch.onnx.export restores the wrapper's mode recursively: a regression put dropout back on
    model = random_masked_lm("tiny", seed=3)
    onnx_export.export_model(model, tmp_path / "x")
    assert not any(m.training for m in model.modules())


def test_missing_export_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="export.json"):
        OnnxModel(tmp_path)


def test_providers_cpu_and_cuda_twin(monkeypatch):
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    ort = onnx_backend._ort()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(OnnxBackendError, match="onnxruntime-gpu"):
        providers_for("cuda")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert providers_for("cuda:1") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_backend.provider_options("cuda:1")[0] == {"device_id": 1}


# -- every kind through the real encoder classes ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "model", "tiny")


@pytest.fixture(scope="module")
def tiny_dense_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny-dense") / "model", "tiny", seed=7)


KINDS = [
    ("aggretriever", {}),
    ("aggretriever", {"skip_mlm": True}),
    ("dhr", {}),
    ("dlr", {}),
    ("dlr", {"lexical_splade": True}),
    ("cls", {"pooling": "mean", "normalize": True}),
    ("cls", {"pooling": "cls"}),
]


@pytest.mark.slow  # an ONNX export per kind
@pytest.mark.parametrize("kind,options", KINDS, ids=lambda x: x if isinstance(x, str) else "-".join(x) or "default")
def test_every_kind_encodes_the_same_on_onnx(kind, options, tiny_dir, tmp_path_factory):
    options = dict(options)
    model_dir = str(tiny_dir)
    if options.pop("lexical_splade", False):  # a directory without a term-weight head is SPLADE-style
        import shutil

        plain = tmp_path_factory.mktemp("splade") / "model"
        shutil.copytree(tiny_dir, plain, ignore=shutil.ignore_patterns("TermWeightTrans*"))
        model_dir = str(plain)
    reference = load_encoder(model_dir, kind=kind, device="cpu", **options)
    onnx = load_encoder(model_dir, kind=kind, device="cpu", backend="onnx",
                        cache_root=tmp_path_factory.getbasetemp() / "onnx-cache", **options)
    assert isinstance(onnx.backbone, OnnxBackbone) and onnx.backend == "onnx"
    if kind != "cls" and "skip_mlm" not in options:
        assert onnx.spec.lexical == ("splade" if model_dir != str(tiny_dir) else "delade")
    for role in ("query", "passage"):
        assert_same_encoding(onnx.encode(TEXTS, role), reference.encode(TEXTS, role))


def test_fusion_switches_both_halves(tiny_dir, tiny_dense_dir, tmp_path):
    reference = load_encoder(str(tiny_dir), kind="fusion", dense_model=str(tiny_dense_dir), device="cpu")
    onnx = load_encoder(str(tiny_dir), kind="fusion", dense_model=str(tiny_dense_dir), device="cpu", backend="onnx",
                        cache_root=tmp_path)
    assert isinstance(onnx.lexical.backbone, OnnxBackbone) and isinstance(onnx.dense.backbone, OnnxBackbone)
    assert_same_encoding(onnx.encode(TEXTS, "query"), reference.encode(TEXTS, "query"))


def test_backend_is_chosen_at_load_time(tiny_dir):
    encoder = load_encoder(str(tiny_dir), kind="cls", device="cpu", backend="torch")
    assert isinstance(encoder.backbone, TorchBackbone) and encoder.backend == "torch"
    with pytest.raises(ValueError, match="unknown backend"):
        load_encoder(str(tiny_dir), kind="cls", device="cpu", backend="tensorrt")


def _reachable(root, max_objects=200_000):
    """Every object reachable from ``root`` (classes and modules not followed)."""
    import gc
    import types

    seen, stack = {}, [root]
    while stack and len(seen) < max_objects:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
    return seen.values()


@pytest.mark.parametrize("kind", ["dhr", "cls"])
def test_an_onnx_encoder_holds_no_torch_transformer(kind, tiny_dir, tmp_path):
    from transformers import PreTrainedModel

    onnx = load_encoder(str(tiny_dir), kind=kind, device="cpu", backend="onnx", cache_root=tmp_path)
    torch_modules = [o for o in _reachable(onnx) if isinstance(o, torch.nn.Module)]
    assert not any(isinstance(m, PreTrainedModel) for m in torch_modules)
    # what stays in torch is the small heads (d -> 128 pooler, d -> 1 term weight), nothing else
    heads = [h for h in (getattr(onnx, "pooler", None), getattr(onnx, "term_weight", None)) if h is not None]
    assert {id(p) for m in torch_modules for p in m.parameters()} == {id(p) for h in heads for p in h.parameters()}
    reference = load_encoder(str(tiny_dir), kind=kind, device="cpu")
    assert any(isinstance(o, PreTrainedModel) for o in _reachable(reference))  # the walk does find one
    assert_same_encoding(onnx.encode(TEXTS, "passage"), reference.encode(TEXTS, "passage"))


@pytest.mark.realmodel
def test_real_fusion_splade_tiny_minilm_matches(splade_tiny_dir, minilm_dir, tmp_path):
    reference = load_encoder("splade-tiny", kind="fusion", dense_model="minilm", device="cpu")
    onnx = load_encoder("splade-tiny", kind="fusion", dense_model="minilm", device="cpu", backend="onnx",
                        cache_root=tmp_path)
    for role in ("query", "passage"):
        got, expect = onnx.encode(TEXTS, role), reference.encode(TEXTS, role)
        assert_same_encoding(got, expect)
        assert (expect.values[:, :768] > 0).sum(1).min() > 3  # a trained SPLADE fires on real text


@pytest.mark.slow  # two ONNX exports
def test_untied_query_and_passage_models_get_their_own_graphs(tiny_dir, tmp_path):
    """An untied checkpoint (query_model/ + passage_model/) exports two graphs, one per role."""
    from densehybrid.encoder.loading import save_encoder

    encoder = load_encoder(str(tiny_dir), kind="dhr", device="cpu")
    other = random_masked_lm("tiny", seed=11)
    encoder.backbone.models = {"query": encoder.backbone.models["query"], "passage": other}
    untied_dir = save_encoder(encoder, tmp_path / "untied")
    reference = load_encoder(str(untied_dir), kind="dhr", device="cpu")
    assert not reference.backbone.tied
    onnx = load_encoder(str(untied_dir), kind="dhr", device="cpu", backend="onnx", cache_root=tmp_path / "onnx")
    runners = onnx.backbone.runners
    assert runners["query"].export_dir != runners["passage"].export_dir
    for role in ("query", "passage"):
        assert_same_encoding(onnx.encode(TEXTS, role), reference.encode(TEXTS, role))
    assert not np.allclose(reference.encode(TEXTS[:1], "query").values, reference.encode(TEXTS[:1], "passage").values)

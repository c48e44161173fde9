"""Strict loading of the published format: every broken directory names its file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from densehybrid.encoder.errors import ModelDirError
from densehybrid.encoder.heads import POOLER, TERM_WEIGHT, LinearHead, load_head, save_head
from densehybrid.encoder.loading import load_encoder
from densehybrid.encoder.model_dir import ModelSettings, locate, open_model_dir, read_settings, weights_hash, write_settings


@pytest.fixture
def broken(tiny_bert_dir, tmp_path):
    """A private copy of the tiny checkpoint to damage."""
    return shutil.copytree(tiny_bert_dir, tmp_path / "model")


def test_tied_head_state_dict_holds_both_prefixes(tmp_path):
    head = LinearHead(8, 4, tied=True)
    save_head(head, tmp_path, POOLER)
    state = torch.load(tmp_path / "pooler.pt", weights_only=True)
    assert set(state) == {"linear_q.weight", "linear_q.bias", "linear_p.weight", "linear_p.bias"}
    assert json.loads((tmp_path / "pooler_config.json").read_text()) == {"input_dim": 8, "output_dim": 4, "tied": True}
    loaded = load_head(tmp_path, POOLER, input_dim=8)
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x, "query"), head(x, "query"), rtol=0, atol=0)
    torch.testing.assert_close(loaded(x, "passage"), loaded(x, "query"), rtol=0, atol=0)


def test_untied_head_keeps_both_layers(tmp_path):
    head = LinearHead(8, 1, tied=False)
    save_head(head, tmp_path, TERM_WEIGHT)
    loaded = load_head(tmp_path, TERM_WEIGHT, input_dim=8, output_dim=1)
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x, "passage"), head.linear_p(x), rtol=0, atol=0)
    assert not torch.allclose(loaded(x, "query"), loaded(x, "passage"))


def test_tied_head_with_only_linear_q_loads(tmp_path):
    head = LinearHead(8, 4)
    torch.save({k: v for k, v in head.state_dict().items() if k.startswith("linear_q")}, tmp_path / "pooler.pt")
    (tmp_path / "pooler_config.json").write_text(json.dumps({"input_dim": 8, "output_dim": 4, "tied": True,
                                                             "name": "pooler"}))
    assert load_head(tmp_path, POOLER, input_dim=8).output_dim == 4


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "pooler.pt").unlink(), r"pooler\.pt: missing \(expected a linear layer 32 -> 16\)"),
    (lambda d: (d / "TermWeightTrans_config.json").unlink(), r"TermWeightTrans_config\.json: missing"),
    (lambda d: torch.save({"linear_q.weight": torch.zeros(1, 32)}, d / "TermWeightTrans.pt"),
     r"TermWeightTrans\.pt: missing keys \['linear_q\.bias'\]"),
    (lambda d: torch.save({**torch.load(d / "pooler.pt"), "extra.weight": torch.zeros(1)}, d / "pooler.pt"),
     r"pooler\.pt: .*unexpected keys \['extra\.weight'\]"),
    (lambda d: torch.save({"linear_q.weight": torch.zeros(1, 31), "linear_q.bias": torch.zeros(1)},
                          d / "TermWeightTrans.pt"),
     r"TermWeightTrans\.pt: linear_q\.weight has shape \(1, 31\), expected \(1, 32\)"),
    (lambda d: (d / "pooler_config.json").write_text('{"input_dim": 64, "output_dim": 16, "tied": true}'),
     r"pooler_config\.json: head is 64 -> 16, expected 32 -> any"),
    (lambda d: (d / "pooler_config.json").write_text('{"input_dim": 32, "output": 16}'),
     r"pooler_config\.json: expected keys"),
    (lambda d: torch.save({**torch.load(d / "pooler.pt"), "linear_p.bias": torch.ones(16)}, d / "pooler.pt"),
     r"pooler\.pt: config says tied but linear_p\.bias differs"),
    (lambda d: (d / "pooler.pt").write_bytes(b"not a torch file"), r"pooler\.pt: cannot be read"),
    (lambda d: (d / "config.json").unlink(), r"config\.json: missing"),
    (lambda d: (d / "densehybrid.json").write_text('{"kind": "dhr", "colour": "red"}'),
     r"densehybrid\.json: unknown settings \['colour'\]"),
    (lambda d: (d / "densehybrid.json").write_text('{"kind": "bm25"}'), r"unknown kind 'bm25'"),
])
def test_broken_directories_name_the_file(broken, damage, message):
    damage(broken)
    with pytest.raises(ModelDirError, match=message):
        load_encoder(str(broken), kind="dhr")


def test_wrong_backbone_weights_are_refused(broken):
    from safetensors.torch import load_file, save_file

    weights = load_file(broken / "model.safetensors")
    key = next(k for k in weights if k.endswith("query.weight"))
    del weights[key]
    save_file(weights, broken / "model.safetensors")
    with pytest.raises(ModelDirError, match=r"model[^:]*: missing weights .*query\.weight"):
        load_encoder(str(broken), kind="dlr")


def test_kind_is_required_without_densehybrid_json(tiny_bert_dir):
    with pytest.raises(ModelDirError, match="no densehybrid.json records the kind"):
        load_encoder(str(tiny_bert_dir))


def test_settings_round_trip_and_precedence(broken):
    write_settings(broken, ModelSettings(kind="dhr", dlr_dim=256, lam=0.25, max_query_length=16))
    assert read_settings(broken) == ModelSettings(kind="dhr", dlr_dim=256, lam=0.25, max_query_length=16)
    recorded = load_encoder(str(broken))
    assert (recorded.spec.kind, recorded.spec.dlr_dim, recorded.spec.lam, recorded.spec.max_query_length) == \
        ("dhr", 256, 0.25, 16)
    overridden = load_encoder(str(broken), kind="dlr", dlr_dim=128, lam=2.0)
    assert (overridden.spec.kind, overridden.spec.dim, overridden.spec.lam) == ("dlr", 128, 2.0)
    (broken / "densehybrid.json").write_text('{"format": 9, "kind": "dhr"}')
    with pytest.raises(ModelDirError, match="format 9 is not supported"):
        read_settings(broken)


def test_untied_layout_needs_both_halves(tiny_untied_dir, tmp_path):
    copy = shutil.copytree(tiny_untied_dir, tmp_path / "untied")
    assert not open_model_dir(copy).tied
    shutil.rmtree(copy / "passage_model")
    with pytest.raises(ModelDirError, match=r"passage_model/config\.json: missing"):
        open_model_dir(copy)


def test_locate_local_zoo_and_hub_errors(tiny_bert_dir, tmp_path):
    assert locate(str(tiny_bert_dir)) == tiny_bert_dir
    with pytest.raises(ModelDirError, match="no such model directory"):
        locate(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelDirError, match="is a file"):
        locate(str(tmp_path / "file"))
    # a hub id: the hub is unreachable on build machines (or the repo does not exist)
    with pytest.raises(ModelDirError, match="Hugging Face hub could not provide it"):
        locate("densehybrid-test/no-such-model-xyz")


def test_weights_hash_is_stable_and_content_sensitive(broken, tiny_bert_dir):
    assert weights_hash([broken]) == weights_hash([tiny_bert_dir])
    state = torch.load(broken / "pooler.pt")
    state["linear_q.bias"] = state["linear_q.bias"] + 1
    state["linear_p.bias"] = state["linear_q.bias"]
    torch.save(state, broken / "pooler.pt")
    assert weights_hash([broken]) != weights_hash([tiny_bert_dir])
    with pytest.raises(ModelDirError, match="no weight files"):
        weights_hash([broken / "nothing-here"])


def test_dlr_dim_too_small_for_uint8_gates(tiny_bert_dir):
    with pytest.raises(ModelDirError, match="uint8 gates hold 256"):
        load_encoder(str(tiny_bert_dir), kind="dlr", dlr_dim=64)
    assert load_encoder(str(tiny_bert_dir), kind="dlr", dlr_dim=128).spec.gated_dim == 128

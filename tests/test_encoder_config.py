"""EncoderConfig: an index's spec rebuilds the same encoder; what is given wins, what is not is None."""


import numpy as np
import pytest

from support.fake_encoder import FakeEncoder
from densehybrid.bench.servers.toy_index import build_toy_index
from densehybrid.encoder.config import EncoderConfig
from densehybrid.encoder.loading import load_encoder, save_encoder
from densehybrid.service import startup
from densehybrid.service.settings import ServiceSettings

TEXTS = ["what is a dense retriever", "the cat sat on the mat by the river bank"]

CONFIGS = {
    "dhr-lambda": {"kind": "dhr", "lam": 0.5, "dlr_dim": 256},
    "aggretriever-skip-mlm": {"kind": "aggretriever", "skip_mlm": True, "agg_dim": 320},
    "aggretriever-default-dims": {"kind": "aggretriever", "agg_dim": 640},
    "dlr-short": {"kind": "dlr", "max_query_length": 8, "max_passage_length": 20},
    "cls-mean": {"kind": "cls", "pooling": "mean", "normalize": True},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_spec_to_config_to_encoder_gives_the_spec_back(tiny_bert_dir, name):
    first = load_encoder(EncoderConfig(str(tiny_bert_dir), **CONFIGS[name]), device="cpu")
    again = load_encoder(EncoderConfig.from_spec(first.spec), device="cpu")
    assert again.spec == first.spec
    np.testing.assert_array_equal(again.encode(TEXTS, "query").values, first.encode(TEXTS, "query").values)


def test_fusion_spec_round_trips_with_its_dense_model(tiny_bert_dir, tiny_distilbert_dir):
    first = load_encoder(EncoderConfig(str(tiny_bert_dir), kind="fusion", dense_model=str(tiny_distilbert_dir),
                                       pooling="mean", lam=3.0), device="cpu")
    assert load_encoder(EncoderConfig.from_spec(first.spec), device="cpu").spec == first.spec


def test_a_setting_given_at_its_default_value_beats_the_recorded_one(tiny_bert_dir, tmp_path):
    """640 dims asked for are 640 dims, even where the model directory records 320."""
    saved = save_encoder(load_encoder(str(tiny_bert_dir), kind="aggretriever", agg_dim=320), tmp_path / "agg320")
    assert load_encoder(str(saved)).spec.agg_dim == 320
    assert load_encoder(EncoderConfig(str(saved), agg_dim=640)).spec.agg_dim == 640


def test_updated_takes_what_the_overrides_give_and_keeps_the_rest():
    base = EncoderConfig("m", kind="dhr", lam=1.0, dlr_dim=768, max_query_length=32)
    assert base.updated(EncoderConfig(lam=0.25, max_query_length=None)) == EncoderConfig(
        "m", kind="dhr", lam=0.25, dlr_dim=768, max_query_length=32)


def test_the_service_rebuilds_the_index_encoder_then_applies_the_settings(tiny_bert_dir, tmp_path, monkeypatch):
    built = load_encoder(EncoderConfig(str(tiny_bert_dir), kind="dhr", dlr_dim=256, max_query_length=12), device="cpu")
    index_dir = build_toy_index(built, tmp_path, count=6)
    seen = []
    monkeypatch.setattr("densehybrid.encoder.loading.load_encoder",
                        lambda config, **kw: seen.append((config, kw)) or FakeEncoder("dhr"))
    from densehybrid.index.served.loading import load_index

    startup._load_encoder(ServiceSettings(index=index_dir, lam=0.5, backend="torch", device="cpu"),
                          load_index(index_dir))
    ((config, kwargs),) = seen
    assert config == EncoderConfig.from_spec(built.spec).updated(EncoderConfig(lam=0.5))
    assert (config.dlr_dim, config.max_query_length, config.lam) == (256, 12, 0.5)
    assert kwargs == {"backend": "torch", "device": "cpu", "precision": "fp32", "cuda_graphs": None}  # the index's precision

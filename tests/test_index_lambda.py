"""Automatic λ: the margin-ratio rule and its use at build time."""

import numpy as np
import pytest

from densehybrid.index.building import lambda_auto

from support.fake_encoder import FakeEncoder


def test_margin_ratio_against_hand_computation():
    lexical = np.array([[9.0, 1.0, 0.0, 2.0], [0.0, 6.0, 1.0, 1.0], [0.0, 0.0, 0.0, 5.0]])
    dense = np.array([[0.9, 0.1, 0.2, 0.3], [0.1, 0.5, 0.3, 0.3], [0.1, 0.2, 0.3, 0.1]])
    source = np.array([0, 1, 3])
    # margins: lexical 9-1.5, 6-1, 5-0 ; dense 0.9-0.25, 0.5-0.3, 0.1-0.15 (<= 0: third query unusable)
    lam, used = lambda_auto.margin_ratio(lexical, dense, source)
    assert used == 2
    assert lam == pytest.approx(np.median([7.5 / 0.65, 5.0 / 0.2]))


def test_margin_ratio_follows_the_scale_of_each_part():
    rng = np.random.default_rng(0)
    lexical, dense = rng.random((50, 30)), rng.random((50, 30))
    source = rng.integers(0, 30, 50)
    lexical[np.arange(50), source] += 1.0
    dense[np.arange(50), source] += 1.0
    lam, _ = lambda_auto.margin_ratio(lexical, dense, source)
    assert lambda_auto.margin_ratio(30 * lexical, dense, source)[0] == pytest.approx(30 * lam)
    assert lambda_auto.margin_ratio(lexical, dense / 4, source)[0] == pytest.approx(4 * lam)


def test_margin_ratio_without_usable_queries_fails():
    with pytest.raises(ValueError, match="cannot choose"):
        lambda_auto.margin_ratio(np.zeros((2, 3)), np.ones((2, 3)), np.array([0, 1]))


def test_pseudo_query_is_a_seeded_window():
    text = " ".join(f"w{i}" for i in range(20))
    a = lambda_auto.pseudo_query(text, 5, np.random.default_rng(3))
    assert a == lambda_auto.pseudo_query(text, 5, np.random.default_rng(3))
    assert len(a.split()) == 5 and a in text
    assert lambda_auto.pseudo_query("short text", 5, np.random.default_rng(0)) == "short text"


def test_choose_scales_with_the_dense_part():
    encoder = FakeEncoder("fusion")
    texts = [" ".join(f"t{(i * 7 + j) % 90}" for j in range(12)) for i in range(60)]
    passages = encoder.encode(texts, "passage")
    lam, record = lambda_auto.choose(encoder, texts, passages.values, passages.gates)
    assert lam > 0 and record["method"] == "auto-margin" and record["used"] > 0
    # passages whose dense part is 5x larger need a 5x smaller λ
    scaled = passages.values.copy()
    scaled[:, encoder.spec.gated_dim:] *= 5
    assert lambda_auto.choose(encoder, texts, scaled, passages.gates)[0] == pytest.approx(lam / 5, rel=1e-4)


def test_choose_leaves_unscaled_kinds_alone():
    encoder = FakeEncoder("dlr")
    passages = encoder.encode(["a b", "c d"], "passage")
    assert lambda_auto.choose(encoder, ["a b", "c d"], passages.values, passages.gates)[1]["method"] == "model"

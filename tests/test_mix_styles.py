"""The auto mix over two styles of pseudo-query (index/building/mix_choice.py ``style_choice``,
``hedged_weight``; fusion_auto's keyword windows), checked against plain-Python answers."""

import numpy as np
import pytest

from densehybrid.index.building import fusion_auto, mix_choice
from densehybrid.index.storage.documents import Document

WEIGHTS = mix_choice.WEIGHTS


def brute_regret(gains):
    means = [sum(row) / len(row) for row in gains]
    best = max(means)
    return [(best - m) / best if best > 0 else 0.0 for m in means]


def brute_hedged(styles, low, high, prior=0.5):
    regrets = [brute_regret(g) for g in styles]
    inside = [i for i, w in enumerate(WEIGHTS) if low - 1e-9 <= w <= high + 1e-9]
    worst = {i: max(r[i] for r in regrets) for i in inside}
    least = min(worst.values())
    tied = [i for i in inside if abs(worst[i] - least) <= 1e-12]
    return WEIGHTS[min(tied, key=lambda i: abs(WEIGHTS[i] - prior))]


def style(rng, peak, q=60, width=0.3):
    """(W, Q) gains of a style whose curve peaks at dense weight ``peak``, with per-query noise."""
    curve = np.exp(-((np.asarray(WEIGHTS) - peak) / width) ** 2)
    return np.clip(curve[:, None] * rng.uniform(0.5, 1.0, q) + rng.normal(0, 0.05, (len(WEIGHTS), q)), 0, 1)


def test_relative_regret_against_plain_python():
    rng = np.random.default_rng(0)
    gains = rng.random((len(WEIGHTS), 25))
    np.testing.assert_allclose(mix_choice.relative_regret(gains), brute_regret(gains.tolist()))
    assert mix_choice.relative_regret(np.zeros((len(WEIGHTS), 5))).tolist() == [0.0] * len(WEIGHTS)


@pytest.mark.parametrize("seed", range(6))
def test_hedged_weight_against_plain_python(seed):
    rng = np.random.default_rng(seed)
    styles = (style(rng, rng.uniform(0, 1)), style(rng, rng.uniform(0, 1)))
    for low, high in ((0.0, 1.0), mix_choice.BOUNDS, (0.4, 0.6)):
        assert mix_choice.hedged_weight(styles, bounds=(low, high)) == brute_hedged([s.tolist() for s in styles], low, high)


def test_ties_go_to_the_weight_nearest_the_prior():
    flat = np.ones((len(WEIGHTS), 10))
    assert mix_choice.hedged_weight((flat, flat)) == 0.5
    assert mix_choice.hedged_weight((flat, flat), prior=0.7) == 0.7
    # quantised curves: several weights share the least worst regret
    steps = np.repeat(np.array([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4])[:, None], 4, axis=1)
    assert mix_choice.hedged_weight((steps, steps)) == 0.5
    assert mix_choice.hedged_weight((steps, steps), prior=0.1) == 0.4


def test_opposite_styles_meet_between_their_peaks_and_one_flat_style_lets_the_other_decide():
    rng = np.random.default_rng(3)
    keyword, paraphrase = style(rng, 0.0, q=400), style(rng, 1.0, q=400)
    chosen = mix_choice.hedged_weight((paraphrase, keyword), bounds=(0.0, 1.0))
    assert 0.3 <= chosen <= 0.7
    # neither style alone would have chosen it, and it loses less than either style's own best at worst
    worst = np.max([mix_choice.relative_regret(g) for g in (paraphrase, keyword)], axis=0)
    own_bests = [int(np.argmax(g.mean(axis=1))) for g in (paraphrase, keyword)]
    assert all(worst[WEIGHTS.index(chosen)] < worst[i] for i in own_bests)
    flat = np.full((len(WEIGHTS), 50), 0.3)
    assert mix_choice.hedged_weight((flat, style(rng, 0.7, q=400)), bounds=(0.0, 1.0)) == 0.7


def test_a_part_that_fails_the_paraphrases_is_dropped_whatever_the_keywords_say():
    rng = np.random.default_rng(4)
    paraphrase = style(rng, 1.0, q=200, width=0.2)  # lexical alone finds almost nothing
    assert mix_choice.one_part_fails(paraphrase)
    keyword = style(rng, 0.0, q=200)  # the keyword windows would pull towards lexical
    weight, bounds, rule = mix_choice.style_choice(paraphrase, keyword)
    assert (weight, bounds) == mix_choice.bounded_choice(paraphrase) and bounds == (0.0, 1.0) and "fails" in rule
    # parts of some use: the hedge, within the bounds
    paraphrase, keyword = style(rng, 0.7, q=200, width=1.0), style(rng, 0.3, q=200, width=1.0)
    assert not mix_choice.one_part_fails(paraphrase)
    weight, bounds, rule = mix_choice.style_choice(paraphrase, keyword)
    assert bounds == mix_choice.BOUNDS and weight == mix_choice.hedged_weight((paraphrase, keyword))
    assert "regret" in rule


def test_a_keyword_query_is_a_window_of_the_passages_first_words():
    words = [f"w{i}" for i in range(300)]
    doc = Document("d", "Title Words", " ".join(words))
    every = ["Title", "Words"] + words
    for seed in range(30):
        query = fusion_auto.keyword_query(doc, 8, 40, np.random.default_rng(seed)).split()
        start = every.index(query[0])
        assert len(query) == 8 and query == every[start:start + 8] and start + 8 <= 40
    short = Document("s", "", "only five words are here")
    assert fusion_auto.keyword_query(short, 8, 40, np.random.default_rng(0)) == "only five words are here"

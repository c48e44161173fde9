"""The mixes chosen over two styles of pseudo-query: the default's least worse regret
(index/building/fusion_choice.py ``pick``), the keyword-bounded rule the comparison keeps
(benchmarks/quality/earlier_rules.py), the regret they are built on and the keyword windows
(pseudo_queries.py), checked against plain-Python answers."""

import numpy as np
import pytest

from densehybrid.bench.quality import earlier_rules
from densehybrid.index.building import fusion_choice, pseudo_queries
from densehybrid.index.storage.documents import Document

WEIGHTS = fusion_choice.WEIGHTS


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
    np.testing.assert_allclose(fusion_choice.relative_regret(gains), brute_regret(gains.tolist()))
    assert fusion_choice.relative_regret(np.zeros((len(WEIGHTS), 5))).tolist() == [0.0] * len(WEIGHTS)


def pick(paraphrase, keyword):
    return fusion_choice.pick(fusion_choice.Evidence(paraphrase, keyword, (), 100, 10))[0]


@pytest.mark.parametrize("seed", range(6))
def test_least_worst_regret_against_plain_python(seed):
    rng = np.random.default_rng(seed)
    paraphrase, keyword = style(rng, rng.uniform(0.3, 0.7), width=1.0), style(rng, rng.uniform(0, 1))
    assert not fusion_choice.one_part_fails(paraphrase)  # the hedge, not its fallback (tested below)
    toward = 1.0 if paraphrase[-1].mean() >= paraphrase[0].mean() else 0.0
    expected = brute_hedged([paraphrase.tolist(), keyword.tolist()], *fusion_choice.BOUNDS, prior=toward)
    assert pick(paraphrase, keyword) == expected


def test_the_hedge_breaks_ties_towards_the_stronger_part():
    flat = np.ones((len(WEIGHTS), 10))
    assert pick(flat, flat) == fusion_choice.BOUNDS[1]  # parts alike: dense counts as the stronger
    steps = np.repeat(np.array([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4])[:, None], 4, axis=1)
    assert pick(steps, steps) == 0.7  # 0.4 ... 0.7 lose nothing; dense alone beats lexical alone
    assert pick(np.flipud(steps), np.flipud(steps)) == 0.3


def test_a_part_that_fails_the_paraphrases_is_dropped_whatever_the_keywords_say():
    rng = np.random.default_rng(4)
    paraphrase = style(rng, 1.0, q=200, width=0.2)  # lexical alone finds almost nothing
    assert fusion_choice.one_part_fails(paraphrase)
    keyword = style(rng, 0.0, q=200)  # the keyword windows would pull towards lexical
    assert pick(paraphrase, keyword) == earlier_rules.paraphrases_alone(paraphrase) >= 0.9


def test_the_keyword_bounded_rule_lets_the_paraphrases_pull_only_as_far_as_the_keywords_allow():
    flat_keyword = np.ones((len(WEIGHTS), 20))
    rising = np.repeat(np.linspace(0.3, 0.6, len(WEIGHTS))[:, None], 20, axis=1)  # paraphrases: the more dense the better
    assert earlier_rules.keyword_bounded(rising, flat_keyword) == earlier_rules.BOUNDS[1]
    # keyword queries lose 3 % a step past 0.3: 0.5 loses 6 %, 0.6 loses 9 % (over the 8 % it allows)
    falling = np.repeat(np.array([1, 1, 1, 1, .97, .94, .91, .88, .85, .82, .79])[:, None], 20, axis=1)
    assert earlier_rules.keyword_bounded(rising, falling) == 0.5


def test_a_keyword_query_is_a_window_of_the_passages_first_words():
    words = [f"w{i}" for i in range(300)]
    doc = Document("d", "Title Words", " ".join(words))
    every = ["Title", "Words"] + words
    for seed in range(30):
        query = pseudo_queries.keyword_query(doc, 8, 40, np.random.default_rng(seed)).split()
        start = every.index(query[0])
        assert len(query) == 8 and query == every[start:start + 8] and start + 8 <= 40
    short = Document("s", "", "only five words are here")
    assert pseudo_queries.keyword_query(short, 8, 40, np.random.default_rng(0)) == "only five words are here"

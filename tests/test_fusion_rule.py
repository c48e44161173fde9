"""The default ``--fusion auto`` rule (index/building/fusion_choice.py ``choose_weight``) on gains arrays,
checked against plain-Python answers and on parts of known strength."""

import math

import numpy as np
import pytest

from densehybrid.index.building import fusion_choice
from densehybrid.index.building.fusion_choice import BOUNDS, WEIGHTS, Evidence

from test_fusion_auto import parts_with_signal


def evidence(paraphrase, keyword):
    return Evidence(np.asarray(paraphrase, float), np.asarray(keyword, float), (), 100, 10)


def style(rng, peak, q=80, width=0.4, level=0.6):
    curve = level * np.exp(-((np.asarray(WEIGHTS) - peak) / width) ** 2)
    return np.clip(curve[:, None] * rng.uniform(0.5, 1.0, q) + rng.normal(0, 0.05, (len(WEIGHTS), q)), 0, 1)


def brute_choice(paraphrase, keyword):
    """The rule by hand: when a part fails, the paraphrases' one-standard-error band nearest the other part
    alone; otherwise, within the bounds, the least of each weight's larger share lost over the two styles,
    ties nearest the stronger part."""
    p_means = [sum(row) / len(row) for row in paraphrase]
    k_means = [sum(row) / len(row) for row in keyword]
    lexical, dense = p_means[0], p_means[-1]
    toward = 1.0 if dense >= lexical else 0.0
    if min(lexical, dense) < 0.5 * max(lexical, dense):
        best = max(range(len(WEIGHTS)), key=lambda i: (p_means[i], -abs(WEIGHTS[i] - toward)))
        q = len(paraphrase[0])
        near = []
        for i in range(len(WEIGHTS)):
            diffs = [a - b for a, b in zip(paraphrase[best], paraphrase[i])]
            mean = sum(diffs) / q
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (q - 1))
            if mean <= sd / math.sqrt(q) + 1e-12:
                near.append(i)
        return WEIGHTS[min(near, key=lambda i: (abs(WEIGHTS[i] - toward), -p_means[i]))]
    inside = [i for i, w in enumerate(WEIGHTS) if BOUNDS[0] - 1e-9 <= w <= BOUNDS[1] + 1e-9]
    worst = [max((max(p_means) - p_means[i]) / max(p_means), (max(k_means) - k_means[i]) / max(k_means))
             for i in range(len(WEIGHTS))]
    return WEIGHTS[min(inside, key=lambda i: (round(worst[i], 12), abs(WEIGHTS[i] - toward)))]


@pytest.mark.parametrize("seed", range(8))
def test_the_rule_against_plain_python(seed):
    rng = np.random.default_rng(seed)
    paraphrase, keyword = style(rng, rng.uniform(0, 1)), style(rng, rng.uniform(0, 0.6))
    chosen = fusion_choice.choose_weight(evidence(paraphrase, keyword), resamples=0)
    assert chosen.weight == brute_choice(paraphrase.tolist(), keyword.tolist())


def test_neither_kind_of_query_is_given_up_for_the_other():
    rising = np.repeat(np.linspace(0.3, 0.6, len(WEIGHTS))[:, None], 20, axis=1)  # paraphrases: the more dense the better
    assert fusion_choice.choose_weight(evidence(rising, np.ones((len(WEIGHTS), 20))), resamples=0).weight == BOUNDS[1]
    # keyword queries lose 3 % a step past 0.3 (0.7 loses 12 %, 0.8 15 %); paraphrases lose 5 % a step below 1.0
    # (0.7 loses 15 %, 0.8 10 %): the larger loss is least, 15 %, at 0.7 and 0.8, and the tie goes to the
    # stronger part (dense)
    falling = np.repeat(np.array([1, 1, 1, 1, .97, .94, .91, .88, .85, .82, .79])[:, None], 20, axis=1)
    got = fusion_choice.choose_weight(evidence(rising, falling), resamples=0)
    assert got.weight == 0.8 and "least worse regret" in got.reason
    worst = fusion_choice.worst_regret(evidence(rising, falling))
    assert worst[8] == pytest.approx(max(0.1, 0.15)) and worst[5] == pytest.approx(max(0.25, 0.06))


def test_mixes_charged_alike_go_to_the_stronger_part_not_to_the_middle():
    flat_keyword = np.ones((len(WEIGHTS), 30))
    paraphrase = np.full((len(WEIGHTS), 30), 0.5)
    paraphrase[-1] += 0.01  # dense alone a little better than lexical alone: dense is the stronger part
    paraphrase[1:-1] += 0.02  # and every mix better than either alone, alike
    assert fusion_choice.choose_weight(evidence(paraphrase, flat_keyword), resamples=0).weight == BOUNDS[1]
    paraphrase[-1] -= 0.02  # now lexical is
    assert fusion_choice.choose_weight(evidence(paraphrase, flat_keyword), resamples=0).weight == BOUNDS[0]


def test_a_part_that_fails_the_paraphrases_lifts_the_bounds_and_the_keyword_queries_pull():
    rng = np.random.default_rng(3)
    lexical, dense, source = parts_with_signal(rng, 200, 400, np.zeros(200), np.full(200, 3.5))
    paraphrase = fusion_choice.weight_gains(lexical, dense, source, 100)
    keyword = np.repeat(np.linspace(1.0, 0.5, len(WEIGHTS))[:, None], 200, axis=1)  # keywords would pull lexical
    assert fusion_choice.one_part_fails(paraphrase)
    chosen = fusion_choice.choose_weight(evidence(paraphrase, keyword))
    assert chosen.weight >= 0.9 and "fails" in chosen.reason


def test_a_much_weaker_lexical_part_leans_dense_and_the_mirror_image_leans_lexical():
    rng = np.random.default_rng(4)
    lexical, dense, source = parts_with_signal(rng, 200, 400, np.full(200, 2.0), np.full(200, 3.5))
    paraphrase = fusion_choice.weight_gains(lexical, dense, source, 100)
    no_limit = np.ones_like(paraphrase)  # keyword queries that any mix serves alike
    assert fusion_choice.choose_weight(evidence(paraphrase, no_limit), resamples=0).weight >= 0.7
    mirrored = fusion_choice.weight_gains(dense * 800, lexical / 800, source, 100)
    assert fusion_choice.choose_weight(evidence(mirrored, no_limit), resamples=0).weight <= 0.3


def test_confidence_is_the_share_of_resamples_that_agree():
    steady = np.repeat(np.linspace(0.3, 0.6, len(WEIGHTS))[:, None], 40, axis=1)  # every query says the same
    assert fusion_choice.choose_weight(evidence(steady, np.ones_like(steady))).confidence == 1.0
    rng = np.random.default_rng(5)
    noisy = rng.random((len(WEIGHTS), 40))  # no weight is better: the resamples scatter
    chosen = fusion_choice.choose_weight(evidence(noisy, rng.random((len(WEIGHTS), 40))), resamples=100)
    assert 0.0 <= chosen.confidence < 0.9
    keyword = rng.random((len(WEIGHTS), 40))
    assert fusion_choice.choose_weight(evidence(noisy, keyword), resamples=100) == \
        fusion_choice.choose_weight(evidence(noisy, keyword), resamples=100)  # seeded: the same confidence again


def test_the_comparison_summary_and_table_read_the_rules_off_each_curve():
    from densehybrid.bench.quality import fusion_rules

    def row(name, lexical, dense, weights):
        curve = {"lexical": lexical, "dense": dense} | {f"{w:.1f}": 0.5 + w / 10 for w in WEIGHTS}
        rules = {rule: {"weight": w, "ndcg_at_10": curve[f"{w:.1f}"],
                        "over_better_part": round(curve[f"{w:.1f}"] - max(lexical, dense), 4)}
                 for rule, w in zip(fusion_rules.RULES, weights)}
        return {"set": name, "queries": 10, "ndcg_at_10": curve, "rules": rules,
                "best_fixed": {"weight": 1.0, "ndcg_at_10": 0.6}}

    rows = [row("a", 0.5, 0.55, (0.7, 0.5, 0.6)), row("b", 0.52, 0.5, (0.2, 0.4, 0.4))]
    got = fusion_rules.summary(rows)
    assert fusion_rules.DEFAULT_RULE == fusion_rules.RULES[2] == "least-regret"
    assert got["least-regret"]["least_margin"] == round(min(0.56 - 0.55, 0.54 - 0.52), 4)
    assert got["least-regret"]["most_behind_other_rules"] == round(max(0.57 - 0.56, 0.54 - 0.54), 4)
    assert got["paraphrases"]["mean_margin"] == round(((0.57 - 0.55) + (0.52 - 0.52)) / 2, 4)
    lines = fusion_rules.table(rows, {"a"}).splitlines()
    assert lines[0].startswith("| set (queries) | lexical | dense | paraphrases | keyword-bounded | least-regret |")
    assert lines[2].startswith("| a * (10) | 0.5000 | 0.5500 | 0.5700 (0.7; +0.0200)") and "| b (10) |" in lines[3]

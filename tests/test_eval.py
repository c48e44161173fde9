"""Evaluation: qrels parsing, measures against hand computation, run files, BM25 baseline."""

import json
import math

import numpy as np
import pytest

from densehybrid.index import evaluate


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [
    "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\nq2\td3\t1\n",   # BEIR with header
    "q1\td1\t2\nq1\td2\t0\nq2\td3\t1\n",                             # BEIR without header
    "q1 0 d1 2\nq1 0 d2 0\n\nq2 0 d3 1\n",                            # TREC, blank line
])
def test_qrels_formats(tmp_path, text):
    assert evaluate.read_qrels(write(tmp_path / "q.tsv", text)) == {"q1": {"d1": 2, "d2": 0}, "q2": {"d3": 1}}


def test_bad_qrels_line_is_named(tmp_path):
    with pytest.raises(evaluate.EvalInputError, match="q.tsv:2"):
        evaluate.read_qrels(write(tmp_path / "q.tsv", "q1\td1\t1\nq1\td2\n"))
    with pytest.raises(evaluate.EvalInputError, match="q.tsv:2: relevance"):
        evaluate.read_qrels(write(tmp_path / "q.tsv", "q1\td1\t1\nq1\td2\tx\n"))


def test_queries(tmp_path):
    path = write(tmp_path / "queries.jsonl", json.dumps({"_id": 7, "text": "hello"}) + "\n\n" + json.dumps({"_id": "b", "text": "x"}) + "\n")
    assert evaluate.read_queries(path) == {"7": "hello", "b": "x"}
    with pytest.raises(evaluate.EvalInputError, match="queries.jsonl:1"):
        evaluate.read_queries(write(tmp_path / "queries.jsonl", '{"text": "no id"}\n'))


def ndcg10(ranked, grades):
    """Independent nDCG@10 with linear gains (trec_eval's definition)."""
    dcg = sum(grades.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted((g for g in grades.values() if g > 0), reverse=True)[:10]
    return dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal))


def test_measures_against_hand_computation():
    qrels = {"q1": {"a": 2, "b": 0, "c": 1, "z": 3}, "q2": {"x": 1}, "q3": {"y": 1}}
    run = {"q1": {"b": 9.0, "c": 8.0, "a": 7.0, "n": 6.0},  # grade-0 "b" first: not relevant
           "q2": {f"m{i}": 1000.0 - i for i in range(150)} | {"x": 1.0},  # x at rank 151
           "q3": {}}  # judged query that found nothing counts as 0
    got = evaluate.evaluate(run, qrels)
    assert list(got) == ["nDCG@10", "MRR@10", "R@100", "R@1000"]
    ranked_q1 = ["b", "c", "a", "n"]
    assert got["nDCG@10"] == pytest.approx((ndcg10(ranked_q1, qrels["q1"]) + 0 + 0) / 3)
    assert got["MRR@10"] == pytest.approx((1 / 2 + 0 + 0) / 3)
    assert got["R@100"] == pytest.approx((2 / 3 + 0 + 0) / 3)
    assert got["R@1000"] == pytest.approx((2 / 3 + 1 + 0) / 3)


def test_unjudged_queries_are_ignored():
    qrels = {"q1": {"a": 1}}
    assert evaluate.evaluate({"q1": {"a": 1.0}, "other": {"a": 1.0}}, qrels)["MRR@10"] == 1.0


def test_trec_run_file(tmp_path):
    evaluate.write_trec_run(tmp_path / "run", ["q1", "q2"], [["a", "b"], ["c"]], [[2.5, 1.0], [0.125]], "tag")
    assert (tmp_path / "run").read_text().splitlines() == [
        "q1 Q0 a 1 2.500000 tag", "q1 Q0 b 2 1.000000 tag", "q2 Q0 c 1 0.125000 tag"]


def test_bm25_ranks_the_matching_passage_first():
    texts = ["the cat sat on the mat", "dogs are running in the park", "quantum chromodynamics of gluons",
             "a cat and a dog", "stock markets fell today"]
    ids, scores = evaluate.bm25_search([f"d{i}" for i in range(5)], texts, ["gluon chromodynamics", "running dog"], k=3)
    assert ids[0][0] == "d2" and ids[1][0] == "d1"  # stemming: running/run, dog/dogs
    assert all((np.diff(s) <= 0).all() for s in scores) and len(ids[0]) == 3

"""What a served approximate first stage promises: a requested recall as a breadth within the operator's limits,
and the recall an answer states only for the search the build measured."""

import pytest

from densehybrid.index.search.filters import Eq
from densehybrid.index.search.params import SearchParams
from densehybrid.index.served.stated_recall import (BreadthLimits, Point, RecallUnavailable, breadth_for,
                                                    breadth_for_recall, choose, recall_at, stated)

WIDE = BreadthLimits(ef_search=10_000, nprobe=65_536)


def _curve(*triples):
    return [Point(b, r, r, ms, ms).to_dict() for b, r, ms in triples]


def _hnsw(curve=None, ef_search=64):
    curve = curve or _curve((16, 0.80, 0.3), (64, 0.95, 0.9), (256, 0.99, 3.0))
    return {"type": "hnsw", "ef_search": ef_search, "calibration": {"knob": "ef_search", "curve": curve}}


def _pqscan():
    return {"type": "pqscan", "margin": 0.06, "rescore": 50,
            "calibration": {"knob": "margin", "curve": _curve((0.0, 0.9, 1.0), (0.06, 0.99, 1.5))}}


def test_a_requested_recall_maps_onto_the_manifest_curve():
    curve = _curve((16, 0.80, 0.3), (64, 0.95, 0.9), (256, 0.99, 3.0))
    assert breadth_for(curve, 0.9)["breadth"] == 64
    assert breadth_for(curve, 0.99)["breadth"] == 256
    assert breadth_for(curve, 0.999)["breadth"] == 256  # the best there is
    with pytest.raises(ValueError, match="no breadth"):
        choose([], 0.9)


def test_a_breadth_between_two_measured_ones_is_known_by_the_lower_ones_recall():
    curve = _curve((16, 0.80, 0.3), (64, 0.95, 0.9), (256, 0.99, 3.0))
    assert recall_at(curve, 64) == 0.95 and recall_at(curve, 100) == 0.95 and recall_at(curve, 5000) == 0.99
    assert recall_at(curve, 8) is None


def test_a_reachable_recall_is_the_narrowest_breadth_that_keeps_it():
    asked = breadth_for_recall(_hnsw(), 0.95, WIDE)
    assert asked.fields == {"ef_search": 64} and asked.recall == 0.95 and asked.reached


def test_an_unreachable_recall_says_so_with_the_best_measured_breadth():
    asked = breadth_for_recall(_hnsw(), 0.999, WIDE)
    assert asked.fields == {"ef_search": 256} and not asked.reached


def test_a_recall_never_becomes_a_breadth_past_the_operators_limit():
    asked = breadth_for_recall(_hnsw(), 0.99, BreadthLimits(ef_search=100, nprobe=1))
    assert asked.fields == {"ef_search": 64} and not asked.reached  # 256 keeps it, but the limit is 100
    below_all = breadth_for_recall(_hnsw(), 0.9, BreadthLimits(ef_search=8, nprobe=1))
    assert below_all.fields == {"ef_search": 8} and below_all.recall is None and not below_all.reached


def test_an_exact_first_stage_keeps_any_recall():
    for first_stage in ({"type": "flat"}, {"type": "milvus", "index_type": "FLAT"}):
        asked = breadth_for_recall(first_stage, 0.99, WIDE)
        assert asked.fields == {} and asked.reached
        assert stated(first_stage, SearchParams(), asked) == {**first_stage, "reached": True, "recall_at_10": 1.0}


@pytest.mark.parametrize("first_stage, named", [({"type": "milvus", "index_type": "IVF_FLAT", "nprobe": 16},
                                                 "Milvus IVF_FLAT collection"),
                                                ({"type": "milvus", "index_type": "HNSW", "ef_search": 64},
                                                 "Milvus HNSW collection"),
                                                ({"type": "hnsw", "ef_search": 64}, "not calibrated")])
def test_a_recall_asked_of_a_first_stage_without_a_measured_breadth_is_refused_by_name(first_stage, named):
    with pytest.raises(RecallUnavailable, match=named):
        breadth_for_recall(first_stage, 0.9, WIDE)


def test_an_answer_states_the_recall_measured_at_the_breadth_it_used():
    assert stated(_hnsw(), SearchParams(k=10)) == {"type": "hnsw", "ef_search": 64, "recall_at_10": 0.95}
    assert stated(_hnsw(), SearchParams(k=5, ef_search=300)) == {"type": "hnsw", "ef_search": 300, "recall_at_10": 0.99}


@pytest.mark.parametrize("params, why", [
    (SearchParams(filter=Eq("lang", "en")), "filtered"),
    (SearchParams(first_stage="approx_gip"), "approx_gip"),
    (SearchParams(k=20), "past the top 10"),
    (SearchParams(k=10, offset=10), "past the top 10"),
    (SearchParams(ef_search=8), "below the narrowest"),
])
def test_an_answer_states_no_recall_for_a_search_the_build_did_not_measure(params, why):
    answer = stated(_hnsw(), params)
    assert answer["recall_at_10"] is None and why in answer["recall_note"]


def test_a_smaller_rescore_than_measured_states_no_recall_and_a_larger_one_does():
    assert stated(_pqscan(), SearchParams(rescore=20))["recall_at_10"] is None
    assert stated(_pqscan(), SearchParams(rescore=200))["recall_at_10"] == 0.99


def test_an_uncalibrated_approximate_first_stage_says_so():
    for first_stage in ({"type": "hnsw", "ef_search": 64},
                        {"type": "milvus", "index_type": "IVF_FLAT", "nprobe": 16}):
        answer = stated(first_stage, SearchParams(nprobe=32))
        assert answer["recall_at_10"] is None and "not calibrated" in answer["recall_note"]
    assert stated({"type": "milvus", "index_type": "IVF_FLAT", "nprobe": 16}, SearchParams(nprobe=32))["nprobe"] == 32

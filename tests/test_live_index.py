"""The live index: base + delta searches equal a fresh build of the same documents, before and
after compaction and after a restart from the log."""

import numpy as np
import pytest

from densehybrid.index.writes import wal
from densehybrid.index.building.build import build_from_arrays, encode_passages, passage_text
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index
from densehybrid.index.writes.live import LiveIndex, UnknownDocument
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.params import SearchParams

from support.fake_encoder import FakeEncoder

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def corpus(prefix: str, n: int, seed: int) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [Document(f"{prefix}{i}", "", " ".join(rng.choice(WORDS, 6))) for i in range(n)]


def encode(encoder, docs):
    return encode_passages(encoder, [passage_text(d) for d in docs], 16)


def build(encoder, docs, out):
    return load_index(build_from_arrays(out, encoder.spec, encode(encoder, docs), docs))


def open_live(encoder, path, log_dir):
    return LiveIndex.open(path, Searcher, log_dir=log_dir)


def check_same(live: LiveIndex, reference, encoder, **params):
    queries = encoder.encode(["alpha beta gamma", "sigma rho", "kappa lambda mu nu"], "query")
    got = live.search(queries, SearchParams(**params))
    want = Searcher(reference).search(queries, SearchParams(**params))
    # a first stage alone scores written rows in float32 until a fold stores them as float16, as a build does
    tol, digits = (2e-3, 2) if params.get("rerank") is False else (1e-4, 3)
    for g_ids, g_scores, w_ids, w_scores in zip(got.ids, got.scores, want.ids, want.scores):
        np.testing.assert_allclose(g_scores, w_scores, rtol=tol, atol=tol)
        # equal scores may come in either order; the sets at each score must agree
        assert sorted(zip(np.round(g_scores, digits), g_ids)) == sorted(zip(np.round(w_scores, digits), w_ids))


@pytest.mark.slow  # compactions in a child process: ~15 s a kind
@pytest.mark.parametrize("kind", ["dhr", "cls"])
def test_writes_search_compact_and_recover_like_a_fresh_build(tmp_path, kind):
    encoder = FakeEncoder(kind)
    base_docs = corpus("b", 60, 1)
    build(encoder, base_docs, tmp_path / "index")
    live = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")

    added, replaced = corpus("n", 12, 2), [Document(d.id, "", d.text + " omicron pi") for d in base_docs[:5]]
    live.upsert(added, *astuple(encode(encoder, added)))
    live.upsert(replaced, *astuple(encode(encoder, replaced)))
    for doc_id in ("b10", "b11", "n3", "b2"):  # base, base, delta, replaced-in-delta
        live.delete(doc_id)
    with pytest.raises(UnknownDocument):
        live.delete("b10")
    final = {d.id: d for d in base_docs}
    final.update({d.id: d for d in added + replaced})
    for doc_id in ("b10", "b11", "n3", "b2"):
        del final[doc_id]
    reference = build(encoder, list(final.values()), tmp_path / "reference")
    assert live.count == len(final) and live.get("n0") == final["n0"] and live.get("b10") is None

    n = len(final) + 10
    for params in (dict(k=10, candidates=n), dict(k=len(final), candidates=n), dict(k=5, rerank=False),
                   dict(k=8, first_stage="approx_gip", rerank=False, theta=0.0)):
        check_same(live, reference, encoder, **params)

    assert live.compact()
    assert load_index(tmp_path / "index").manifest["writes"]["applied_seq"] == 6
    assert list(wal.iter_changes(tmp_path / "index.wal")) == [] and live.pending_changes == 0
    check_same(live, reference, encoder, k=10, candidates=n)
    later = corpus("z", 3, 3)
    live.upsert(later, *astuple(encode(encoder, later)))
    live.close()

    final.update({d.id: d for d in later})
    reference = build(encoder, list(final.values()), tmp_path / "reference2")
    reopened = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")
    assert reopened.count == len(final) and reopened.pending_changes == 1
    check_same(reopened, reference, encoder, k=10, candidates=n + 3)


def astuple(encoded):
    return encoded.values, encoded.gates


def test_replay_skips_changes_already_folded(tmp_path):
    """A crash after publishing a generation but before dropping its log must not apply twice."""
    encoder = FakeEncoder("dhr")
    base_docs = corpus("b", 20, 1)
    build(encoder, base_docs, tmp_path / "index")
    live = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")
    live.delete("b1")
    live.upsert(base_docs[:1], *astuple(encode(encoder, base_docs[:1])))
    segments = {p.name: p.read_bytes() for p in (tmp_path / "index.wal").iterdir()}
    live.compact()
    live.close()
    for name, data in segments.items():  # the folded log is back, as if drop_through never ran
        (tmp_path / "index.wal" / name).write_bytes(data)
    reopened = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")
    assert reopened.count == 19 and reopened.pending_changes == 0 and reopened.get("b1") is None


def test_pending_writes_rank_a_normalised_fusion_index_by_the_lambda_sum(tmp_path):
    """zscore scores are relative to the base candidates: with a delta pending, the λ sum ranks base
    and added rows together, as a fresh build ranked by the λ sum does; with no delta, zscore applies."""
    encoder = FakeEncoder("fusion")
    base_docs, added = corpus("b", 60, 5), corpus("n", 8, 6)
    build(encoder, base_docs, tmp_path / "index")
    live = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")
    queries = encoder.encode(["alpha beta gamma"], "query")
    assert live.search(queries, SearchParams(k=10, method="zscore")).ids == \
        Searcher(load_index(tmp_path / "index")).search(queries, SearchParams(k=10, method="zscore")).ids
    live.upsert(added, *astuple(encode(encoder, added)))
    reference = build(encoder, base_docs + added, tmp_path / "fresh")
    check_same(live, reference, encoder, k=10, lam=reference.lam)  # the λ sum, explicitly
    got = live.search(queries, SearchParams(k=10, method="zscore"))
    want = Searcher(reference).search(queries, SearchParams(k=10, method="lambda"))
    assert sorted(got.ids[0]) == sorted(want.ids[0])


@pytest.mark.parametrize("method", ["lexical", "dense"])
def test_pending_writes_rank_by_the_one_part_asked_for(tmp_path, method):
    """A one-part method searches base and added rows with the same part of the query, as a fresh build does."""
    encoder = FakeEncoder("fusion")
    base_docs, added = corpus("b", 60, 7), corpus("n", 8, 8)
    build(encoder, base_docs, tmp_path / "index")
    live = open_live(encoder, tmp_path / "index", tmp_path / "index.wal")
    live.upsert(added, *astuple(encode(encoder, added)))
    reference = build(encoder, base_docs + added, tmp_path / "fresh")
    check_same(live, reference, encoder, k=10, method=method)

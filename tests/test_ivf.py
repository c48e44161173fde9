"""The IVF first stage: candidates from inverted lists, exact scores from the rows, against numpy brute force."""

import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.cli.main import app
from densehybrid.encoder.base import Encoded
from densehybrid.index.building.ivf import build_ivf, write_ivf
from densehybrid.index.engines.hnsw_engine import EXACT_KEPT_ROWS
from densehybrid.index.engines.ivf_engine import ANN_FILE, IVFConfig, IvfStore
from densehybrid.index.errors import IndexLoadError, SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index, verify_index
from test_hnsw import brute_topk, clustered, make_index, recall
from test_import_pyserini import write_pyserini

SMALL = IVFConfig(nlist=16, nprobe=2, train_size=2000)


def _store(xb: np.ndarray, config: IVFConfig = SMALL) -> IvfStore:
    ivf, built = build_ivf(xb, config)
    return IvfStore(ivf, xb, None, [f"d{i}" for i in range(len(xb))], built.nprobe)


@pytest.fixture(scope="module")
def rows():
    return clustered(3000, 32, seed=0).astype(np.float16)


@pytest.mark.parametrize("encoding", ["sq8", "fp16"])
def test_scanning_every_list_finds_the_exhaustive_top10_with_exact_scores(rows, encoding):
    store = _store(rows, IVFConfig(nlist=16, nprobe=2, train_size=2000, encoding=encoding))
    xq = clustered(40, 32, seed=1)
    scores, found = store.inner_product(xq, 10, nprobe=16)
    want_scores, want_rows = brute_topk(xq, rows, 10)
    np.testing.assert_array_equal(found, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-3)  # rescored from the rows


def test_more_lists_find_at_least_as_much_and_the_default_is_the_stores(rows):
    store = _store(rows)
    xq = clustered(40, 32, seed=2)
    want = brute_topk(xq, rows, 10)[1]
    one = recall(store.inner_product(xq, 10, nprobe=1)[1], want)
    default = store.inner_product(xq, 10)[1]
    np.testing.assert_array_equal(default, store.inner_product(xq, 10, nprobe=SMALL.nprobe)[1])
    assert recall(store.inner_product(xq, 10, nprobe=16)[1], want) >= max(one, recall(default, want))


@pytest.mark.parametrize("nprobe", [0, 65_537])
def test_an_out_of_range_nprobe_is_a_search_error(rows, nprobe):
    with pytest.raises(SearchError, match="nprobe"):
        _store(rows).inner_product(clustered(1, 32, seed=3), 10, nprobe=nprobe)


@pytest.mark.parametrize("fraction", [0.5, 0.01])
def test_filtered_search_keeps_only_the_kept_rows_and_finds_their_top10(fraction):
    # big enough that 50% is above the exact-scan limit: the lists answer it, 1% is scanned exactly
    n = EXACT_KEPT_ROWS * 3
    xb = clustered(n, 16, seed=4).astype(np.float16)
    store = _store(xb, IVFConfig(nlist=32, nprobe=32, train_size=4000, encoding="fp16"))
    mask = np.random.default_rng(5).random(n) < fraction
    xq = clustered(20, 16, seed=6)
    scores, found = store.inner_product(xq, 10, Selection(int(mask.sum()), n, mask=mask))
    want_scores, want_rows = brute_topk(xq, xb, 10, np.flatnonzero(mask))
    assert mask[found].all()
    np.testing.assert_array_equal(found, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-3)


def test_a_filter_scans_the_same_lists_unless_they_come_back_short_of_kept_rows():
    n = EXACT_KEPT_ROWS * 3
    xb = clustered(n, 16, seed=4).astype(np.float16)
    store = _store(xb, IVFConfig(nlist=32, nprobe=4, train_size=4000))
    xq = clustered(5, 16, seed=6)
    stats = faiss.cvar.indexIVF_stats
    half = np.random.default_rng(5).random(n) < 0.5
    stats.reset()
    _, found = store.inner_product(xq, 10, Selection(int(half.sum()), n, mask=half))
    assert stats.nlist == 5 * 4 and half[found].all()
    # keep only the rows of lists no query scans: the first scan finds none, a wider one finds them
    probed = store.ivf.quantizer.search(xq, 4)[1]
    far = ~np.isin(store.ivf.quantizer.search(np.asarray(xb, dtype=np.float32), 1)[1].ravel(), probed)
    assert far.sum() > EXACT_KEPT_ROWS and far.mean() < 1
    stats.reset()
    _, found = store.inner_product(xq, 10, Selection(int(far.sum()), n, mask=far))
    assert stats.nlist > 5 * 4 and (found >= 0).all() and far[found].all()


def test_an_ivf_index_records_its_lists_and_searches_them(tmp_path):
    index = make_index(tmp_path, ann=SMALL)
    recorded = index.manifest["first_stage"]
    assert recorded == {"type": "ivf", "file": ANN_FILE, **{**SMALL.__dict__, "trained_rows": 600}}
    assert ANN_FILE in verify_index(index.path)["files"] and index.first_stage_kind == "ivf"
    searcher = Searcher(index)
    assert searcher.first_stage == "ivf" and isinstance(searcher.store, IvfStore)
    assert searcher.store.values is index.values  # the one copy, memory-mapped
    xq = clustered(8, 16, seed=8)
    got = searcher.search(Encoded(xq, None), SearchParams(k=10, nprobe=SMALL.nlist))
    np.testing.assert_array_equal(np.array(got.rows), brute_topk(xq, np.asarray(index.values), 10)[1])


def test_fewer_rows_than_lists_train_as_many_lists_as_rows(tmp_path):
    index = make_index(tmp_path, n=40, ann=IVFConfig(nlist=64))
    assert index.manifest["first_stage"]["nlist"] == 40 == index.ann.nlist


def test_many_lists_train_on_tens_of_rows_each_whatever_train_size_says(monkeypatch):
    trained_on, train = [], faiss.IndexIVFScalarQuantizer.train

    def counted_train(index, x):
        trained_on.append(len(x))
        return train(index, x)

    monkeypatch.setattr(faiss.IndexIVFScalarQuantizer, "train", counted_train)
    xb = clustered(6000, 8, seed=2)
    build_ivf(xb, IVFConfig(nlist=16, train_size=5000))
    build_ivf(xb, IVFConfig(nlist=64, train_size=500))
    assert trained_on == [5000, 64 * 64]


def test_gated_kinds_rerank_the_ivf_candidates_exactly(tmp_path):
    index = make_index(tmp_path, "dhr", ann=SMALL)
    rng = np.random.default_rng(9)
    queries = Encoded(clustered(4, 32, seed=10), (rng.random((4, 16)) < 0.3).astype(np.uint8))
    ivf = Searcher(index).search(queries, SearchParams(k=10, candidates=600, nprobe=16))
    flat = Searcher(index, engine="torch").search(queries, SearchParams(k=10, candidates=600))
    assert ivf.ids == flat.ids
    np.testing.assert_allclose(ivf.scores, flat.scores, rtol=1e-4, atol=1e-3)


def test_lists_of_other_rows_fail_the_load(tmp_path):
    index = make_index(tmp_path, ann=SMALL)
    write_ivf(clustered(50, 16, seed=11), index.path, SMALL)
    manifest = json.loads((index.path / "manifest.json").read_text())
    manifest["files"][ANN_FILE]["bytes"] = (index.path / ANN_FILE).stat().st_size
    (index.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexLoadError, match=f"{ANN_FILE}.*holds 50 vectors"):
        load_index(index.path, checksums=False)


def test_a_graph_file_in_place_of_the_lists_fails_the_load(tmp_path):
    index = make_index(tmp_path, ann=SMALL)
    faiss.write_index(faiss.IndexFlatIP(16), str(index.path / ANN_FILE))
    manifest = json.loads((index.path / "manifest.json").read_text())
    manifest["files"][ANN_FILE]["bytes"] = (index.path / ANN_FILE).stat().st_size
    (index.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexLoadError, match="expected an IVF index"):
        load_index(index.path, checksums=False)


def test_cli_import_takes_the_ivf_options(tmp_path, fake_models):
    xb = write_pyserini(tmp_path / "pyserini")
    base = ["index", "import", str(tmp_path / "pyserini"), "--model", "fake:cls"]
    result = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "ix"), "--ann", "ivf", "--ivf-lists", "8",
                                      "--ivf-codes", "fp16", "--nprobe", "3"])
    assert result.exit_code == 0, result.output
    index = load_index(tmp_path / "ix")
    recorded = index.manifest["first_stage"]
    assert (recorded["type"], recorded["nlist"], recorded["encoding"], recorded["nprobe"]) == ("ivf", 8, "fp16", 3)
    assert index.ann.nlist == 8 and index.ann.ntotal == len(xb) and index.vector_store().nprobe == 3


@pytest.mark.parametrize("flags, named", [(["--ivf-codes", "int4"], "--ivf-codes"), (["--ivf-lists", "-1"], "--ivf-lists"),
                                          (["--nprobe", "0"], "--nprobe"), (["--pq", "8"], "--pq")])
def test_cli_refuses_bad_ivf_flags(tmp_path, fake_models, flags, named):
    write_pyserini(tmp_path / "pyserini")
    result = CliRunner().invoke(app, ["index", "import", str(tmp_path / "pyserini"), "--model", "fake:cls",
                                      "--out", str(tmp_path / "ix"), "--ann", "ivf", *flags])
    assert result.exit_code == 2 and named in result.output, result.output
    assert not (tmp_path / "ix").exists()


def test_pending_writes_search_beside_the_lists_as_a_fresh_build(tmp_path):
    from densehybrid.index.building.build import build_from_arrays
    from densehybrid.index.writes.live import LiveIndex
    from support.fake_encoder import FakeEncoder
    from test_live_index import astuple, check_same, corpus, encode

    encoder, base_docs, added = FakeEncoder("cls"), corpus("b", 60, 1), corpus("n", 12, 2)
    build_from_arrays(tmp_path / "index", encoder.spec, encode(encoder, base_docs), base_docs,
                      ann=IVFConfig(nlist=8, nprobe=1))
    live = LiveIndex.open(tmp_path / "index", Searcher, log_dir=tmp_path / "index.wal")
    live.upsert(added, *astuple(encode(encoder, added)))
    live.delete("b10")
    final = [d for d in base_docs if d.id != "b10"] + added
    reference = load_index(build_from_arrays(tmp_path / "flat", encoder.spec, encode(encoder, final), final))
    assert live.first_stage == {"type": "ivf", "nprobe": 1}
    check_same(live, reference, encoder, k=10, nprobe=8)  # every list: the exact top-10 of base and delta
    live.close()


def test_the_lists_scale_with_the_rows_and_keep_tens_of_rows_each():
    from densehybrid.index.engines.ivf_engine import MIN_ROWS_PER_LIST, lists_for

    assert [lists_for(n) for n in (827_284, 1_000_000, 8_841_823)] == [4096, 4096, 16384]
    assert lists_for(8192) == 8192 // MIN_ROWS_PER_LIST == 210  # 4 sqrt(8192) = 362 lists would hold 22 rows each
    assert all(lists_for(n) * MIN_ROWS_PER_LIST <= max(n, MIN_ROWS_PER_LIST) for n in (1, 10, 100, 5000, 10**6))
    assert lists_for(10) == 1


def test_an_index_built_without_a_list_count_gets_one_from_its_rows(tmp_path):
    index = make_index(tmp_path, n=2000, ann=IVFConfig(nprobe=2, train_size=2000))
    assert index.manifest["first_stage"]["nlist"] == 51 == index.ann.nlist  # 4 sqrt(2000) = 179 > 2000 // 39

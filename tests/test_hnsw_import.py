"""The HNSW first stage over the one stored copy of the vectors: ``index import --ann hnsw`` and the layout
it shares with ``index build`` (``vectors.faiss`` and the graph; no ``values.npy``, no ``first_stage.faiss``);
a request's ``ef_search`` reaches the graph only."""

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from support.fake_encoder import FakeEncoder
from densehybrid.cli.main import app
from densehybrid.encoder.base import Encoded
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.engines.hnsw_engine import ANN_FILE, HNSWConfig, HnswStore
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index, verify_index
from test_hnsw import make_index
from test_import_pyserini import COUNT, write_pyserini

SMALL = HNSWConfig(m=12, ef_construction=40, ef_search=24, train_size=200)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_import_writes_the_graph_of_the_stored_rows_and_rescores_from_them(tmp_path, dtype):
    xb = write_pyserini(tmp_path / "pyserini")
    out = import_pyserini(tmp_path / "pyserini", tmp_path / "ix", FakeEncoder("cls").spec,
                          ImportOptions(values_dtype=dtype, ann=SMALL))
    names = {p.name for p in out.iterdir()}
    assert {"vectors.faiss", ANN_FILE} <= names and not {"values.npy", "first_stage.faiss"} & names
    index = load_index(out)
    assert index.first_stage_kind == "hnsw" and index.ann.ntotal == COUNT
    assert index.manifest["first_stage"]["type"] == "hnsw" and ANN_FILE in verify_index(out)["files"]
    store = index.vector_store()
    assert isinstance(store, HnswStore) and store.values is index.values  # the one copy, memory-mapped
    xq = xb[:5] + 0.05 * np.random.default_rng(2).standard_normal(xb[:5].shape).astype(np.float32)
    found = index.search(Encoded(xq, None), SearchParams(k=10, ef_search=COUNT))
    exact = xq @ np.asarray(index.values, np.float32).T
    for q, rows in enumerate(found.rows):
        assert set(rows) == set(np.argsort(-exact[q], kind="stable")[:10].tolist())
        np.testing.assert_allclose(found.scores[q], exact[q, rows], rtol=1e-5, atol=1e-5)  # exact scores


def test_cli_import_takes_the_ann_options_and_refuses_the_retired_pq_flag(tmp_path, fake_models):
    write_pyserini(tmp_path / "pyserini")
    base = ["index", "import", str(tmp_path / "pyserini"), "--model", "fake:cls"]
    result = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "ix"), "--ann", "hnsw", "--hnsw-m", "8",
                                      "--ef-search", "40"])
    assert result.exit_code == 0, result.output
    recorded = load_index(tmp_path / "ix").manifest["first_stage"]
    assert (recorded["type"], recorded["m"], recorded["ef_search"], recorded["metric"]) == ("hnsw", 8, 40, "inner_product")
    augmented = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "old"), "--ann", "hnsw",
                                         "--hnsw-metric", "l2_augmented"])
    assert augmented.exit_code == 0, augmented.output
    old = load_index(tmp_path / "old")
    assert old.manifest["first_stage"]["metric"] == "l2_augmented" and old.manifest["first_stage"]["max_norm2"] > 0
    assert old.ann.metric_type == faiss.METRIC_L2
    unknown = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "odd"), "--ann", "hnsw", "--hnsw-metric", "cos"])
    assert unknown.exit_code == 2 and "inner_product" in unknown.output, unknown.output
    refused = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "both"), "--ann", "hnsw", "--pq", "8"])
    assert refused.exit_code == 2 and "--pq" in refused.output, refused.output
    assert not (tmp_path / "both").exists()


def test_approx_gip_scans_active_columns_and_ignores_ef_search(tmp_path):
    """``approx_gip`` is a scan of the query's active columns on every engine: a request's ef_search does not
    reach it (it used to be passed on and fail)."""
    index = make_index(tmp_path, "dhr")
    rng = np.random.default_rng(9)
    queries = Encoded(rng.standard_normal((3, 32)).astype(np.float32), (rng.random((3, 16)) < 0.3).astype(np.uint8))
    params = SearchParams(k=10, first_stage="approx_gip", candidates=200, theta=0.0)
    graph = index.search(queries, params.but(ef_search=64))
    assert graph.ids == index.search(queries, params).ids
    assert graph.ids == Searcher(index, engine="torch").search(queries, params).ids

"""Filters: the numpy row mask against a per-row Python evaluation, and filtered search against brute force
over the filtered rows, for the Faiss (flat and PQ) and torch engines, at selectivities from 0.01 % to 100 %."""

import json
import operator
import re

import numpy as np
import pytest

from densehybrid.encoder.base import Encoded, EncoderSpec
from densehybrid.index.building import build
from densehybrid.index.search import filters, fusion, gip
from densehybrid.index.storage.documents import Document
from densehybrid.index.errors import IndexWriteError
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.payload import Payload, PayloadError, load_payload
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.params import SearchParams
from test_gip import random_rows

# -- the row mask -------------------------------------------------------------------------

SCHEMA = {"kw": "keyword", "tags": "keyword_list", "n": "integer", "x": "float", "flag": "bool"}
WORDS = ["red", "green", "blue", "cyan", "ünïcode", ""]


def random_rows_of_fields(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = {}
        if rng.random() < 0.9:
            row["kw"] = str(rng.choice(WORDS))
        if rng.random() < 0.8:
            row["tags"] = [str(w) for w in rng.choice(WORDS, rng.integers(0, 4))]
        if rng.random() < 0.9:
            row["n"] = int(rng.integers(-5, 6))
        if rng.random() < 0.9:
            row["x"] = float(np.round(rng.normal(), 2))
        if rng.random() < 0.9:
            row["flag"] = bool(rng.random() < 0.5)
        rows.append(row)
    return rows


def random_filter(rng, depth: int = 0) -> dict:
    if depth < 3 and rng.random() < 0.35:
        op = rng.choice(["and", "or", "not"])
        if op == "not":
            return {"not": random_filter(rng, depth + 1)}
        return {str(op): [random_filter(rng, depth + 1) for _ in range(rng.integers(1, 4))]}
    name = str(rng.choice(list(SCHEMA)))
    kind = SCHEMA[name]

    def value():
        if kind in ("keyword", "keyword_list"):
            return str(rng.choice(WORDS + ["absent"]))
        if kind == "integer":
            return int(rng.integers(-6, 7))
        if kind == "float":
            return float(np.round(rng.normal(), 2))
        return bool(rng.random() < 0.5)

    ops = ["eq", "in", "exists"] + (["range"] if kind in ("integer", "float") else [])
    op = rng.choice(ops)
    if op == "eq":
        return {"field": name, "eq": value()}
    if op == "in":
        return {"field": name, "in": [value() for _ in range(rng.integers(1, 4))]}
    if op == "exists":
        return {"field": name, "exists": True}
    chosen = rng.choice(["gt", "gte", "lt", "lte"], rng.integers(1, 3), replace=False)
    return {"field": name, "range": {str(b): float(np.round(rng.normal() * 4, 1)) for b in chosen}}


def python_match(raw: dict, row: dict) -> bool:
    """One row, straight from the grammar's definition."""
    if "and" in raw:
        return all(python_match(p, row) for p in raw["and"])
    if "or" in raw:
        return any(python_match(p, row) for p in raw["or"])
    if "not" in raw:
        return not python_match(raw["not"], row)
    value = row.get(raw["field"])
    if value is None or value == []:
        return False
    elements = value if isinstance(value, list) else [value]
    if "exists" in raw:
        return True
    if "eq" in raw:
        return any(e == raw["eq"] and type(e) is type(raw["eq"]) or
                   isinstance(e, float) and e == raw["eq"] for e in elements)
    if "in" in raw:
        return any(python_match({"field": raw["field"], "eq": v}, row) for v in raw["in"])
    checks = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}
    return all(checks[op](value, bound) for op, bound in raw["range"].items())


def test_row_mask_equals_a_per_row_python_evaluation(tmp_path):
    rows = random_rows_of_fields(400, seed=3)
    payload = Payload.from_rows(SCHEMA, rows)
    payload.write(tmp_path)
    loaded = load_payload(tmp_path / "fields.npz", SCHEMA, len(rows))
    rng = np.random.default_rng(11)
    kept_counts = set()
    for _ in range(400):
        raw = random_filter(rng)
        node = filters.parse(raw, SCHEMA)
        want = np.array([python_match(raw, r) for r in rows])
        for p in (payload, loaded):
            got = filters.evaluate(node, p)
            assert got.dtype == bool and got.shape == (len(rows),)
            np.testing.assert_array_equal(got, want, err_msg=json.dumps(raw))
        kept_counts.add(int(want.sum()))
    assert min(kept_counts) == 0 and max(kept_counts) == len(rows) and len(kept_counts) > 50


def test_payload_values_round_trip(tmp_path):
    rows = random_rows_of_fields(50, seed=4)
    payload = Payload.from_rows(SCHEMA, rows)
    payload.write(tmp_path)
    loaded = load_payload(tmp_path / "fields.npz", SCHEMA, len(rows))
    want = [{k: v for k, v in r.items() if v != []} for r in rows]
    assert loaded.rows(range(len(rows))) == want
    assert loaded.rows([3, 1], ["kw"]) == [{k: v for k, v in want[i].items() if k == "kw"} for i in (3, 1)]


def test_keyword_list_matches_any_element():
    payload = Payload.from_rows({"tags": "keyword_list"}, [{"tags": ["a", "b"]}, {"tags": ["c"]}, {}, {"tags": []}])
    assert filters.evaluate(filters.parse({"field": "tags", "eq": "b"}, payload.schema), payload).tolist() == \
        [True, False, False, False]
    assert filters.evaluate(filters.parse({"field": "tags", "in": ["c", "a"]}, payload.schema), payload).tolist() == \
        [True, True, False, False]
    assert filters.evaluate(filters.parse({"field": "tags", "exists": True}, payload.schema), payload).tolist() == \
        [True, True, False, False]


def test_integer_range_with_fractional_and_huge_bounds():
    payload = Payload.from_rows({"n": "integer"}, [{"n": v} for v in (-2, 0, 1, 2, 3, 2**62)])
    schema = payload.schema

    def kept(bounds):
        return filters.evaluate(filters.parse({"field": "n", "range": bounds}, schema), payload).tolist()

    assert kept({"gt": 0.5, "lt": 2.5}) == [False, False, True, True, False, False]
    assert kept({"gte": -1.5, "lte": 1.0}) == [False, True, True, False, False, False]
    assert kept({"lt": 1e30}) == [True] * 6
    assert kept({"gt": 1e30}) == [False] * 6
    huge = -437083652262111746437797322063609856  # JSON integers have no size limit
    for raw in ({"field": "n", "eq": huge}, {"field": "n", "in": [huge, 2**64, 3]}):
        got = filters.evaluate(filters.parse(raw, schema), payload).tolist()
        assert got == [False, False, False, False, "in" in raw, False], raw


@pytest.mark.parametrize("raw, field, words", [
    ({"field": "nope", "eq": 1}, "nope", "unknown field"),
    ({"field": "kw", "range": {"gt": 1}}, "kw", "range"),
    ({"field": "n", "eq": "3"}, "n", "integer"),
    ({"field": "n", "eq": 2.5}, "n", "integer"),
    ({"field": "flag", "in": [1]}, "flag", "bool"),
    ({"field": "x", "eq": True}, "x", "float"),
    ({"field": "kw", "exists": False}, "kw", "exists"),
    ({"and": []}, "filter", "non-empty"),
    ({"field": "n", "eq": 1, "in": [1]}, "filter", "one of"),
    ({"field": "kw", "in": ["k" * 1025]}, "kw", "at most 1024"),
])
def test_filters_that_do_not_fit_the_schema_name_the_field(raw, field, words):
    with pytest.raises(filters.FilterError) as caught:
        filters.parse(raw, SCHEMA)
    assert caught.value.field == field and words in str(caught.value)


def test_filter_size_is_bounded_without_recursion():
    deep = {"field": "n", "eq": 1}
    for _ in range(100_000):  # far past Python's recursion limit: refused before anything recurses
        deep = {"not": deep}
    with pytest.raises(filters.FilterError, match="deeper"):
        filters.parse(deep, SCHEMA)
    wide = {"or": [{"field": "n", "eq": i} for i in range(filters.MAX_NODES)]}
    with pytest.raises(filters.FilterError, match="parts"):
        filters.parse(wide, SCHEMA)


def test_milvus_expression_spells_each_operator():
    node = filters.parse({"and": [{"field": "kw", "in": ["a", 'q"uote']}, {"not": {"field": "tags", "eq": "x"}},
                                  {"field": "n", "range": {"gt": 0.5, "lte": 3}}, {"field": "flag", "eq": True}]},
                         SCHEMA)
    assert filters.to_milvus(node, SCHEMA) == (
        '((has_kw == true and f_kw in ["a", "q\\"uote"]) and '
        '(not (has_tags == true and array_contains_any(f_tags, ["x"]))) and '
        '(has_n == true and f_n >= 1 and f_n <= 3) and (has_flag == true and f_flag in [true]))')


# -- build -------------------------------------------------------------------------------

def write_corpus(path, metadata):
    with open(path, "w", encoding="utf-8") as f:
        for i, m in enumerate(metadata):
            f.write(json.dumps({"_id": f"d{i}", "text": f"passage {i}", **({"metadata": m} if m is not None else {})})
                    + "\n")
    return path


def test_read_payload_infers_types_and_names_the_conflicting_line(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"a": 1, "b": "x", "c": ["p"]}, None, {"a": 2.5, "d": True}])
    payload = build.read_payload(corpus, None)
    assert payload.schema == {"a": "float", "b": "keyword", "c": "keyword_list", "d": "bool"}
    assert payload.rows(range(3)) == [{"a": 1.0, "b": "x", "c": ["p"]}, {}, {"a": 2.5, "d": True}]
    assert build.read_payload(corpus, ["b"]).schema == {"b": "keyword"}
    bad = write_corpus(tmp_path / "bad.jsonl", [{"a": "x"}, {"a": "y"}, {"a": 3}])
    with pytest.raises(IndexWriteError, match=r"bad.jsonl:3: field 'a' is integer here but keyword"):
        build.read_payload(bad, ["a"])
    nested = write_corpus(tmp_path / "nested.jsonl", [{"a": {"deep": 1}}])
    with pytest.raises(IndexWriteError, match=r"nested.jsonl:1: field 'a'"):
        build.read_payload(nested, None)
    with pytest.raises(IndexWriteError, match="field name"):
        build.read_payload(corpus, ["bad name"])


# -- filtered search equals brute force ---------------------------------------------------------

N = 20_000
SELECTIVITIES = (0.0001, 0.001, 0.01, 0.1, 0.5, 1.0)


def synthetic_index(tmp_path, kind: str, n: int = N, seed: int = 0):
    gated, dense = 24, 8
    dim = gated + dense if kind != "cls" else dense
    gated = gated if kind in ("dhr", "fusion") else 0
    spec = EncoderSpec(kind=kind, dim=dim, gated_dim=gated, lam=1.0, vocab_size=30522, dlr_dim=gated or None,
                       model_id="random", weights_hash="r")
    values, gates = random_rows(n, dim, gated, seed=seed, dtype=np.float32)
    values = values.astype(np.float16).astype(np.float32)  # what the float16 rows hold: every engine agrees
    rng = np.random.default_rng(seed + 1)
    rank = rng.permutation(n)  # "rank" < s·n keeps exactly that share of the rows
    rows = [{"rank": int(rank[i]), "tags": [str(t) for t in rng.choice(["a", "b", "c", "d"], rng.integers(0, 3))]}
            for i in range(n)]
    payload = Payload.from_rows({"rank": "integer", "tags": "keyword_list"}, rows)
    docs = [Document(f"doc{i}", "", f"text {i}") for i in range(n)]
    out = build.build_from_arrays(tmp_path / f"{kind}-{n}", spec, Encoded(values, gates), docs,
                                  payload=payload)
    return load_index(out), values, gates, rank


def top_of(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` by score, ties by row, in plain numpy."""
    order = np.lexsort((rows, -scores.astype(np.float64)))[:k]
    return scores[order], rows[order]


def brute_force(xq, gq, values, gates, kept, k, candidates, rerank):
    """Per query: inner product over the kept rows, top ``candidates``, exact GIP of those (when reranking), top k."""
    out = []
    for q in range(len(xq)):
        ip = values[kept] @ xq[q]
        if not rerank:
            out.append(top_of(ip, kept, k)[1].tolist())
            continue
        _, first = top_of(ip, kept, candidates)
        exact = gip.score_rows(xq[q:q + 1], None if gq is None else gq[q:q + 1], values, gates, first[None])[0]
        out.append(top_of(exact, first, k)[1].tolist())
    return out


@pytest.fixture(scope="module")
def dhr_index(tmp_path_factory):
    return synthetic_index(tmp_path_factory.mktemp("filtered"), "dhr")


@pytest.mark.parametrize("engine", ["faiss", "torch"])
def test_filtered_search_equals_brute_force_over_the_kept_rows(dhr_index, engine):
    index, values, gates, rank = dhr_index
    searcher = Searcher(index, engine=engine)
    xq, gq = random_rows(3, index.spec.dim, index.spec.gated_dim, seed=5, dtype=np.float32)
    queries = Encoded(xq, gq)
    for share in SELECTIVITIES:
        cut = int(share * N)
        kept = np.flatnonzero(rank < cut)
        assert len(kept) == cut
        flt = filters.parse({"field": "rank", "range": {"lt": cut}}, index.field_types)
        for rerank, candidates in ((False, 100), (True, 100)):
            found = searcher.search(queries, SearchParams(k=10, candidates=candidates, rerank=rerank, filter=flt))
            assert found.rows == brute_force(xq, gq, values, gates, kept, 10, candidates, rerank), (share, rerank)
            assert found.selectivity == pytest.approx(share)
            assert all(set(r) <= set(kept.tolist()) for r in found.rows)
            ids = [[f"doc{r}" for r in q_rows] for q_rows in found.rows]
            assert found.ids == ids


def test_filtered_approx_gip_equals_approx_gip_over_the_kept_rows(dhr_index):
    index, values, gates, rank = dhr_index
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=6, dtype=np.float32)
    for share in (0.001, 0.1):
        kept = np.flatnonzero(rank < int(share * N))
        flt = filters.parse({"field": "rank", "range": {"lt": int(share * N)}}, index.field_types)
        found = Searcher(index).search(Encoded(xq, gq),
                                       SearchParams(k=10, first_stage="approx_gip", rerank=False, filter=flt))
        _, local = gip.approx_topk(xq, gq, values[kept], gates[kept], 0.1, 10)
        assert found.rows == [kept[r].tolist() for r in local]


def test_filter_smaller_than_the_first_stage_depth_returns_those_rows_reranked(dhr_index):
    index, values, gates, rank = dhr_index
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=8, dtype=np.float32)
    flt = filters.parse({"field": "rank", "range": {"lt": 7}}, index.field_types)
    found = Searcher(index).search(Encoded(xq, gq), SearchParams(k=50, candidates=1000, filter=flt))
    kept = np.flatnonzero(rank < 7)
    exact = gip.exhaustive(xq, gq, values, gates)
    for q in range(2):
        assert found.rows[q] == top_of(exact[q][kept], kept, 50)[1].tolist()  # all 7, exact GIP order


@pytest.mark.parametrize("method", ["zscore", "minmax"])
def test_normalised_fusion_candidates_come_from_the_kept_rows(tmp_path, method):
    index, values, gates, rank = synthetic_index(tmp_path, "fusion", n=3000)
    xq, gq = random_rows(2, index.spec.dim, index.spec.gated_dim, seed=9, dtype=np.float32)
    cut = 300  # fewer rows than candidates: the union of both parts is every kept row
    flt = filters.parse({"field": "rank", "range": {"lt": cut}}, index.field_types)
    found = Searcher(index).search(Encoded(xq, gq), SearchParams(k=10, candidates=500, method=method, filter=flt))
    kept = np.flatnonzero(rank < cut)
    rows = np.broadcast_to(kept, (2, len(kept))).copy()
    lexical_q, dense_q = fusion.split_query(xq, index.spec.gated_dim)
    lexical = gip.score_rows(lexical_q, gq, values, gates, rows)
    dense = gip.score_rows(dense_q, gq, values, gates, rows)
    fused = fusion.fuse(lexical, dense, method, dense_weight=index.dense_weight, valid=np.ones_like(rows, bool))
    for q in range(2):
        assert found.rows[q] == top_of(fused[q], kept, 10)[1].tolist()


def test_keyword_list_filter_and_an_empty_match(dhr_index):
    index, values, gates, rank = dhr_index
    xq, gq = random_rows(1, index.spec.dim, index.spec.gated_dim, seed=10, dtype=np.float32)
    flt = filters.parse({"and": [{"field": "tags", "eq": "a"}, {"not": {"field": "tags", "in": ["b", "c"]}}]},
                        index.field_types)
    kept = np.flatnonzero(filters.evaluate(flt, index.payload))
    found = Searcher(index).search(Encoded(xq, gq), SearchParams(k=10, rerank=False, filter=flt))
    assert found.rows == brute_force(xq, gq, values, gates, kept, 10, 10, False)
    nothing = filters.parse({"field": "tags", "eq": "zzz"}, index.field_types)
    empty = Searcher(index).search(Encoded(xq, gq), SearchParams(k=10, filter=nothing))
    assert empty.rows == [[]] and empty.ids == [[]] and empty.selectivity == 0.0


# -- live writes ----------------------------------------------------------------------------

def live_brute_force(live, xq, flt, k):
    """Top ``k`` inner products over every live row the filter keeps, by document id."""
    ids, vectors, fields = [], [], []
    base, delta = live.base, live._state.delta
    for row in range(base.count):
        if row not in delta.hidden:
            ids.append(base.doc_ids[row])
            vectors.append(np.asarray(base.values[row], np.float32))
            fields.append(base.payload.rows([row])[0])
    for i in delta.live_rows:  # replaced or deleted delta rows stay in its storage, dead
        doc = delta.docs[i]
        ids.append(doc.id)
        vectors.append(delta.values[i])
        fields.append(doc.fields or {})
    payload = Payload.from_rows(base.field_types, fields)
    kept = np.flatnonzero(filters.evaluate(flt, payload))
    scores = np.stack(vectors)[kept] @ xq.T
    return [[ids[kept[i]] for i in np.lexsort((kept, -scores[:, q].astype(np.float64)))[:k]] for q in range(len(xq))]


def test_documents_written_live_carry_fields_through_the_log_and_compaction(tmp_path):
    from densehybrid.index.writes import compaction
    from densehybrid.index.writes.live import LiveIndex

    index, values, _, rank = synthetic_index(tmp_path, "cls", n=4000)
    path = index.path
    live = LiveIndex.open(path, Searcher, log_dir=tmp_path / "log", base=index)
    rng = np.random.default_rng(21)
    new = rng.normal(size=(300, index.spec.dim)).astype(np.float16).astype(np.float32)
    docs = [Document(f"new{i}", "", "t", {"rank": int(rng.integers(0, 8000)), "tags": ["a"] if i % 2 else ["z"]})
            for i in range(300)]
    docs[5] = Document("new5", "", "t")  # no fields: kept by no leaf, by a "not" of one
    live.upsert(docs[:200], new[:200], None)
    live.upsert([Document("doc7", "", "t", {"rank": 1})] + docs[200:], new[199:], None)  # doc7 replaced
    live.delete("doc8")
    # a written document replaced (its old row dead, with its old fields) and one deleted
    live.upsert([Document("new3", "", "t", {"rank": 2, "tags": ["q"]})], new[299:], None)
    live.delete("new10")
    assert len(live._state.delta.dead) == 2
    xq, _ = random_rows(3, index.spec.dim, 0, seed=22, dtype=np.float32)
    cases = [{"field": "rank", "range": {"lt": cut}} for cut in (3, 40, 400, 4000, 8000)] + [
        {"field": "tags", "eq": "z"}, {"not": {"field": "rank", "exists": True}}, {"field": "rank", "eq": 1},
        {"field": "tags", "eq": "q"}, {"field": "rank", "eq": docs[3].fields["rank"]},
        {"field": "rank", "eq": docs[10].fields["rank"]}]

    def check(live_index):
        for raw in cases:
            flt = filters.parse(raw, live_index.field_types)
            found = live_index.search(Encoded(xq, None), SearchParams(k=10, rerank=False, filter=flt))
            assert found.ids == live_brute_force(live_index, xq, flt, 10), raw
            assert found.selectivity is not None

    check(live)
    rows = [live.row_of(i) for i in ("doc7", "new5", "new250", "doc9")]
    assert live.field_values(rows, ["rank", "tags"]) == [
        {"rank": 1}, {}, docs[250].fields, index.payload.rows([9])[0]]
    live.close()
    reopened = LiveIndex.open(path, Searcher, log_dir=tmp_path / "log")  # replayed from the log
    check(reopened)
    state = reopened._state
    compaction.fold(state.base, state.delta, path, applied_seq=5)
    reopened.close()
    folded = load_index(path)
    assert folded.field_types == index.field_types and folded.count == 4000 + 300 - 1 - 1
    compacted = LiveIndex.open(path, Searcher, log_dir=tmp_path / "log2")
    assert compacted._state.delta.empty
    for raw in cases:
        flt = filters.parse(raw, folded.field_types)
        got = compacted.search(Encoded(xq, None), SearchParams(k=10, rerank=False, filter=flt)).ids
        assert got == reopened.search(Encoded(xq, None), SearchParams(k=10, rerank=False, filter=flt)).ids


# -- on a CUDA machine (skipped here; the torch engine's CPU twin is tested above) --------------------
@pytest.mark.gpu
def test_gpu_filtered_search_equals_brute_force(dhr_index):
    index, values, gates, rank = dhr_index
    searcher = Searcher(index, device="cuda", float16=False)
    xq, gq = random_rows(3, index.spec.dim, index.spec.gated_dim, seed=5, dtype=np.float32)
    for share in SELECTIVITIES:
        cut = int(share * N)
        flt = filters.parse({"field": "rank", "range": {"lt": cut}}, index.field_types)
        found = searcher.search(Encoded(xq, gq), SearchParams(k=10, candidates=100, filter=flt))
        assert found.rows == brute_force(xq, gq, values, gates, np.flatnonzero(rank < cut), 10, 100, True), share


def test_cli_builds_fields_and_searches_with_a_filter(tmp_path, fake_models):
    from typer.testing import CliRunner

    from densehybrid.cli.main import app

    corpus = write_corpus(tmp_path / "corpus.jsonl", [{"kind": "class" if i % 3 else "function", "n": i}
                                                      for i in range(30)])
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(corpus), "--out",
                                str(tmp_path / "ix"), "--no-progress", "--field", "kind", "--field", "n"])
    assert built.exit_code == 0, built.output
    assert load_index(tmp_path / "ix").field_types == {"kind": "keyword", "n": "integer"}
    found = runner.invoke(app, ["search", "--index", str(tmp_path / "ix"), "passage", "-k", "30",
                                "--filter", '{"field": "kind", "eq": "function"}'])
    assert found.exit_code == 0, found.output
    shown = set(re.findall(r"\bd\d+\b", found.output))
    assert shown == {f"d{i}" for i in range(0, 30, 3)}
    bad = runner.invoke(app, ["search", "--index", str(tmp_path / "ix"), "x", "--filter", '{"field": "n", "eq": "1"}'])
    assert bad.exit_code == 2 and "'n'" in bad.output
    conflict = write_corpus(tmp_path / "conflict.jsonl", [{"n": 1}, {"n": "one"}])
    failed = runner.invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(conflict), "--out",
                                 str(tmp_path / "ix2"), "--no-progress", "--fields-from-metadata"])
    assert failed.exit_code != 0 and "conflict.jsonl:2: field 'n'" in " ".join(failed.output.split())
    assert not (tmp_path / "ix2").exists()


# -- filters with pages, rrf and part scores ----------------------------------------------------
def subset_index(tmp_path, index, values, gates, kept):
    """The same rows as ``index`` keeps, alone in an index of their own (row i = kept[i])."""
    docs = [Document(f"doc{r}", "", f"text {r}") for r in kept]
    out = build.build_from_arrays(tmp_path / "subset", index.spec, Encoded(values[kept], gates[kept]), docs)
    return load_index(out)


@pytest.mark.parametrize("engine", ["faiss", "torch"])
@pytest.mark.parametrize("method", ["lambda", "zscore", "rrf"])
def test_a_filtered_page_is_the_page_of_an_index_of_the_kept_rows_alone(tmp_path, engine, method):
    index, values, gates, rank = synthetic_index(tmp_path, "fusion", n=3000)
    kept = np.flatnonzero(rank < 400)
    alone = subset_index(tmp_path, index, values, gates, kept)
    flt = filters.parse({"field": "rank", "range": {"lt": 400}}, index.field_types)
    queries = Encoded(*random_rows(2, index.spec.dim, index.spec.gated_dim, seed=11, dtype=np.float32))
    filtered, reference = Searcher(index, engine=engine), Searcher(alone, engine=engine)
    for offset, k in ((0, 20), (0, 10), (10, 10)):
        got = filtered.search(queries, SearchParams(k=k, offset=offset, candidates=100, method=method, filter=flt))
        want = reference.search(queries, SearchParams(k=k, offset=offset, candidates=100, method=method))
        assert got.rows == [kept[r].tolist() for r in want.rows], (offset, k)
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.lexical_scores, want.lexical_scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.dense_scores, want.dense_scores, rtol=1e-5, atol=1e-6)
    first = filtered.search(queries, SearchParams(k=20, candidates=100, method=method, filter=flt))
    pages = [filtered.search(queries,
                             SearchParams(k=10, offset=o, candidates=100, method=method, filter=flt)) for o in (0, 10)]
    assert first.rows == [a + b for a, b in zip(pages[0].rows, pages[1].rows)]

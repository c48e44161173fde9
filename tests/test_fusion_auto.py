"""``--fusion auto``: the mix a fused index chooses from its corpus (index/building/fusion_choice.py,
pseudo_queries.py), its manifest and /info record, its use by searches, and its survival of a fold."""

import json
import random

import httpx
import numpy as np
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.quality import earlier_rules
from densehybrid.index.building import fusion_choice, pseudo_queries
from densehybrid.index.building.build import BuildOptions, build_from_arrays, build_index
from densehybrid.index.search import fusion
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.storage.documents import Document
from densehybrid.index.served.loading import load_index
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta, upsert
from densehybrid.index.writes.merged import merged_search
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from support.fake_encoder import FakeEncoder


def parts_with_signal(rng, q, p, lexical_signal, dense_signal):
    """Part scores (Q, P) of pure noise, the ``source`` column of each row lifted by each part's signal
    (Q,); the two parts on very different scales (the rule must not care)."""
    source = rng.integers(0, p, q)
    lexical, dense = rng.normal(size=(q, p)), rng.normal(size=(q, p))
    rows = np.arange(q)
    lexical[rows, source] += lexical_signal
    dense[rows, source] += dense_signal
    return 40.0 * lexical + 3.0, 0.05 * dense, source


def brute_gain(row, source, valid):
    """nDCG@10 of one relevant column, rank counted in plain Python (ties count half)."""
    if not valid[source]:
        return 0.0
    own = row[source]
    rank = 1 + sum(1 for j, s in enumerate(row) if valid[j] and s > own)
    rank += 0.5 * sum(1 for j, s in enumerate(row) if valid[j] and s == own and j != source)
    return 1.0 / np.log2(1.0 + rank) if rank <= 10 else 0.0


def test_candidates_are_the_union_of_each_parts_top_depth():
    rng = np.random.default_rng(0)
    lexical, dense = rng.normal(size=(6, 50)), rng.normal(size=(6, 50))
    got = fusion_choice.candidates(lexical, dense, 7)
    for q in range(6):
        expected = set(np.argsort(-lexical[q])[:7]) | set(np.argsort(-dense[q])[:7])
        assert set(np.flatnonzero(got[q])) == expected


def test_source_gain_against_plain_python_with_ties_and_non_candidates():
    rng = np.random.default_rng(1)
    fused = rng.integers(0, 5, (30, 40)).astype(np.float64)  # many ties
    valid = rng.random((30, 40)) < 0.8
    source = rng.integers(0, 40, 30)
    got = fusion_choice.source_gain(fused, source, valid)
    expected = [brute_gain(fused[q], source[q], valid[q]) for q in range(30)]
    np.testing.assert_allclose(got, expected)


def test_choose_weight_keeps_the_prior_when_the_weights_tie_and_follows_a_clear_winner():
    weights = fusion_choice.WEIGHTS
    assert earlier_rules.within_one_error(np.ones((len(weights), 20))) == 0.5
    gains = np.zeros((len(weights), 50))
    gains[-1] = 1.0  # only dense alone ever finds the source
    assert earlier_rules.within_one_error(gains) == 1.0


def test_choose_weight_takes_the_weight_nearest_the_prior_within_one_standard_error():
    rng = np.random.default_rng(2)
    gains = rng.random((len(fusion_choice.WEIGHTS), 40))
    means = gains.mean(axis=1)
    best = int(np.argmax(means))
    diff = gains[best] - gains
    stderr = diff.std(axis=1, ddof=1) / np.sqrt(40)
    near = [i for i in range(len(means)) if diff[i].mean() <= stderr[i] + 1e-12]
    expected = min(near, key=lambda i: (abs(fusion_choice.WEIGHTS[i] - 0.5), -means[i]))
    assert earlier_rules.within_one_error(gains) == fusion_choice.WEIGHTS[expected]


def test_a_much_weaker_lexical_part_makes_the_choice_lean_dense():
    rng = np.random.default_rng(3)
    lexical, dense, source = parts_with_signal(rng, 200, 400, np.full(200, 0.5), np.full(200, 3.5))
    gains = fusion_choice.weight_gains(lexical, dense, source, 100)
    assert earlier_rules.within_one_error(gains) >= 0.7
    # and the mirror image leans lexical
    gains = fusion_choice.weight_gains(dense * 800, lexical / 800, source, 100)
    assert earlier_rules.within_one_error(gains) <= 0.3


@pytest.mark.parametrize("seed", [3, 7, 11])
def test_a_useless_part_leaves_nearly_all_the_weight_to_the_other_under_the_earlier_rule(seed):
    rng = np.random.default_rng(seed)
    lexical, dense, source = parts_with_signal(rng, 200, 400, np.zeros(200), np.full(200, 3.5))
    gains = fusion_choice.weight_gains(lexical, dense, source, 100)
    assert earlier_rules.one_part_fails(gains) and earlier_rules.paraphrases_alone(gains) >= 0.9
    gains = fusion_choice.weight_gains(dense * 800, lexical / 800, source, 100)
    assert earlier_rules.one_part_fails(gains) and earlier_rules.paraphrases_alone(gains) <= 0.1


def test_the_earlier_rules_bounds_hold_unless_one_part_fails_the_pseudo_queries():
    weights = fusion_choice.WEIGHTS
    gains = np.zeros((len(weights), 50))
    gains[-1], gains[0] = 1.0, 0.6  # only the pure parts find anything; lexical finds 60% of dense
    assert not earlier_rules.one_part_fails(gains)
    assert earlier_rules.paraphrases_alone(gains) == earlier_rules.BOUNDS[1]
    gains[0] = 0.4  # under half of what dense alone finds: the bounds go
    assert earlier_rules.one_part_fails(gains)
    assert earlier_rules.paraphrases_alone(gains) == 1.0
    # and the rule starts from dense alone: a mix as good as dense alone within noise is not kept
    rng = np.random.default_rng(9)
    flat = rng.random((len(weights), 80))
    flat[-4:] = flat[-1]  # 0.7 ... 1.0 tie
    flat[0] *= 0.2  # lexical alone fails
    assert earlier_rules.paraphrases_alone(flat) == 1.0
    assert earlier_rules.within_one_error(flat) != 1.0  # from the equal mix the rule would stop short of it
    assert earlier_rules.within_one_error(np.flipud(gains), bounds=(0.3, 0.7)) == 0.3


def test_complementary_parts_keep_a_fusion_that_beats_either_part():
    rng = np.random.default_rng(4)
    half = np.arange(200) % 2 == 0  # each part knows the answer for its own half of the queries
    lexical, dense, source = parts_with_signal(rng, 200, 400, np.where(half, 3.5, 1.5), np.where(half, 1.5, 3.5))
    gains = fusion_choice.weight_gains(lexical, dense, source, 100)
    chosen = earlier_rules.within_one_error(gains)
    assert 0.3 <= chosen <= 0.7
    at = fusion_choice.WEIGHTS.index(chosen)
    assert gains[at].mean() > max(gains[0].mean(), gains[-1].mean())


def test_the_choice_ignores_each_parts_scale():
    rng = np.random.default_rng(5)
    lexical, dense, source = parts_with_signal(rng, 100, 300, np.full(100, 1.0), np.full(100, 2.0))
    first = fusion_choice.weight_gains(lexical, dense, source, 60)
    np.testing.assert_allclose(fusion_choice.weight_gains(lexical * 1e3, dense * 1e-2, source, 60), first)


def test_a_pseudo_query_is_cut_out_of_its_answer():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    kind, query, answer = pseudo_queries.cut(Document("d", "", " ".join(words)), 8, rng)
    assert kind == "window" and len(query.split()) == 8
    assert len(answer.split()) == 22
    start = words.index(query.split()[0])
    assert query.split() == words[start:start + 8] and answer.split() == words[:start] + words[start + 8:]
    assert pseudo_queries.cut(Document("t", "Ada Lovelace", " ".join(words)), 8, rng) == \
        ("title", "Ada Lovelace", " ".join(words))
    assert pseudo_queries.cut(Document("s", "", "too short to cut"), 8, rng) is None


def brute_sentences(text):
    """Sentences by hand: a piece ends at ., ! or ? when whitespace or the end follows."""
    found, current = [], ""
    for i, char in enumerate(text):
        current += char
        if char in ".!?" and (i + 1 == len(text) or text[i + 1].isspace()):
            found.append(current.strip())
            current = ""
    return [piece for piece in found + [current.strip()] if piece]


@pytest.mark.parametrize("text", ["One two. Three four! Five six? Seven", "e.g. this stays whole. Next one.",
                                  "No end mark at all", "  Spaces.   Around.  ", "3.5 is a number. Yes."])
def test_sentences_split_after_end_marks_that_a_space_follows(text):
    assert pseudo_queries.sentences(text) == brute_sentences(text)


def test_a_sentence_is_cut_out_of_its_passage_when_one_fits():
    first = "This first sentence has exactly eight words here."
    second = "The second one is a little longer than the first one was."
    third = "Short."
    doc = Document("d", "", f"{first} {second} {third}")
    seen = set()
    for seed in range(20):
        kind, query, answer = pseudo_queries.cut(doc, 8, np.random.default_rng(seed))
        assert kind == "sentence" and query in (first, second)  # "Short." is under 5 words
        assert answer == " ".join(s for s in (first, second, third) if s != query)
        seen.add(query)
    assert seen == {first, second}
    # a sentence whose removal would leave fewer than ``window`` words is not cut: the window is
    words = " ".join(f"w{i}" for i in range(20))
    kind, _, _ = pseudo_queries.cut(Document("w", "", f"{words}. Tail."), 8, np.random.default_rng(0))
    assert kind == "window"
    # a title stays with the answer of a sentence cut (passages are encoded after their title)
    kind, query, answer = pseudo_queries.cut(Document("t", "Ada", doc.text), 8, np.random.default_rng(0))
    assert kind == "sentence" and answer.startswith("Ada ") and query not in answer


def write_corpus(path, count=240, seed=0):
    rng = random.Random(seed)
    vocab = [f"term{i}" for i in range(500)]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(vocab, k=40))}) + "\n")
    return path


@pytest.fixture(scope="module")
def auto_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    return build_index(FakeEncoder("fusion"), write_corpus(root / "corpus.jsonl"), root / "index",
                       BuildOptions(progress=False, fusion_method="auto"))


def test_the_manifest_records_the_choice_and_its_statistics(auto_index):
    index = load_index(auto_index)
    entry = index.manifest["fusion"]
    assert entry["method"] == "auto" and index.fusion_method == "auto"
    chosen = entry["auto"]
    assert chosen["method"] == "zscore" and chosen["dense_weight"] in fusion_choice.WEIGHTS
    assert chosen["pseudo_queries"] == 200 and chosen["windows"] == 200 and chosen["pool"] == 240
    assert chosen["sentences"] == chosen["titles"] == 0  # the corpus has no titles and no end marks
    assert len(chosen["paraphrase_ndcg_at_10"]) == len(chosen["weights"]) == len(fusion_choice.WEIGHTS)
    assert len(chosen["keyword_ndcg_at_10"]) == len(chosen["worst_regret"]) == len(fusion_choice.WEIGHTS)
    assert 0.0 <= chosen["confidence"] <= 1.0 and chosen["stronger_part"] in ("lexical", "dense")
    # the recorded worse regret is each weight's larger share lost over the two recorded curves, and the choice
    # is the allowed weight where it is least (rounded as recorded)
    assert chosen["dense_weight"] in chosen["allowed"]
    lost = [[(max(curve) - g) / max(curve) for g in curve]
            for curve in (chosen["paraphrase_ndcg_at_10"], chosen["keyword_ndcg_at_10"])]
    np.testing.assert_allclose(chosen["worst_regret"], np.max(lost, axis=0), atol=2e-3)
    if "least worse regret" in chosen["rule"]:
        least = min(chosen["worst_regret"][chosen["weights"].index(w)] for w in chosen["allowed"])
        assert chosen["worst_regret"][chosen["weights"].index(chosen["dense_weight"])] <= least + 2e-3
    assert index.auto_mix == ("zscore", chosen["dense_weight"])


def test_a_default_search_uses_the_chosen_mix_and_a_request_overrides_it(auto_index):
    index = load_index(auto_index)
    searcher = Searcher(index)
    encoder = FakeEncoder("fusion")
    queries = encoder.encode(["term1 term2 term3", "term40 term77", "term300"], "query")
    weight = index.auto_mix[1]
    default = searcher.search(queries, SearchParams(k=8))
    assert default.rows == searcher.search(queries, SearchParams(k=8, method="auto")).rows
    assert default.scores == searcher.search(queries, SearchParams(k=8, method="zscore", dense_weight=weight)).scores
    other = 0.0 if weight > 0.5 else 1.0
    assert searcher.search(queries, SearchParams(k=8, method="zscore", dense_weight=other)).scores != default.scores
    assert searcher.search(queries, SearchParams(k=8, method="zscore")).scores == \
        searcher.search(queries, SearchParams(k=8, method="zscore", dense_weight=0.5)).scores  # fixed methods keep ½


def test_with_writes_pending_a_default_search_merges_as_the_chosen_mix_does(auto_index):
    """The delta merge decides by the resolved mix whether delta rows can be ranked beside the base's
    (a per-query method cannot): ``auto`` must be resolved there exactly as in the searcher."""
    index = load_index(auto_index)
    encoder = FakeEncoder("fusion")
    docs = [Document(f"new{i}", "", f"term{i} term{i + 1} term{i + 2}") for i in range(1, 6)]
    written = encoder.encode([d.text for d in docs], "passage")
    delta = upsert(Delta(), index, docs, written.values, written.gates)
    queries = encoder.encode(["term1 term2 term3", "term4"], "query")
    searcher = Searcher(index)
    method, weight = index.auto_mix
    chosen = merged_search(searcher, delta, queries, SearchParams(k=8))
    named = merged_search(searcher, delta, queries, SearchParams(k=8, method=method, dense_weight=weight))
    assert chosen.rows == named.rows and chosen.scores == named.scores


def test_auto_on_an_index_without_a_choice_is_the_equal_zscore_mix(tmp_path):
    from test_search import make_index, queries_for

    index = make_index(tmp_path, "dhr", lam=0.5)
    assert index.auto_mix == ("zscore", fusion.DEFAULT_DENSE_WEIGHT)
    queries = queries_for(index, 3)
    searcher = Searcher(index)
    auto = searcher.search(queries, SearchParams(k=6, method="auto"))
    assert auto.scores == searcher.search(queries, SearchParams(k=6, method="zscore")).scores


def test_build_from_arrays_cannot_choose_without_the_encoder(tmp_path):
    encoder = FakeEncoder("fusion")
    docs = [Document(f"d{i}", "", f"text {i}") for i in range(5)]
    with pytest.raises(ValueError, match="auto"):
        build_from_arrays(tmp_path / "x", encoder.spec, encoder.encode([d.text for d in docs], "passage"), docs,
                          fusion_method="auto")


def test_a_corpus_too_short_for_pseudo_queries_keeps_the_equal_mix(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"short passage {i}"}) + "\n" for i in range(30)))
    index = load_index(build_index(FakeEncoder("fusion"), corpus, tmp_path / "index",
                                   BuildOptions(progress=False, fusion_method="auto")))
    assert index.auto_mix == ("zscore", 0.5) and index.manifest["fusion"]["auto"]["pseudo_queries"] == 0


def test_a_fold_keeps_the_choice(auto_index, tmp_path):
    base = load_index(auto_index)
    folded = load_index(fold(base, Delta(hidden=frozenset({0, 1, 2})), tmp_path / "gen", applied_seq=1))
    assert folded.count == base.count - 3
    assert folded.manifest["fusion"] == base.manifest["fusion"] and folded.auto_mix == base.auto_mix


def test_info_shows_the_choice_and_search_requests_can_override_it(auto_index):
    index = load_index(auto_index)
    app = create_app(ServiceSettings(max_wait_ms=5), encoder=FakeEncoder("fusion"), index=index)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        info = client.get("/info").json()
        assert info["index"]["fusion"] == index.manifest["fusion"]
        query = {"query": "term1 term2 term3", "k": 8}
        default = client.post("/search", json=query).json()["results"]
        chosen = client.post("/search", json={**query, "fusion": "auto"}).json()["results"]
        dense = client.post("/search", json={**query, "fusion": "dense"}).json()["results"]
    assert [h["id"] for h in default] == [h["id"] for h in chosen]
    expected = Searcher(index).search(FakeEncoder("fusion").encode([query["query"]], "query"),
                                      SearchParams(k=8, method="dense"))
    assert [h["id"] for h in dense] == expected.ids[0]


def scramble_queries(encoder, part, seed=0):
    """Make ``encoder``'s queries' ``part`` (lexical or dense) useless: each query gets another's."""
    from densehybrid.encoder.base import Encoded

    encode, gated = encoder.encode, encoder.spec.gated_dim

    def scrambled(texts, role, **kwargs):
        found = encode(texts, role, **kwargs)
        if role != "query":
            return found
        values, gates = found.values.copy(), found.gates
        order = np.roll(np.arange(len(values)), 1 + seed)  # no query keeps its own
        dims = slice(0, gated) if part == "lexical" else slice(gated, None)
        values[:, dims] = found.values[order, dims]
        return Encoded(values, gates[order] if part == "lexical" else gates)

    encoder.encode = scrambled
    return encoder


@pytest.mark.realmodel
def test_real_models_choice_follows_the_useful_part(splade_tiny_dir, minilm_dir):
    """SPLADE-tiny ⊕ MiniLM on stdlib docstrings: both parts find the pseudo-queries' answers and their
    mix does at least as well as the better one; a part made useless (each query given another query's
    part) pulls the choice to the other part."""
    from densehybrid.cli.demo_corpus import stdlib_passages
    from densehybrid.encoder.loading import load_encoder

    def load():
        return load_encoder("splade-tiny", kind="fusion", dense_model="minilm")

    docs = [Document(p["_id"], "", p["text"]) for p in stdlib_passages(600) if len(p["text"].split()) >= 40][:100]
    encoded = load().encode([d.text for d in docs], "passage")
    config = fusion_choice.AutoFusionConfig(queries=60)
    plain = fusion_choice.choose(load(), docs, encoded.values, encoded.gates, config)
    gains = plain["paraphrase_ndcg_at_10"]
    assert plain["pseudo_queries"] == 60 and min(gains[0], gains[-1]) > 0.2
    assert gains[plain["weights"].index(plain["dense_weight"])] >= max(gains[0], gains[-1])
    no_lexical = fusion_choice.choose(scramble_queries(load(), "lexical"), docs, encoded.values, encoded.gates, config)
    no_dense = fusion_choice.choose(scramble_queries(load(), "dense"), docs, encoded.values, encoded.gates, config)
    assert no_lexical["dense_weight"] >= 0.8 and no_dense["dense_weight"] <= 0.2

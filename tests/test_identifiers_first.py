"""An identifier asked alone is answered first by the passages that hold it whole (index/search/identifiers.py)."""

import json
from dataclasses import dataclass
from types import SimpleNamespace

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.building.commands import search_texts
from densehybrid.index.search.identifiers import (DEPTH, HOLDER_BONUS, described, holders_first, holders_first_page,
                                                  holds_whole, looks_like_identifier, widened)
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.index.storage.documents import Document
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from support.fake_encoder import FakeEncoder
from test_fusion_auto import write_corpus


@pytest.mark.parametrize("query", ["--preserve-timestamps", "PermitRootLogin", "SSL_CTX_new", "os.path.join",
                                   "LD_LIBRARY_PATH", "HTTP", "$HOME", "std::vector", " BIO_f_base64 "])
def test_options_keys_and_names_look_like_identifiers(query):
    assert looks_like_identifier(query)


@pytest.mark.parametrize("query", ["", "   ", "copy files and directories", "What is ABEND?", "python", "Linux",
                                   "set --all-proxy"])
def test_words_and_questions_do_not(query):
    assert not looks_like_identifier(query)


def test_an_identifier_is_held_only_whole():
    assert holds_whole("use --all-proxy=URL to", "--all-proxy")
    assert holds_whole("(see PermitRootLogin).", "PermitRootLogin")
    assert not holds_whole("use --all-proxy-types", "--all-proxy")  # a longer option
    assert not holds_whole("the --xall-proxy flag", "--all-proxy")
    assert not holds_whole("MAX_PermitRootLogin", "PermitRootLogin")
    assert holds_whole("a.b+c", "a.b+c")  # the query is matched literally, not as a pattern
    assert not holds_whole("aXb+c", "a.b+c")


def test_holders_move_to_the_front_each_group_in_the_mixs_order():
    texts = ["no", "has CacheDir here", "none", "CacheDir first", "CacheDirs only"]
    assert holders_first("CacheDir", texts) == ([1, 3, 0, 2, 4], [True, True, False, False, False])
    assert holders_first("cache dir", texts) == ([0, 1, 2, 3, 4], [False] * 5)  # not an identifier
    assert holders_first("MissingKey", texts) == ([0, 1, 2, 3, 4], [False] * 5)  # nothing holds it


@dataclass(frozen=True)
class Found:
    ids: list
    scores: list
    rows: list
    lexical_scores: list | None = None
    dense_scores: list | None = None


def test_a_page_is_cut_from_the_reordered_hits_and_holders_score_above_the_rest():
    count = DEPTH + 20
    ids = [f"d{i}" for i in range(count)]
    scores = [float(count - i) for i in range(count)]  # the mix's order
    held = {"d5", "d60", "d110"}  # d110 lies past the hits a holder is looked for among
    texts = {i: "see --dry-run here" if i in held else "other" for i in ids}
    found = Found([ids, ids], [scores, scores], [list(range(count))] * 2, [scores, scores], [scores, scores])
    asked = []

    def documents(wanted):
        asked.append(list(wanted))
        return [Document(i, "", texts[i]) for i in wanted]

    page, marks = holders_first_page(found, ["--dry-run", "dry run"], documents, 1, 3)
    assert asked == [ids[:DEPTH]]  # the documents of the identifier query's first DEPTH hits only
    assert page.ids == [["d60", "d0", "d1"], ["d1", "d2", "d3"]]  # d5 is the page before's first hit
    assert marks == [[True, False, False], [False, False, False]]
    assert page.scores[0] == [scores[60] + HOLDER_BONUS, scores[0], scores[1]] and page.scores[1] == scores[1:4]
    assert page.rows[0] == [60, 0, 1] and page.lexical_scores[0] == [scores[60], scores[0], scores[1]]
    whole, _ = holders_first_page(found, ["--dry-run"] * 2, documents, 0, count)
    assert whole.ids[0][:2] == ["d5", "d60"] and whole.ids[0][DEPTH:] == ids[DEPTH:]  # d110 keeps its place
    assert all(a > b for a, b in zip(whole.scores[0], whole.scores[0][1:]))  # scores still fall with the rank


def test_the_search_a_page_is_cut_from_starts_at_the_first_hit_and_reaches_depth():
    assert widened(SearchParams(k=10, offset=20), 10_000) == SearchParams(k=DEPTH, offset=0)
    assert widened(SearchParams(k=50, offset=200), 10_000) == SearchParams(k=250, offset=0)
    assert widened(SearchParams(k=10), 30) == SearchParams(k=30, offset=0)


@pytest.fixture(scope="module")
def named_index(tmp_path_factory):
    """A fusion index with the auto mix whose passages d7 and d150 name ``--dry-run`` and d3 ``--dry-runs``."""
    root = tmp_path_factory.mktemp("identifiers")
    corpus = write_corpus(root / "corpus.jsonl")
    docs = [json.loads(line) for line in corpus.open()]
    for number, name in ((7, "--dry-run"), (150, "--dry-run"), (3, "--dry-runs")):
        docs[number]["text"] += f" use {name} to see"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return build_index(FakeEncoder("fusion"), corpus, root / "index", BuildOptions(progress=False, fusion_method="auto"))


def test_search_and_eval_put_an_identifiers_holders_first_and_mark_them(named_index):
    index = load_index(named_index)
    encoder = FakeEncoder("fusion")
    mix = Searcher(index).search(encoder.encode(["--dry-run"], "query"), SearchParams(k=DEPTH)).ids[0]
    holders = [i for i in mix if i in ("d7", "d150")]
    assert len(holders) == 2  # both are among the mix's best DEPTH of 240
    app = create_app(ServiceSettings(max_wait_ms=5), encoder=encoder, index=index)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        info = client.get("/info").json()["index"]["identifiers_first"]
        first = client.post("/search", json={"query": "--dry-run", "k": 4}).json()["results"]
        second = client.post("/search", json={"query": "--dry-run", "k": 1, "offset": 1}).json()["results"]
        plain = client.post("/search", json={"query": "--dry-run", "k": 4, "fusion": "zscore"}).json()["results"]
        prose = client.post("/search", json={"query": "term1 term2", "k": 4}).json()["results"]
    assert [h["id"] for h in first] == holders + [i for i in mix if i not in holders][:2]
    assert [h.get("exact_match") for h in first] == [True, True, None, None]
    assert info["depth"] == DEPTH and info["score_bonus"] == HOLDER_BONUS
    assert first[0]["fused_score"] == pytest.approx(first[0]["score"] - HOLDER_BONUS)
    assert [(h["id"], h["rank"]) for h in second] == [(holders[1], 2)]
    zscore = Searcher(index).search(encoder.encode(["--dry-run"], "query"), SearchParams(k=4, method="zscore")).ids[0]
    assert [h["id"] for h in plain] == zscore and all("exact_match" not in h for h in plain + prose)
    found = search_texts(encoder, Searcher(index), ["--dry-run", "term1 term2"], SearchParams(k=4))
    assert found.ids[0] == [h["id"] for h in first] and found.ids[1] == [h["id"] for h in prose]


@pytest.mark.parametrize(("kind", "method", "told"), [("fusion", "auto", True), ("dhr", "auto", True),
                                                      ("fusion", "zscore", False), ("cls", "auto", False)])
def test_info_describes_the_rule_only_where_the_default_is_the_auto_mix(kind, method, told):
    index = SimpleNamespace(spec=SimpleNamespace(kind=kind), fusion_method=method)
    assert (described(index) is not None) == told

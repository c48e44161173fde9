"""Truncation from either end, the token limit's errors, /tokenize and /decode, and per-index prompts.

Truncation is checked against the Hugging Face tokenizer's own ``truncation_side``; prompts against the
encoder run on ``prompt + text`` directly; the service on a live loopback server over a FakeEncoder index
built with prompts.
"""

import json
import random

import httpx
import numpy as np
import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import write_toy_corpus
from densehybrid.encoder.prompts import Prompts, PromptError
from densehybrid.encoder.tokenization import RoleTokenizer
from densehybrid.index.building.build import BuildOptions, build_index, build_state, passage_text, read_corpus
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings
from densehybrid.service.startup import StartupError
from densehybrid.index.search.params import SearchParams

from support.fake_encoder import FakeEncoder

PROMPTS = Prompts.of(query="query: ", passage="passage: ", named={"title": "Represent the title: "})
LONG = " ".join(f"word{i}" for i in range(100))  # 100 FakeEncoder tokens + [CLS] and [SEP]


# -- the tokenizer: either end, special tokens in place, a prompt never cut ------------------------
@pytest.fixture(scope="module")
def hf_tokenizer(tiny_bert_dir):
    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def _random_texts(seed: int, count: int = 40) -> list[str]:
    rng = random.Random(seed)
    words = ["dense", "retrieval", "of", "passages", "zebra", "quixotic", "3.14", "naïve", "[SEP]", "co-op", "!",
             "x", "tokenization", "über", "日本語"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(count)]


@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("limit", [2, 3, 8, 17, 64])
def test_truncation_equals_the_hf_tokenizers_own(hf_tokenizer, direction, limit):
    tokenizer = RoleTokenizer(hf_tokenizer, {"query": limit, "passage": 512})
    hf_tokenizer.truncation_side = direction
    try:
        for text in _random_texts(limit):
            want = hf_tokenizer(text, truncation=True, max_length=limit)["input_ids"]
            full = len(hf_tokenizer(text)["input_ids"])
            [(ids, count)] = tokenizer([text], "query", direction)
            assert ids == want, (text, direction)
            assert count == full
    finally:
        hf_tokenizer.truncation_side = "right"


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_prompts_tokens_are_never_cut(hf_tokenizer, direction):
    tokenizer = RoleTokenizer(hf_tokenizer, {"query": 12, "passage": 512})
    prompt = "query: "
    prompt_ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for text in _random_texts(7):
        text_ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
        room = 12 - 2 - len(prompt_ids)
        kept = text_ids[:room] if direction == "right" else text_ids[len(text_ids) - room:] if len(text_ids) > room else text_ids
        [(ids, count)] = tokenizer([text], "query", direction, prompt)
        assert ids == [hf_tokenizer.cls_token_id, *prompt_ids, *kept, hf_tokenizer.sep_token_id], text
        assert count == len(hf_tokenizer(prompt + text)["input_ids"])
    # right truncation of prompt + text is the tokenizer's plain right truncation of the joined string
    [(ids, _)] = tokenizer([LONG], "query", "right", prompt)
    assert ids == hf_tokenizer(prompt + LONG, truncation=True, max_length=12)["input_ids"]


def test_a_prompt_over_the_limit_is_cut_like_text(hf_tokenizer):
    tokenizer = RoleTokenizer(hf_tokenizer, {"query": 4, "passage": 512})
    [(ids, _)] = tokenizer(["x"], "query", "left", "a long instruction prompt: ")
    assert len(ids) == 4 and ids[0] == hf_tokenizer.cls_token_id and ids[-1] == hf_tokenizer.sep_token_id


def test_tokens_carry_offsets_into_the_text(hf_tokenizer):
    tokenizer = RoleTokenizer(hf_tokenizer, {"query": 8, "passage": 8})
    texts = _random_texts(3, 10)
    for text, tokens in zip(texts, tokenizer.tokens(texts)):
        assert [t.id for t in tokens] == hf_tokenizer(text)["input_ids"]  # untruncated
        assert tokens[0].special and tokens[0].text == "[CLS]" and tokens[0].start is None
        for token in tokens[1:-1]:
            assert not token.special and token.text == text[token.start:token.stop]
    [plain] = tokenizer.tokens(["dense retrieval"], add_special_tokens=False)
    assert not any(t.special for t in plain)
    assert tokenizer.decode(hf_tokenizer("dense retrieval")["input_ids"]) == "dense retrieval"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([10**6])


# -- prompts: one rule for every route ----------------------------------------------------------
def test_prompts_rules():
    assert PROMPTS.for_role("query") == "query: " and PROMPTS.for_role("passage") == "passage: "
    assert PROMPTS.resolve("query", "title") == "Represent the title: "
    with pytest.raises(PromptError, match="'nope'"):
        PROMPTS.resolve("query", "nope")
    with pytest.raises(PromptError, match="cannot encode passages"):
        PROMPTS.resolve("passage", "query")
    with pytest.raises(PromptError, match="not this index's query prompt"):
        PROMPTS.check_search("title")
    instructed = Prompts({"retrieve": "Find passages for: "}, default_prompt_name="retrieve")
    assert instructed.for_role("query") == "Find passages for: " and instructed.for_role("passage") == ""
    with pytest.raises(PromptError, match="default_prompt_name"):
        Prompts({"a": "x"}, default_prompt_name="b")
    assert Prompts.from_dict(PROMPTS.to_dict()) == PROMPTS and not Prompts.from_dict(None)


# -- a served index built with prompts -----------------------------------------------------------
@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompted")
    corpus = write_toy_corpus(root / "corpus.jsonl", 24)
    encoder = FakeEncoder("dhr", lam=0.5)
    index_dir = build_index(encoder, corpus, root / "ix", BuildOptions(progress=False, prompts=PROMPTS))
    return encoder, index_dir, corpus


@pytest.fixture(scope="module")
def client(prompted):
    encoder, index_dir, _ = prompted
    app = create_app(ServiceSettings(max_wait_ms=1), encoder=encoder, index=load_index(index_dir))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        yield c


def _vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array(r.json()["vectors"], np.float32)


def test_the_index_records_its_prompts_and_encoded_its_passages_after_them(prompted):
    encoder, index_dir, corpus = prompted
    index = load_index(index_dir)
    assert index.manifest["prompts"] == {"prompts": dict(PROMPTS.prompts), "default_prompt_name": None}
    assert index.prompts == PROMPTS
    texts = [passage_text(d) for d in read_corpus(corpus)]
    stored = np.asarray(index.values, np.float32)
    np.testing.assert_allclose(stored, encoder.encode(["passage: " + t for t in texts], "passage").values,
                               rtol=1e-3, atol=1e-3)
    assert not np.allclose(stored, encoder.encode(texts, "passage").values, rtol=1e-3, atol=1e-3)


def test_served_query_vectors_are_the_encoders_for_prompt_plus_text(client, prompted):
    encoder = prompted[0]
    want = encoder.encode(["query: x"], "query").values
    got = _vectors(client.post("/encode", json={"texts": ["x"]}))
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, encoder.encode(["x"], "query").values)
    np.testing.assert_array_equal(_vectors(client.post("/encode", json={"texts": ["x"], "role": "passage"})),
                                  encoder.encode(["passage: x"], "passage").values)
    np.testing.assert_array_equal(_vectors(client.post("/encode", json={"texts": ["x"], "prompt_name": "title"})),
                                  encoder.encode(["Represent the title: x"], "query").values)
    oai = client.post("/v1/embeddings", json={"model": "fake-dhr", "input": "x", "prompt_name": "title"})
    np.testing.assert_array_equal(np.array([oai.json()["data"][0]["embedding"]], np.float32),
                                  encoder.encode(["Represent the title: x"], "query").values)
    tei = client.post("/embed", json={"inputs": "x", "normalize": False, "input_type": "passage"})
    np.testing.assert_array_equal(np.array(tei.json(), np.float32), encoder.encode(["passage: x"], "passage").values)


def test_search_uses_the_index_query_prompt(client, prompted):
    encoder, index_dir, _ = prompted
    query = "dense retrieval latency"
    want = Searcher(load_index(index_dir)).search(encoder.encode(["query: " + query], "query"), SearchParams(k=5))
    for extra in ({}, {"prompt_name": "query"}):
        r = client.post("/search", json={"query": query, "k": 5, **extra})
        assert r.status_code == 200, r.text
        assert [h["id"] for h in r.json()["results"]] == want.ids[0]
        np.testing.assert_allclose([h["score"] for h in r.json()["results"]], want.scores[0], rtol=1e-5)


@pytest.mark.parametrize("path, body, named", [
    ("/search", {"query": "x", "prompt_name": "title"}, "'title'"),
    ("/search", {"query": "x", "prompt_name": "nope"}, "'nope'"),
    ("/encode", {"texts": ["x"], "prompt_name": "nope"}, "'nope'"),
    ("/encode", {"texts": ["x"], "role": "passage", "prompt_name": "query"}, "'query'"),
    ("/embed", {"inputs": "x", "prompt_name": "nope"}, "'nope'"),
    ("/tokenize", {"inputs": "x", "prompt_name": "nope"}, "'nope'"),
])
def test_a_prompt_the_index_does_not_use_is_422(client, path, body, named):
    r = client.post(path, json=body)
    assert r.status_code == 422 and named in r.json()["error"]["message"], r.text


def test_info_reports_prompts_limits_and_auto_truncate(client):
    info = client.get("/info").json()
    assert info["prompts"] == {"prompts": dict(PROMPTS.prompts), "default_prompt_name": None}
    assert info["auto_truncate"] is True
    assert info["max_input_length"] == 128 and info["max_client_batch_size"] == 64
    assert info["max_batch_tokens"] == 16384


# -- truncation on every route ----------------------------------------------------------------------
@pytest.mark.parametrize("path, body", [
    ("/encode", {"texts": ["short", LONG]}),
    ("/search", {"queries": ["short", LONG]}),
    ("/explain", {"query": LONG, "id": "D1"}),
    ("/v1/embeddings", {"model": "fake-dhr", "input": ["short", LONG]}),
    ("/embed", {"inputs": ["short", LONG]}),
    ("/embed_sparse", {"inputs": ["short", LONG]}),
    ("/rerank", {"query": "x", "texts": ["short", LONG + " " + LONG]}),
    ("/v2/rerank", {"query": "x", "documents": ["short", LONG + " " + LONG]}),
])
def test_truncate_false_is_413_naming_the_count_and_limit(client, path, body):
    r = client.post(path, json={**body, "truncate": False})
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    # the query prompt is 1 word, the passage prompt 1: both count; [CLS] and [SEP] too
    over = 0 if path == "/explain" else 1  # the position of the over-long text in its list
    assert f"input {over} has " in message and "tokens, over the" in message and "truncate=true" in message
    assert ("limit of 32 tokens" in message and "has 103 tokens" in message) or \
           ("limit of 128 tokens" in message and "has 203 tokens" in message)
    for truncate in (True, None):  # None: the server's auto_truncate (on)
        sent = {**body, "truncate": truncate} if truncate else body
        assert client.post(path, json=sent).status_code == 200


def test_left_truncation_keeps_the_last_tokens_and_the_prompt(client, prompted):
    encoder = prompted[0]
    got = _vectors(client.post("/encode", json={"texts": [LONG], "truncation_direction": "left"}))
    kept = " ".join(LONG.split()[-29:])  # 32 - [CLS] - [SEP] - the prompt's word
    np.testing.assert_array_equal(got, encoder.encode(["query: " + kept], "query").values)
    right = _vectors(client.post("/encode", json={"texts": [LONG]}))
    np.testing.assert_array_equal(right, encoder.encode(["query: " + " ".join(LONG.split()[:29])], "query").values)
    r = client.post("/search", json={"query": LONG, "truncation_direction": "left", "k": 3})
    assert r.status_code == 200
    assert client.post("/encode", json={"texts": ["x"], "truncation_direction": "middle"}).status_code == 422


def test_truncations_and_refusals_are_counted(client):
    from support.metrics import read_metrics, sample_total

    def counts():
        families = read_metrics(client)
        return (sample_total(families, "densehybrid_truncated_texts_total", role="query", direction="left"),
                sample_total(families, "densehybrid_rejected_total", reason="input_too_long"))

    cut, refused = counts()
    assert client.post("/encode", json={"texts": [LONG, LONG, "short"], "truncation_direction": "left"}).status_code == 200
    assert client.post("/encode", json={"texts": [LONG], "truncate": False}).status_code == 413
    assert counts() == (cut + 2, refused + 1)


def test_auto_truncate_off_refuses_unless_asked(prompted):
    encoder, index_dir, _ = prompted
    app = create_app(ServiceSettings(auto_truncate=False), encoder=encoder, index=load_index(index_dir))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/info").json()["auto_truncate"] is False
        assert c.post("/encode", json={"texts": [LONG]}).status_code == 413
        assert c.post("/search", json={"query": LONG}).status_code == 413
        assert c.post("/embed", json={"inputs": LONG}).status_code == 413
        assert c.post("/encode", json={"texts": [LONG], "truncate": True}).status_code == 200
        assert c.post("/encode", json={"texts": ["short"]}).status_code == 200


# -- /tokenize and /decode ----------------------------------------------------------------------------
def test_tokenize_and_decode(client, prompted):
    encoder = prompted[0]
    r = client.post("/tokenize", json={"inputs": ["Dense  retrieval", "x"], "prompt_name": "title"})
    assert r.status_code == 200, r.text
    first, second = r.json()
    prompted_text = "Represent the title: Dense  retrieval"
    assert first[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [t["text"] for t in first[1:-1]] == prompted_text.split()
    assert all(prompted_text[t["start"]:t["stop"]] == t["text"] for t in first[1:-1])
    assert [t["id"] for t in first] == encoder.tokenize(["Dense  retrieval"], "query", prompt="Represent the title: ")[0].ids["hash"]
    # without prompt_name: the query prompt, as /embed puts it first
    plain = client.post("/tokenize", json={"inputs": "x", "add_special_tokens": False}).json()
    assert [t["text"] for t in plain[0]] == ["query:", "x"]
    ids = [t["id"] for t in first]
    assert client.post("/decode", json={"ids": ids}).json() == ["represent the title: dense retrieval"]
    assert client.post("/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False}).json()[1] == "[CLS] represent"
    assert client.post("/decode", json={"ids": [10**7]}).status_code == 422
    assert client.post("/decode", json={"ids": [-1]}).status_code == 422
    assert client.post("/tokenize", json={"inputs": []}).status_code in (413, 422)


# -- prompts at start-up and in the CLI ------------------------------------------------------------
def test_server_refuses_prompts_that_contradict_the_index(prompted):
    encoder, index_dir, _ = prompted
    with pytest.raises(StartupError, match="--query-prompt 'query:' contradicts the index"):
        create_app(ServiceSettings(query_prompt="query:"), encoder=encoder, index=load_index(index_dir))
    create_app(ServiceSettings(query_prompt="query: ", passage_prompt="passage: "), encoder=encoder,
               index=load_index(index_dir))


def test_encode_only_server_applies_its_own_prompts():
    encoder = FakeEncoder("cls")
    app = create_app(ServiceSettings(query_prompt="q: ", passage_prompt="p: "), encoder=encoder)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        np.testing.assert_array_equal(_vectors(c.post("/encode", json={"texts": ["x"]})),
                                      encoder.encode(["q: x"], "query").values)
        np.testing.assert_array_equal(_vectors(c.post("/encode", json={"texts": ["x"], "role": "passage"})),
                                      encoder.encode(["p: x"], "passage").values)


def test_cli_build_records_prompts_and_search_applies_them(tmp_path, fake_models):
    from densehybrid.cli.main import app

    corpus = write_toy_corpus(tmp_path / "corpus.jsonl", 12)
    built = CliRunner().invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(corpus),
                                     "--out", str(tmp_path / "ix"), "--no-progress", "--query-prompt", "query: ",
                                     "--passage-prompt", "passage: ", "--prompt", "ask=Answer: ",
                                     "--default-prompt-name", "ask"])
    assert built.exit_code == 0, built.output
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    assert manifest["prompts"] == {"prompts": {"query": "query: ", "passage": "passage: ", "ask": "Answer: "},
                                   "default_prompt_name": "ask"}
    bad = CliRunner().invoke(app, ["index", "build", "--model", "fake:dhr", "--corpus", str(corpus),
                                   "--out", str(tmp_path / "ix2"), "--prompt", "no-equals-sign"])
    assert bad.exit_code == 2 and "NAME=TEXT" in bad.output


def test_compaction_keeps_the_prompts(prompted, tmp_path):
    from densehybrid.index.writes.compaction import fold
    from densehybrid.index.writes.delta import Delta

    _, index_dir, _ = prompted
    folded = load_index(fold(load_index(index_dir), Delta(hidden=frozenset({0})), tmp_path / "gen", applied_seq=1))
    assert folded.prompts == PROMPTS and folded.count == 23


def test_written_documents_get_the_passage_prompt(prompted, tmp_path):
    import shutil

    encoder, index_dir, _ = prompted
    copy = shutil.copytree(index_dir, tmp_path / "ix")
    app = create_app(ServiceSettings(index=copy, max_wait_ms=1), encoder=encoder, index=load_index(copy))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        r = c.post("/documents", json={"documents": [{"id": "new", "text": "zebra quixotic"}]})
        assert r.status_code == 200, r.text
        found = c.post("/search", json={"query": "zebra quixotic", "k": 1}).json()["results"][0]
    query = encoder.encode(["query: zebra quixotic"], "query")
    passage = encoder.encode(["passage: zebra quixotic"], "passage")
    gated = encoder.spec.gated_dim
    agree = query.gates[0] == passage.gates[0]
    want = (query.values[0, :gated] * agree) @ passage.values[0, :gated] + 0.5 * query.values[0, gated:] @ passage.values[0, gated:]
    assert found["id"] == "new"
    np.testing.assert_allclose(found["score"], want, rtol=1e-3)


def test_cli_search_and_eval_encode_queries_after_the_prompt(prompted):
    from densehybrid.index.building import commands

    encoder, index_dir, _ = prompted
    index = load_index(index_dir)
    queries = ["dense retrieval latency", "bm25 baseline"]
    found = commands.search_texts(encoder, Searcher(index), queries, SearchParams(k=4))
    want = Searcher(index).search(encoder.encode(["query: " + q for q in queries], "query"), SearchParams(k=4))
    assert found.ids == want.ids
    np.testing.assert_allclose(found.scores, want.scores, rtol=1e-6)


def test_resume_refuses_other_prompts(tmp_path):
    from densehybrid.index.errors import IndexWriteError
    from densehybrid.index.building import shards

    corpus = write_toy_corpus(tmp_path / "corpus.jsonl", 8)
    encoder = FakeEncoder("dhr")
    first = BuildOptions(progress=False, prompts=PROMPTS)
    shards.start(shards.work_dir(tmp_path / "ix"), build_state(encoder, corpus, first), resume=False)
    with pytest.raises(IndexWriteError, match="prompts differs"):
        build_index(encoder, corpus, tmp_path / "ix", BuildOptions(progress=False, resume=True))


def test_serve_with_contradicting_prompts_is_one_sentence(prompted, root_logging_restored):
    from densehybrid.cli.main import app

    _, index_dir, _ = prompted
    result = CliRunner().invoke(app, ["serve", "--index", str(index_dir), "--passage-prompt", "doc: ", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "--passage-prompt 'doc: ' contradicts the index, whose passage prompt is 'passage: '" in result.output
    assert "Traceback" not in result.output

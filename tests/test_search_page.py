"""The search page (GET /) and the offline /docs and /redoc, in headless Chromium driven by selenium.

Chromium and chromedriver are Debian's (deploy/ci/install-validators.sh installs them for CI);
a machine without them fails these tests with the install command rather than skipping them.
"""

import json
import math
import random
import re
import shutil

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from densehybrid.bench.servers.start import LiveServer
from densehybrid.bench.servers.toy_index import build_toy_index, write_toy_corpus
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.served.loading import load_index
from densehybrid.service.app import create_app
from densehybrid.service.page import highlight, shares
from densehybrid.service.settings import ServiceSettings

from support.fake_encoder import FakeEncoder

INSTALL = "apt-get install -y chromium chromium-driver  (or: sudo bash deploy/ci/install-validators.sh .venv)"
# without these a closed network makes Chromium hang on its background connections
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1100,900"]
XSS_TITLE = "<script>window.pwned = 1</script> inner title"
XSS_TEXT = 'inner product <img src=x onerror="window.pwned = 2"> <script>window.pwned = 3</script> & more'
XSS_QUERY = "inner product <script>window.pwned = 4</script>"
STAGES = {"queue_ms", "encode_ms", "search_ms", "rerank_ms", "total_ms"}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail(f"the search-page tests need Debian's Chromium and chromedriver: {INSTALL}")
    options = Options()
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # the network events, to see what left
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=Service(driver))
    session.set_page_load_timeout(60)
    yield session
    session.quit()


def _corpus_with_xss(directory):
    corpus = write_toy_corpus(directory / "corpus.jsonl", 40)
    with open(corpus, "a", encoding="utf-8") as f:
        f.write(json.dumps({"_id": "X1", "title": XSS_TITLE, "text": XSS_TEXT}) + "\n")
    return corpus


@pytest.fixture(scope="module")
def dhr_index_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("page-index")
    return build_index(FakeEncoder("dhr"), _corpus_with_xss(directory), directory / "index",
                       BuildOptions(progress=False, batch_size=16))


@pytest.fixture(scope="module")
def dhr_server(dhr_index_dir):
    with LiveServer(create_app(ServiceSettings(), encoder=FakeEncoder("dhr"), index=load_index(dhr_index_dir))) as live:
        yield live


def search_in_browser(browser, url: str, query: str) -> None:
    browser.get(url + "/")
    box = browser.find_element(By.NAME, "q")
    box.clear()
    box.send_keys(query)
    box.submit()
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "timing")))


def network_events(browser) -> tuple[dict[str, str], dict[str, str]]:
    """Since the last call: request id -> URL of each request the page started, and -> blocked reason of those blocked."""
    requests, failures = {}, {}
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requests[message["params"]["requestId"]] = message["params"]["request"]["url"]
        elif message["method"] == "Network.loadingFailed":
            failures[message["params"]["requestId"]] = message["params"].get("blockedReason")
    return requests, failures


def page_hits(browser) -> list[dict]:
    hits = []
    for element in browser.find_elements(By.CSS_SELECTOR, "li.hit"):
        shares_shown = {s.get_attribute("class").split()[-1]: float(s.get_attribute("data-share"))
                        for s in element.find_elements(By.CSS_SELECTOR, ".share")}
        hits.append({"id": element.get_attribute("data-id"), "text": element.find_element(By.CSS_SELECTOR, ".text").text,
                     "title": element.find_element(By.TAG_NAME, "h2").text,
                     "marks": [m.text for m in element.find_elements(By.TAG_NAME, "mark")],
                     "terms": [c.text for c in element.find_elements(By.CSS_SELECTOR, ".terms code")],
                     "shares": shares_shown})
    return hits


# -- the pure parts ------------------------------------------------------------------------------
def test_highlight_marks_whole_words_case_insensitively_and_keeps_the_text():
    assert highlight("Faiss indexes faiss.", ["faiss", "index"]) == [
        ("Faiss", True), (" indexes ", False), ("faiss", True), (".", False)]
    assert highlight("Latency: latent, late-ncy", ["late", "##ncy"]) == [
        ("Latency", True), (": latent, ", False), ("late", True), ("-ncy", False)]
    assert highlight("no match here", []) == [("no match here", False)]
    assert highlight("", ["x"]) == []


def test_highlight_keeps_the_text_and_marks_only_words_made_of_matched_pieces():
    rng = random.Random(0)
    pieces = ["a", "ab", "b", "c", " ", ".", "(", "\n", "AB"]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(14)))
        terms = rng.sample(["a", "ab", "b", "##b", "##c", "##ab", "+", "a.b"], rng.randrange(5))
        parts = highlight(text, terms)
        assert "".join(p for p, _ in parts) == text
        heads = {t for t in terms if t.isalnum()}
        tails = {t[2:] for t in terms if t.startswith("##")}
        # brute force: every split of a marked word into a head and tails
        for part, marked in parts:
            words = re.findall(r"\w+", part)
            assert all(_brute_composed(w.lower(), heads, tails) == marked for w in words), (text, terms, parts)


def _brute_composed(word, heads, tails):
    return any(word.startswith(h) and _brute_tails(word[len(h):], tails) for h in heads)


def _brute_tails(rest, tails):
    return rest == "" or any(rest.startswith(t) and _brute_tails(rest[len(t):], tails) for t in tails if t)


def test_shares_split_the_score_by_magnitude():
    assert shares(3.0, 1.0) == {"lexical": 0.75, "semantic": 0.25}
    assert shares(-1.0, 1.0) == {"lexical": 0.5, "semantic": 0.5}
    assert shares(0.0, 0.0) == {"lexical": 0.0, "semantic": 0.0}


# -- the page in a browser -----------------------------------------------------------------------
def test_page_shows_hits_marks_times_and_shares_as_the_api_computes_them(browser, dhr_server):
    search_in_browser(browser, dhr_server.url, "inner product retrieval")
    hits = page_hits(browser)
    api = httpx.post(dhr_server.url + "/search", json={"query": "inner product retrieval", "k": 10,
                                                       "return_text": True, "explain": True}, timeout=30).json()
    assert [h["id"] for h in hits] == [h["id"] for h in api["results"]] and len(hits) == 10
    for shown, hit in zip(hits, api["results"]):
        expl = hit["explanation"]
        assert shown["text"] == hit["text"] and shown["title"].startswith(hit["title"])
        assert shown["terms"] == [t["term"] for t in expl["terms"]]
        assert shown["marks"] and {m.lower() for m in shown["marks"]} <= set(shown["terms"])
        # every whole-word occurrence of a matched term is marked
        occurrences = sum(w.lower() in shown["terms"] for w in (hit["title"] + " " + hit["text"]).split())
        assert len(shown["marks"]) == occurrences
        size = abs(expl["lexical"]) + abs(expl["semantic"])
        assert math.isclose(shown["shares"]["lexical"], abs(expl["lexical"]) / size, rel_tol=1e-9)
        assert math.isclose(shown["shares"]["lexical"] + shown["shares"]["semantic"], 1.0)
    stages = {s.get_attribute("data-stage") for s in browser.find_elements(By.CSS_SELECTOR, "#timing .stage")}
    assert stages == STAGES
    assert "total" in browser.find_element(By.ID, "timing").text
    assert browser.find_element(By.NAME, "q").get_attribute("value") == "inner product retrieval"


def test_query_and_passage_markup_is_shown_as_text_never_run(browser, dhr_server):
    search_in_browser(browser, dhr_server.url, XSS_QUERY)
    hits = {h["id"]: h for h in page_hits(browser)}
    assert "X1" in hits, "the passage holding markup should rank for its own words"
    assert hits["X1"]["text"] == XSS_TEXT and hits["X1"]["title"].startswith(XSS_TITLE)
    assert browser.find_element(By.NAME, "q").get_attribute("value") == XSS_QUERY
    assert XSS_QUERY in browser.title
    assert browser.find_elements(By.TAG_NAME, "script") == [] and browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.execute_script("return window.pwned === undefined")


def test_a_bad_query_shows_the_error_and_the_server_keeps_serving(dhr_server):
    with httpx.Client(base_url=dhr_server.url, timeout=30) as c:
        r = c.get("/", params={"q": "x", "k": 0})
        assert r.status_code == 422 and r.json()["error"]["type"]
        r = c.get("/", params={"q": "x" * 3000})
        assert r.status_code == 422 and "error" in r.json()
        r = c.get("/", params={"q": "   "})  # nothing to search: the form alone
        assert r.status_code == 200 and 'class="hit"' not in r.text
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert c.get("/", params={"q": "inner"}).status_code == 200


def test_any_k_the_page_schema_allows_is_served_with_the_explain_cap_stated(dhr_index_dir):
    # the page explains every hit, and queries x k is capped by max_explain_hits: past it, hits are unmarked
    settings = ServiceSettings(max_explain_hits=5)
    with LiveServer(create_app(settings, encoder=FakeEncoder("dhr"), index=load_index(dhr_index_dir))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        for k in (20, settings.max_k):
            r = c.get("/", params={"q": "dense retrieval", "k": k})
            hits = min(k, 41)  # the index holds 41 documents
            assert r.status_code == 200, r.text
            assert r.text.count('class="hit"') == hits
            assert f"The first 5 hits are explained (max_explain_hits); the\n{hits - 5} after them" in r.text
        r = c.get("/", params={"q": "dense retrieval", "k": 5})
        assert r.status_code == 200 and 'id="unexplained"' not in r.text


def test_encode_only_server_says_there_is_nothing_to_search():
    with LiveServer(create_app(ServiceSettings(), encoder=FakeEncoder("dhr"))) as live:
        r = httpx.get(live.url + "/", params={"q": "inner"}, timeout=30)
    assert r.status_code == 200 and 'id="encode-only"' in r.text and "<form" not in r.text


def test_page_is_behind_the_api_key_like_the_api(dhr_index_dir):
    index = load_index(dhr_index_dir)
    with LiveServer(create_app(ServiceSettings(api_key="k3y"), encoder=FakeEncoder("dhr"), index=index)) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/", params={"q": "inner"}).status_code == 401
        page = c.get("/", params={"q": "inner"}, headers={"Authorization": "Bearer k3y"})
        assert page.status_code == 200 and 'class="hit"' in page.text


# -- /docs and /redoc without a network ----------------------------------------------------------
@pytest.mark.parametrize("path, rendered", [("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")])
def test_docs_render_from_local_assets_only(browser, dhr_server, path, rendered):
    network_events(browser)  # drop what came before
    browser.get(dhr_server.url + path)
    title = WebDriverWait(browser, 60).until(EC.presence_of_element_located((By.CSS_SELECTOR, rendered)))
    assert "densehybrid" in title.text
    requests, failures = network_events(browser)
    assert any(url.endswith(("swagger-ui-bundle.js", "redoc.standalone.js")) for url in requests.values())
    # anything for another origin was stopped in the browser by the page's policy, before it was sent
    elsewhere = {rid: url for rid, url in requests.items()
                 if url.startswith(("http:", "https:", "ws:", "wss:")) and not url.startswith(dhr_server.url + "/")}
    assert all(failures.get(rid) == "csp" for rid in elsewhere), (elsewhere, failures)


def test_openapi_declares_the_bearer_scheme_only_with_a_key(dhr_server):
    plain = httpx.get(dhr_server.url + "/openapi.json", timeout=30).json()
    assert "securitySchemes" not in plain.get("components", {})
    with LiveServer(create_app(ServiceSettings(api_key="k3y"), encoder=FakeEncoder("dhr"))) as live:
        schema = httpx.get(live.url + "/openapi.json", headers={"Authorization": "Bearer k3y"}, timeout=30).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "the server's API key (DENSEHYBRID_API_KEY)"}
    assert schema["paths"]["/search"]["post"]["security"] == [{"bearer": []}]
    assert schema["paths"]["/info"]["get"]["security"] == [{"bearer": []}]
    for open_path in ("/health", "/ready", "/metrics"):
        assert "security" not in schema["paths"][open_path]["get"]


# -- a real model ----------------------------------------------------------------------------------
@pytest.mark.realmodel
def test_real_fusion_index_marks_the_real_matched_terms(browser, splade_tiny_dir, minilm_dir, tmp_path):
    from densehybrid.encoder.loading import load_encoder

    encoder = load_encoder("splade-tiny", kind="fusion", dense_model="minilm")
    index_dir = build_toy_index(encoder, tmp_path, count=40)
    query = "faiss flat index latency"
    with LiveServer(create_app(ServiceSettings(), encoder=encoder, index=load_index(index_dir))) as live:
        search_in_browser(browser, live.url, query)
        hits = page_hits(browser)
        api = httpx.post(live.url + "/search", json={"query": query, "k": 10, "explain": True}, timeout=60).json()
    assert [h["id"] for h in hits] == [h["id"] for h in api["results"]]
    marked = {m.lower() for h in hits for m in h["marks"]}
    # the model's own matches, all words of the query; "latency" is late + ##ncy in its vocabulary
    assert marked and marked <= set(query.split()) and "latency" in marked, marked
    for shown, hit in zip(hits, api["results"]):
        expl = hit["explanation"]
        terms = [t["term"] for t in expl["terms"]]
        heads, tails = {t for t in terms if not t.startswith("##")}, {t[2:] for t in terms if t.startswith("##")}
        assert all(_brute_composed(m.lower(), heads, tails) for m in shown["marks"]), (shown["marks"], terms)
        assert math.isclose(shown["shares"]["lexical"], abs(expl["lexical"]) / (abs(expl["lexical"]) + abs(expl["semantic"])))
        assert 0 < shown["shares"]["semantic"] < 1  # fusion: both parts count

"""Every shell and Python snippet of the docs runs, or says why it cannot.

Each ```bash/```sh/```console and ```python block of README.md and docs/**/*.md (the generated
docs/reference/ pages aside: they are synopses, not snippets) either runs here against one live
demo-like server, or has ``<!-- not-runnable: reason -->`` on the line before its fence.

The server is what ``densehybrid demo`` serves, with the weightless hash encoder standing in for the
real models (so the fast tier can run it): the same stdlib docstring corpus and payload fields, a
``fusion`` index whose model id is the demo's, writes on. Snippets address ``localhost:8000`` as in the docs; the port is
rewritten to the live one. ``curl`` fails on an HTTP error status here, so a snippet that gets a 4xx
or 5xx fails its test, unless it shows a refusal on purpose: ``<!-- expect-status: 413 -->`` on the line
before its fence, and then it must get exactly that status.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(bash|sh|console|python)\s*$")
MARKER = re.compile(r"^<!--\s*not-runnable:(.*?)-->\s*$")
EXPECTED_STATUS = re.compile(r"^<!--\s*expect-status:\s*([45]\d\d)\s*-->\s*$")
DEMO_MODEL_ID = "splade-tiny"  # the demo's fusion index names its lexical model


@dataclasses.dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_runnable: str | None  # the marker's reason, "" for a marker without one
    expected_status: int | None = None  # a snippet that shows a refusal: curl's HTTP error status

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def documentation_files() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.relative_to(REPO / "docs").parts)
    return [REPO / "README.md", *docs]


def snippets_of(path: Path) -> list[Snippet]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        expected = EXPECTED_STATUS.match(lines[i - 1]) if i > 0 else None
        found.append(Snippet(path, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n",
                             marker.group(1).strip() if marker else None,
                             int(expected.group(1)) if expected else None))
        i = end + 1
    return found


ALL = [snippet for path in documentation_files() for snippet in snippets_of(path)]
RUNNABLE = [snippet for snippet in ALL if snippet.not_runnable is None]


@pytest.mark.parametrize("path", documentation_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_fence_is_closed(path):
    fences = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("```")]
    assert len(fences) % 2 == 0, f"{path.name}: a code fence is never closed (fences at lines {fences})"


def test_snippets_are_found_in_every_page_that_has_them():
    assert len(ALL) >= 20 and RUNNABLE, "the fence parser found too little: did the fence syntax change?"
    assert {s.path.name for s in RUNNABLE} >= {"README.md", "quickstart.md", "compatibility.md"}


@pytest.mark.parametrize("snippet", [s for s in ALL if s.not_runnable is not None], ids=lambda s: s.name)
def test_a_snippet_marked_not_runnable_says_why(snippet):
    assert len(snippet.not_runnable) >= 10, f"{snippet.name}: write the reason after 'not-runnable:'"


# -- the live demo-like server ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    from densehybrid.bench.servers.hash_encoder import HashEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.cli.demo_corpus import FIELDS, write_stdlib_corpus
    from densehybrid.index.building.build import BuildOptions, build_index
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    encoder = HashEncoder("fusion")
    encoder.spec = dataclasses.replace(encoder.spec, model_id=DEMO_MODEL_ID)
    home = tmp_path_factory.mktemp("docs-demo")
    corpus = home / "corpus.jsonl"
    write_stdlib_corpus(corpus, 2000)
    index_dir = build_index(encoder, corpus, home / "index",
                            BuildOptions(name="python-stdlib-docs", progress=False, batch_size=64, fields=FIELDS))
    settings = ServiceSettings(index=index_dir, warmup=False, device="cpu", log_json=False)
    with LiveServer(create_app(settings, encoder=encoder, index=load_index(index_dir))) as live:
        yield live.url


def _on_live_server(code: str, url: str) -> str:
    for written in ("http://localhost:8000", "http://127.0.0.1:8000", "localhost:8000", "127.0.0.1:8000"):
        code = code.replace(written, url if written.startswith("http") else url.removeprefix("http://"))
    return code


def _shell(snippet: Snippet) -> str:
    if snippet.language != "console":
        return snippet.code
    return "".join(line[2:] + "\n" for line in snippet.code.splitlines() if line.startswith("$ "))


def _run(snippet: Snippet, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1"}
    if snippet.language == "python":
        command = [sys.executable, "-c", _on_live_server(snippet.code, url)]
    else:
        strict_curl = 'curl() { command curl --fail-with-body --silent --show-error --max-time 60 "$@"; }\n'
        command = ["bash", "-c", "set -euo pipefail\n" + strict_curl + _on_live_server(_shell(snippet), url)]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=REPO)


@pytest.mark.parametrize("snippet", RUNNABLE, ids=lambda s: s.name)
def test_a_runnable_snippet_runs_against_the_demo_server(demo_server, snippet):
    result = _run(snippet, demo_server)
    if snippet.expected_status is not None:  # curl --fail-with-body exits 22 on an HTTP error status
        assert result.returncode == 22 and f"error: {snippet.expected_status}" in result.stderr, (
            f"{snippet.name} should be refused with {snippet.expected_status}\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
        return
    assert result.returncode == 0, (
        f"{snippet.name} failed (exit {result.returncode}); if it cannot run against the demo server, put "
        f"'<!-- not-runnable: reason -->' on the line before its fence.\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")


def test_the_snippet_runner_fails_on_an_http_error_and_on_a_failing_command(demo_server):
    """The runner itself: a 404, a refused body and a failing Python snippet all fail their test."""
    missing = Snippet(REPO / "README.md", 0, "bash", "curl -s localhost:8000/documents/no-such-id\n", None)
    refused = Snippet(REPO / "README.md", 0, "bash",
                      "curl -s localhost:8000/search -H 'Content-Type: application/json' -d '{\"query\": \"\"}'\n", None)
    broken = Snippet(REPO / "README.md", 0, "python", "import httpx\n"
                     "httpx.get('http://localhost:8000/no-such-route').raise_for_status()\n", None)
    working = Snippet(REPO / "README.md", 0, "console", "$ curl -s localhost:8000/ready\n{\"ready\": true}\n", None)
    assert _run(missing, demo_server).returncode != 0
    assert _run(refused, demo_server).returncode != 0
    assert _run(broken, demo_server).returncode != 0
    assert _run(working, demo_server).returncode == 0


def test_the_parser_reads_markers_only_on_the_line_before_the_fence(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- not-runnable: needs a GPU and CUDA -->\n```bash\nnvidia-smi\n```\n\n"
                    "<!-- not-runnable: too far away -->\n\n```python\nprint(1)\n```\n"
                    "<!-- not-runnable: -->\n```sh\ntrue\n```\n```text\nnot a snippet\n```\n")
    first, second, third = snippets_of(page)
    assert (first.language, first.not_runnable, first.code) == ("bash", "needs a GPU and CUDA", "nvidia-smi\n")
    assert (second.language, second.not_runnable) == ("python", None)
    assert (third.language, third.not_runnable) == ("sh", "")

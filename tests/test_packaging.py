"""The install: one top-level package, layered imports, and exactly one runtime extra."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from densehybrid.encoder import extras

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(REPO)], check=True, capture_output=True)
    return next(out.glob("densehybrid-*.whl"))


def test_wheel_holds_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"densehybrid"}
    for layer in ("encoder", "index", "service", "cli", "bench"):
        assert f"densehybrid/{layer}/__init__.py" in names
    assert not [n for n in names if n.startswith("densehybrid/service/") and "testing" in n]


def test_wheel_ships_no_test_doubles(wheel):
    """The fakes live in tests/support; the load benchmarks serve the weightless HashEncoder instead."""
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if "fake" in n or "/support/" in n or "/tests/" in n]
    assert "densehybrid/bench/servers/hash_encoder.py" in names


def test_import_layers_hold_on_the_installed_wheel(wheel, tmp_path):
    """import-linter reads the non-editable install (the editable one maps folders through an import hook)."""
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    assert lint, "import-linter is a dev dependency"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    result = subprocess.run([lint, "--config", str(REPO / "pyproject.toml")], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def fake_installed(*present: str):
    return lambda distribution: distribution in present


@pytest.mark.parametrize("present,expected", [(("faiss-cpu", "onnxruntime"), "cpu"),
                                              (("faiss-cpu", "onnxruntime-gpu"), "gpu")])
def test_one_extra_is_recognised(monkeypatch, present, expected):
    monkeypatch.setattr(extras, "installed", fake_installed(*present))
    assert extras.installed_extra() == expected


@pytest.mark.parametrize("present,problem", [((), "not installed"), (("onnxruntime",), "missing: faiss-cpu"),
                                             (("faiss-cpu", "onnxruntime", "onnxruntime-gpu"), "both")])
def test_neither_or_both_extras_name_both_installs(monkeypatch, present, problem):
    monkeypatch.setattr(extras, "installed", fake_installed(*present))
    with pytest.raises(extras.MissingExtraError, match=problem) as raised:
        extras.installed_extra()
    assert "densehybrid[cpu]" in str(raised.value) and "densehybrid[gpu]" in str(raised.value)


def without_runtime_extra(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tests" / "support" / "without_runtime_extra.py"), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("command", [["serve", "--index", "/nowhere"], ["index", "build", "--help"], ["demo"],
                                     ["--help"]])
def test_cli_stops_with_one_sentence_without_an_extra(command):
    """The command modules import Faiss at module level: the check must come before them, not in a callback."""
    result = without_runtime_extra(*command)
    assert result.returncode == 2, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "densehybrid[cpu]" in output and "densehybrid[gpu]" in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1


def test_models_list_runs_without_an_extra():
    """Listing and fetching the offline models needs neither Faiss nor ONNX Runtime."""
    result = without_runtime_extra("models", "list")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "minilm" in result.stdout


def test_installed_environment_has_exactly_one_extra():
    assert extras.installed_extra() in ("cpu", "gpu")


def test_installed_wheel_serves_the_search_page_and_docs_assets(wheel, tmp_path):
    """Templates and static files are package data: found from a non-editable install too."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {"densehybrid/service/templates/search_page.html", "densehybrid/service/static/page.css"} <= set(names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import densehybrid.service.page as page, pathlib\n"
        "from fastapi import FastAPI\n"
        "from fastapi.testclient import TestClient\n"
        "from densehybrid.service.docs_assets import install_offline_docs\n"
        f"assert pathlib.Path(page.__file__).is_relative_to({str(site)!r}), page.__file__\n"
        "app = FastAPI(docs_url=None, redoc_url=None)\n"
        "install_offline_docs(app)\n"
        "app.mount(page.ASSETS_PATH, page.StaticFiles(directory=page._HERE / 'static'))\n"
        "client = TestClient(app)\n"
        "assert 'mark' in client.get(page.ASSETS_PATH + '/page.css').text\n"
        "assert client.get('/docs-assets/swagger-ui-bundle.js').status_code == 200\n"
        "assert 'id=\"encode-only\"' in page._templates.get_template('search_page.html').render(hits=[], timing=None,"
        " error=None, explained=None, query='', k=10, max_k=10, index=None, kind='dhr', assets='')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stdout + result.stderr


def test_installed_wheel_ships_the_wrk_script_of_the_peer_benchmark(wheel, tmp_path):
    """The wrk driver finds wrk_closed_loop.lua as package data of densehybrid.bench.load, not in the checkout."""
    assert "densehybrid/bench/load/wrk_closed_loop.lua" in zipfile.ZipFile(wheel).namelist()
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("from importlib import resources\n"
             "from densehybrid.bench.load import wrk\n"
             "script = resources.files('densehybrid.bench.load') / wrk.WRK_SCRIPT\n"
             f"assert str(script).startswith({str(site)!r}), script\n"
             "assert 'function done(' in script.read_text()\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stdout + result.stderr


OUTPUT_FLAG = re.compile(r"--(?:out|output|report|run) ([\w./-]+)")


def test_outputs_the_docs_write_into_a_clone_are_git_ignored():
    """A user who follows the docs inside their clone must not see the indexes and reports they built as
    untracked files (or commit them by accident)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    outputs = {match.group(1) for page in pages for match in OUTPUT_FLAG.finditer(page.read_text())}
    relative = sorted(path for path in outputs if not path.startswith(("/", "~", "$")))
    assert {"my-index", "bench.json", "idx/cls"} <= set(relative)
    tracked = [path for path in relative
               if subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode != 0]
    assert not tracked, f"not git-ignored: {tracked}"

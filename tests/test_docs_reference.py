"""The generated reference pages (docs/reference/) are what the code produces now, and cover their sources.

When one of these fails after a change to routes, settings, flags or metrics, regenerate the pages:
``python -m densehybrid.cli.docs_reference``.
"""

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from densehybrid.cli import docs_reference

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    return {path: produce() for path, produce in docs_reference.pages().items()}


@pytest.mark.parametrize("page", list(docs_reference.pages()))
def test_the_committed_page_is_what_the_generator_produces(fresh, page):
    committed = DOCS / page
    assert committed.is_file(), f"docs/{page} is missing: run python -m densehybrid.cli.docs_reference"
    assert committed.read_text() == fresh[page], \
        f"docs/{page} differs from its source: run python -m densehybrid.cli.docs_reference"


def test_the_api_page_has_every_operation(fresh):
    document = docs_reference.openapi_document()
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"## `{method.upper()} {path}`" in fresh["reference/api.md"]


def test_the_configuration_page_has_every_setting_with_its_variable_flag_and_default(fresh):
    from densehybrid.service.settings import ServiceSettings

    found = re.findall(r"^\| `(DENSEHYBRID_[A-Z_]+)` \| `([^`]+)` \| ([^|]*) \|", fresh["reference/configuration.md"],
                       flags=re.MULTILINE)
    rows = {variable: (flag, default.strip()) for variable, flag, default in found}
    assert set(rows) == {ServiceSettings.env_var(name) for name in ServiceSettings.model_fields}
    assert rows["DENSEHYBRID_LAMBDA"][0] == "--lambda" and rows["DENSEHYBRID_PORT"] == ("--port", "`8000`")
    assert rows["DENSEHYBRID_ALLOW_OPEN"] == ("--allow-open/--require-key", "`false`")
    assert rows["DENSEHYBRID_INDEX"][1] == "–"


def test_the_cli_page_has_every_command_and_option(fresh):
    from densehybrid.cli.main import app

    def walk(path, command):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk([*path, name], sub)

    page = fresh["reference/cli.md"]
    for path, command in walk(["densehybrid"], typer.main.get_command(app)):
        assert f"`{' '.join(path)}`" in page, path
        for param in command.params:
            for flag in param.opts:
                if flag.startswith("--"):
                    assert flag in page, (path, flag)


def test_the_metrics_page_has_every_family_the_server_exposes(fresh):
    from densehybrid.service.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    metrics.describe_model(kind="dhr", model_id="m", device="cpu", skip_mlm=False)
    metrics.observe_request("/search", 200, 0.01)
    metrics.count_rejected("queue_full")
    metrics.count_batch_failure("query")
    metrics.compactions.labels(outcome="ok").inc()
    exposed = {name for name in re.findall(r"^# TYPE (\S+) ", metrics.exposition().decode(), flags=re.MULTILINE)
               if not name.endswith("_created")}  # prometheus_client's creation-time companions
    documented = set(re.findall(r"^\| `(densehybrid_\w+)` \|", fresh["reference/metrics.md"], flags=re.MULTILINE))
    assert documented == exposed
    assert 'densehybrid_model_info{backend="torch"' in metrics.exposition().decode()
    assert "densehybrid_model_info" in documented and "densehybrid_requests_total" in documented


def test_one_command_regenerates_every_page_and_says_what_changed(tmp_path):
    generate = typer.Typer(add_completion=False)
    generate.command()(docs_reference.generate)
    runner = CliRunner()
    first = runner.invoke(generate, ["--docs", str(tmp_path)])
    assert first.exit_code == 0, first.output
    assert first.output.count("updated: docs/reference/") == len(docs_reference.pages())
    assert "up to date" in runner.invoke(generate, ["--docs", str(tmp_path)]).output
    assert runner.invoke(generate, ["--docs", str(tmp_path), "--check"]).exit_code == 0
    (tmp_path / "reference" / "metrics.md").write_text("stale\n")
    checked = runner.invoke(generate, ["--docs", str(tmp_path), "--check"])
    assert checked.exit_code == 1 and checked.output.strip() == "out of date: docs/reference/metrics.md"
    assert (tmp_path / "reference" / "metrics.md").read_text() == "stale\n"  # --check writes nothing
    again = runner.invoke(generate, ["--docs", str(tmp_path)])
    assert again.output.strip() == "updated: docs/reference/metrics.md"

"""The ``densehybrid`` command. Each feature registers its subcommands here."""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from densehybrid.encoder import zoo
from densehybrid.encoder.choices import ROLES
from densehybrid.encoder.errors import EncoderError
from densehybrid.cli.encoder_options import EncoderOptions, lambda_auto_error, with_encoder_options
from densehybrid.cli.settings_flags import SETTINGS_FIELDS, with_flags
from densehybrid.cli.errors import fail, sentence
from densehybrid.cli.models_commands import models_app

app = typer.Typer(help="densehybrid: serve Aggretriever, DHR and [CLS] retrievers.", no_args_is_help=True)
app.add_typer(models_app, name="models")
console = Console()


# -- serve ---------------------------------------------------------------------
# One flag per ServiceSettings field, generated from the field (cli/settings_flags.py): a new setting
# is one field in service/settings.py.
@app.command("serve")
@with_flags(SETTINGS_FIELDS, "flags")
def serve_command(flags: dict) -> None:
    """Serve /search, /encode, /explain over HTTP (every flag also reads DENSEHYBRID_<FLAG>)."""
    if flags["lam"] == "auto":
        fail(lambda_auto_error("serve"))
    _serve({**flags, "cors_origins": flags["cors_origins"] or None})


def _settings(values: dict):
    """The environment's settings (``DENSEHYBRID_*``) with ``values`` over them; invalid ones end the command."""
    from densehybrid.service.serve import settings_from

    try:
        return settings_from(values)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        fail(f"invalid settings: {sentence(exc)}")


def _serve(values: dict) -> None:
    from densehybrid.service.serve import StartupError, serve

    try:
        serve(_settings(values))
    except StartupError as exc:
        fail(exc)


# -- demo -------------------------------------------------------------------------
@app.command("demo")
def demo_command(
    passages: int = typer.Option(2000, "--passages", min=10, help="stdlib docstring passages to index"),
    directory: Optional[Path] = typer.Option(None, "--dir", help="where corpus and index go [cache/demo]"),
    host: str = typer.Option("127.0.0.1", "--host", help="listen address"),
    port: int = typer.Option(8000, "--port", "-p", help="listen port"),
    rebuild: bool = typer.Option(False, "--rebuild", help="build the index again even if one exists"),
) -> None:
    """Fetch the offline models, index the Python stdlib docstrings, serve them, query them, print curl examples."""
    from densehybrid.cli import demo
    from densehybrid.service import logging as service_logging

    _settings({"host": host, "port": port})  # refuses a keyless public --host before the minutes of indexing
    service_logging.configure("INFO", json_lines=False)
    home = directory or demo.demo_dir()
    console.print(f"[bold]densehybrid demo[/bold] keeps its corpus and index in {escape(str(home))} "
                  "(--dir puts them elsewhere, --rebuild builds the index again)", soft_wrap=True)
    index_dir = demo.prepare(home, passages, rebuild=rebuild)
    url = f"http://{host}:{port}"
    console.print(f"serving {escape(str(index_dir))} at {url} (Ctrl-C stops it); the examples follow once it is ready",
                  soft_wrap=True)
    demo.query_when_ready(url, lambda answer: _print_demo_answer(answer, url))
    _serve({"index": index_dir, "host": host, "port": port, "log_json": False})


def _print_demo_answer(answer: dict, url: str) -> None:
    """Once the server is ready: the example query's answer, then curl commands to try."""
    from densehybrid.cli.demo import EXAMPLE_QUERY, curl_examples

    if "results" not in answer:
        console.print(f"[red]example query failed:[/red] {escape(str(answer))}")
        return
    table = Table("rank", "id", "score", "text", title=f'POST /search {{"query": "{EXAMPLE_QUERY}"}}')
    for hit in answer["results"]:
        table.add_row(str(hit["rank"]), hit["id"], f"{hit['score']:.3f}", (hit.get("text") or "")[:80])
    console.print(table)
    console.print("timing (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in answer["timing"].items()))
    console.print(f"\nThe server is ready at {url}. Try:\n")
    console.print(curl_examples(url), markup=False, highlight=False, soft_wrap=True)


# -- encode ----------------------------------------------------------------------
RoleChoice = Enum("RoleChoice", {role: role for role in ROLES}, type=str)


@app.command("encode")
@with_encoder_options
def encode(
    encoder: EncoderOptions,
    role: RoleChoice = typer.Option(..., "--role", help="query or passage (own max length, own head if untied)"),
    input: str = typer.Option("-", "--input", "-i", help="text file, one text per line; - reads stdin"),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="OUT.npz (vectors float32, gates uint8); omitted: JSON lines on stdout"),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="texts per encoder call"),
) -> None:
    """Encode texts into the model's vectors (and DLR gates)."""
    from densehybrid.cli.encode_output import encode_texts, print_json_lines, read_texts, summary, write_npz

    try:
        texts = read_texts(input)
        enc = encoder.load()
    except (OSError, UnicodeDecodeError, EncoderError, zoo.ZooError) as exc:
        fail(exc)
    encoded = encode_texts(enc, texts, role.value, batch_size)
    if output is None:
        print_json_lines(encoded)
        return
    write_npz(output, encoded, enc.spec)
    console.print(summary(enc, encoded, texts, output))


# -- loadtest (benchmarks/load/loadtest.py) -----------------------------------------
@app.command("loadtest")
def loadtest_command(
    url: Optional[str] = typer.Option(None, "--url", help="a running server (default: start a fake-encoder one)"),
    server_pid: Optional[int] = typer.Option(None, "--server-pid", help="its pid, to sample RSS over the soak"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DENSEHYBRID_API_KEY", help="bearer key"),
    saturation_s: float = typer.Option(10.0, "--saturation-s", help="closed-loop phase that finds saturation"),
    phase_s: float = typer.Option(10.0, "--phase-s", help="each open-loop phase (50%, 90%, overload)"),
    soak_s: float = typer.Option(60.0, "--soak-s", help="soak at 50% of saturation (600 = the 10-minute form)"),
    concurrency: list[int] = typer.Option([8, 32], "--concurrency", min=1, max=1024,
                                          help="closed-loop client counts tried for saturation (repeat)"),
    overload: float = typer.Option(2.0, "--overload", min=1.0, max=10.0, help="offered load beyond saturation (x)"),
    workdir: Path = typer.Option(Path("~/.cache/densehybrid/loadtest"), "--workdir", help="fake server's index"),
    report: Optional[Path] = typer.Option(None, "--report", help="also write the report as JSON here"),
) -> None:
    """Load test on loopback: saturation, p50/p99 at 50% and 90% of it, shedding beyond it, RSS over a soak."""
    import json

    from densehybrid.bench.load.loadtest import FakeServerConfig, LoadConfig, run_load

    from urllib.parse import urlsplit

    if url is not None and urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        fail("the load test only drives loopback servers; give --url http://127.0.0.1:PORT")
    config = LoadConfig(saturation_s=saturation_s, phase_s=phase_s, soak_s=soak_s, concurrency=tuple(concurrency),
                        overload=overload)
    result = run_load(config, FakeServerConfig(), workdir.expanduser(), url=url, server_pid=server_pid,
                      api_key=api_key)
    table = Table("phase", "offered/s", "sent/s", "answered/s", "p50 ms", "p95 ms", "p99 ms", "server p99 ≤ ms",
                  "shed", "statuses", "max queue")
    for p in result["phases"]:
        table.add_row(p["phase"], str(p["offered_rps"] or "-"), str(p["sent_rps"]), str(p["answered_rps"]), str(p["p50_ms"]),
                      str(p["p95_ms"]), str(p["p99_ms"]), str(p["server"].get("request", {}).get("p99_le_ms", "-")),
                      f"{100 * p['shed_fraction']:.1f}%",
                      ", ".join(f"{k}:{v}" for k, v in p["statuses"].items()), str(p["max_queue_depth"]))
    console.print(f"saturation: {result['saturation_rps']} requests/s")
    console.print(table)
    if result.get("soak_rss"):
        rss = {k: v for k, v in result["soak_rss"].items() if k != "samples"}
        console.print(f"soak RSS: {rss}")
    if report is not None:
        report.write_text(json.dumps(result, indent=2))


# -- bench (benchmarks/cli.py: also `python -m densehybrid.bench`) ------------------------
from densehybrid.bench.cli import bench_command  # noqa: E402

app.command("bench")(bench_command)


# -- index build, search, eval (cli/index_commands.py) --
from densehybrid.cli import index_commands  # noqa: E402

index_commands.register(app)

# -- index import, index verify (cli/import_commands.py) --
from densehybrid.cli import import_commands  # noqa: E402

import_commands.register(index_commands.index_app)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()

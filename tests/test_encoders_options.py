"""The shared encoder flags: one decorator, every flag parsed into EncoderOptions."""

from __future__ import annotations

import inspect
from pathlib import Path

import typer
from typer.testing import CliRunner

from densehybrid.encoder.loading import load_encoder
from densehybrid.cli.encoder_options import EncoderOptions, with_encoder_options


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @with_encoder_options
    def build(corpus: Path, encoder: EncoderOptions, out: str = typer.Option("x", "--out")) -> None:
        seen.append((corpus, out, encoder))

    @app.command()
    def other() -> None:  # a second command keeps typer in sub-command mode
        pass

    return app


def test_flags_parse_into_options():
    seen: list = []
    args = ["build", "c.jsonl", "--out", "y", "--model", "splade-tiny", "--kind", "fusion", "--lambda", "20",
            "--dense-model", "minilm", "--pooling", "mean", "--no-normalize", "--skip-mlm", "--agg-dim", "320",
            "--dlr-dim", "256", "--device", "cpu", "--max-query-length", "16", "--max-passage-length", "64"]
    result = CliRunner().invoke(_app(seen), args)
    assert result.exit_code == 0, result.output
    corpus, out, options = seen[0]
    assert (corpus, out) == (Path("c.jsonl"), "y")
    assert options == EncoderOptions(model="splade-tiny", kind="fusion", skip_mlm=True, agg_dim=320, dlr_dim=256,
                                     lam=20.0, dense_model="minilm", pooling="mean", normalize=False,
                                     device="cpu", max_query_length=16, max_passage_length=64)
    assert isinstance(options.kind, str) and type(options.kind) is str  # enums unwrapped


def test_defaults_leave_the_decision_to_the_model_directory():
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["build", "c.jsonl"])
    assert result.exit_code == 0, result.output
    assert seen[0][2] == EncoderOptions()


def test_bad_kind_is_rejected():
    result = CliRunner().invoke(_app([]), ["build", "c.jsonl", "--kind", "bm25"])
    assert result.exit_code != 0


def test_options_mirror_load_encoder_signature():
    params = inspect.signature(load_encoder).parameters
    kwargs = EncoderOptions(model="m").load_kwargs()
    assert set(kwargs) == set(params) - {"model"}
    for name, value in kwargs.items():
        assert params[name].default == value, name

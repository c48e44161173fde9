"""The shared encoder flags: one decorator, every flag parsed into EncoderOptions."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

import pytest

from densehybrid.cli.encoder_options import ENCODER_FLAGS, EncoderOptions, with_encoder_options
from densehybrid.encoder.config import EncoderConfig


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
    assert options == EncoderOptions(EncoderConfig(model="splade-tiny", kind="fusion", skip_mlm=True, agg_dim=320,
                                                   dlr_dim=256, lam=20.0, dense_model="minilm", pooling="mean",
                                                   normalize=False, max_query_length=16, max_passage_length=64),
                                     device="cpu")
    assert type(options.config.kind) is str and type(options.config.pooling) is str  # enums unwrapped


def test_defaults_leave_the_decision_to_the_model_directory():
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["build", "c.jsonl"])
    assert result.exit_code == 0, result.output
    assert seen[0][2] == EncoderOptions()


def test_bad_kind_is_rejected():
    result = CliRunner().invoke(_app([]), ["build", "c.jsonl", "--kind", "bm25"])
    assert result.exit_code != 0


def test_lambda_auto_is_kept_apart_from_the_config():
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["build", "c.jsonl", "--lambda", "auto"])
    assert result.exit_code == 0, result.output
    options = seen[0][2]
    assert options.lambda_auto and options.config.lam is None
    with pytest.raises(ValueError, match="give search a number"):
        options.fixed_lambda("search")


def test_encoder_flags_are_the_settings_fields_with_their_help():
    from densehybrid.service.settings import ServiceSettings

    command = typer.main.get_command(_app([])).commands["build"]
    flags = {p.name: p for p in command.params if p.name in ENCODER_FLAGS}
    assert set(flags) == set(EncoderConfig.field_names()) | {"device", "precision"}
    for name, param in flags.items():
        assert param.help == ServiceSettings.model_fields[name].description, name
        assert param.default is None, name  # not given: the model directory or the index decides

"""Every ServiceSettings field is a `serve` flag and an env var, listed in the README; the model flags map onto it."""

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from densehybrid.cli.main import app
from densehybrid.encoder.config import EncoderConfig
from densehybrid.service.settings import ServiceSettings

README = Path(__file__).resolve().parents[1] / "README.md"


def _serve_options() -> dict:
    command = typer.main.get_command(app).commands["serve"]
    return {param.name: param for param in command.params if param.param_type_name == "option"}


def _readme_settings_rows() -> dict[str, str]:
    """variable -> flag cell of the README's configuration table."""
    rows = re.findall(r"^\| `(DENSEHYBRID_[A-Z_]+)` \| `([^`]+)` \|", README.read_text(), flags=re.MULTILINE)
    return dict(rows)


def test_every_setting_has_a_serve_flag_named_like_it():
    options = _serve_options()
    assert set(ServiceSettings.model_fields) == set(options), "one serve flag per setting, named like the field"


def test_every_flag_and_variable_is_in_serve_help_and_the_readme():
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"}).output
    rows = _readme_settings_rows()
    assert set(rows) == {ServiceSettings.env_var(name) for name in ServiceSettings.model_fields}
    for name, option in _serve_options().items():
        flags = "/".join([option.opts[0], *option.secondary_opts])
        assert option.opts[0] in help_text, name
        assert rows[ServiceSettings.env_var(name)] == flags, name


def test_encoder_variables_reach_the_encoder_options(monkeypatch):
    """DENSEHYBRID_LAMBDA (the field is ``lam``) and DENSEHYBRID_POOLING reach the encoder configuration;
    encoder options nobody set stay None, so the model directory or the index decides them."""
    from densehybrid.encoder.config import EncoderConfig

    monkeypatch.setenv("DENSEHYBRID_LAMBDA", "0.25")
    monkeypatch.setenv("DENSEHYBRID_POOLING", "mean")
    assert ServiceSettings().encoder_config() == EncoderConfig(lam=0.25, pooling="mean")


@pytest.fixture
def captured_settings(monkeypatch):
    """`serve` up to the point where it would start: the settings it built."""
    import densehybrid.service.serve as serve_module

    seen = []
    monkeypatch.setattr(serve_module, "serve", seen.append)
    return seen


def test_model_flags_of_index_build_map_onto_the_settings(captured_settings):
    result = CliRunner().invoke(app, ["serve", "--model", "some/minilm", "--kind", "cls", "--pooling", "mean",
                                      "--normalize", "--dlr-dim", "128", "--lambda", "0.5", "--max-query-length", "16",
                                      "--no-warmup", "--retry-after-s", "3", "--search-threads", "2",
                                      "--request-timeout-s", "9.5"])
    assert result.exit_code == 0, result.output
    (settings,) = captured_settings
    assert settings.encoder_config() == EncoderConfig(model="some/minilm", kind="cls", pooling="mean", normalize=True,
                                                      dlr_dim=128, lam=0.5, max_query_length=16)
    assert (settings.model, settings.warmup, settings.retry_after_s, settings.search_threads,
            settings.request_timeout_s) == ("some/minilm", False, 3, 2, 9.5)


def test_flags_not_given_leave_the_environment_alone(captured_settings, monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_DLR_DIM", "64")
    monkeypatch.setenv("DENSEHYBRID_SEARCH_THREADS", "4")
    result = CliRunner().invoke(app, ["serve", "--model", "m"])
    assert result.exit_code == 0, result.output
    assert (captured_settings[0].dlr_dim, captured_settings[0].search_threads) == (64, 4)


@pytest.mark.parametrize("args, expected", [
    (["serve", "--model", "m", "--lambda", "auto"], "--lambda auto chooses λ from the corpus at 'index build' only"),
    (["serve", "--model", "m", "--port", "70000"], "invalid settings: port: Input should be less than or equal"),
])
def test_bad_serve_flags_end_with_one_sentence_and_exit_2(captured_settings, args, expected):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and not captured_settings
    assert expected in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output

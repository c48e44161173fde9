"""The balancer's per-client rate limit at work: real nginx (deploy/nginx/nginx.conf) before a live replica.

The config's two rate-limit knobs are turned down (5 requests/s, burst 5) so that a short burst of
requests passes them; a refused request never reaches the replica and gets the API's JSON error form
with Retry-After.
"""

import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from densehybrid.bench.servers.start import LiveServer, free_port
from densehybrid.service.app import create_app
from densehybrid.service.settings import ServiceSettings

from support.deploy_tools import require_tool
from support.fake_encoder import FakeEncoder

pytestmark = pytest.mark.slow  # a real nginx in front of a live replica, like the other balancer tests

CONF = Path(__file__).resolve().parents[1] / "deploy" / "nginx" / "nginx.conf"
RATE, BURST = 5, 5


def limited_conf(text: str, listen_port: int, replica_url: str, tmp_path: Path) -> str:
    """The deploy config pointed at one loopback replica, with the rate limit's knobs turned down."""
    rate_line = re.compile(r"rate=\d+r/s;(\s*# rate limit: rate)")
    burst_line = re.compile(r"burst=\d+ delay=\d+;(\s*# rate limit: burst)")
    assert rate_line.search(text) and burst_line.search(text), "the rate limit's knobs moved: update this test"
    text = rate_line.sub(rf"rate={RATE}r/s;\1", text)
    text = burst_line.sub(rf"burst={BURST} delay={BURST};\1", text)  # the whole burst at once
    return (text.replace("resolver 127.0.0.11 ", "resolver 127.0.0.1:9 ")
            .replace("listen 8080;", f"listen 127.0.0.1:{listen_port};")
            .replace("http://densehybrid:8000", replica_url)
            .replace("/tmp/", f"{tmp_path}/"))


def encode_200s(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith('densehybrid_requests_total{route="/encode",status="200"}'):
            return float(line.split()[-1])
    return 0.0


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_client_over_its_rate_gets_429_from_nginx_and_the_replica_never_sees_it(tmp_path):
    nginx = require_tool("nginx", shutil.which("nginx"))
    listen_port = free_port("127.0.0.1")
    replica = LiveServer(create_app(ServiceSettings(model="fake", log_json=False), encoder=FakeEncoder("cls")))
    with replica:
        (tmp_path / "nginx.conf").write_text(limited_conf(CONF.read_text(), listen_port, replica.url, tmp_path))
        proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr",
                                 "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{listen_port}"
        try:
            def balancer_up():
                assert proc.poll() is None, "nginx exited"
                try:
                    return httpx.get(url + "/lb-health", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(balancer_up, 20, "nginx to listen")
            body = {"texts": ["limit me"], "role": "query"}
            with httpx.Client(base_url=url, timeout=10) as client:
                answers = [client.post("/encode", json=body) for _ in range(4 * BURST)]
                statuses = [a.status_code for a in answers]
                assert set(statuses) == {200, 429}, statuses
                # the burst passes at once, and far fewer than all 20 within well under 4 s at 5/s
                assert BURST + 1 <= statuses.count(200) < len(statuses), statuses
                refused = next(a for a in answers if a.status_code == 429)
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["type"] == "rate_limited"
                assert encode_200s(replica.url) == statuses.count(200)  # refusals never reached the replica
                # the bucket refills: the client is served again without anyone restarting anything
                wait_until(lambda: client.post("/encode", json=body).status_code == 200, 10, "the rate to recover")
        finally:
            proc.terminate()
            output = proc.communicate(timeout=10)[0].decode(errors="replace")
        assert "[emerg]" not in output, output

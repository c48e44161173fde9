"""The balancer config at work: real nginx, deploy/nginx/nginx.conf, two live replicas, no Docker.

Docker's embedded DNS answers the service name with one A record per replica;
here a minimal DNS responder on loopback does the same for two replicas on
127.0.0.2 and 127.0.0.3. Only what cannot exist outside Docker is rewritten in
the config: the resolver address (127.0.0.11), the listen and replica ports,
and /tmp paths (kept per test). Checks: requests spread over both replicas,
and when one replica dies, requests still succeed through the other.
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.deploy_tools import require_tool

from densehybrid.bench.servers.start import free_port

pytestmark = pytest.mark.slow  # nginx in front of live replicas

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "deploy" / "nginx" / "nginx.conf"
REPLICA_HOSTS = ("127.0.0.2", "127.0.0.3")


class TinyDNS:
    """UDP DNS on 127.0.0.1 answering A queries for one name with fixed addresses (NXDOMAIN otherwise)."""

    def __init__(self, name: str, addresses: tuple[str, ...]):
        self.name, self.addresses = name.lower(), addresses
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def answer(self, query: bytes) -> bytes:
        labels, at = [], 12
        while query[at]:
            labels.append(query[at + 1:at + 1 + query[at]].decode().lower())
            at += 1 + query[at]
        qtype = struct.unpack("!H", query[at + 1:at + 3])[0]
        question = query[12:at + 5]
        known = ".".join(labels) == self.name
        records = [a for a in self.addresses] if known and qtype == 1 else []
        flags = 0x8180 if known else 0x8183  # response, recursion available; rcode 3 = NXDOMAIN
        header = query[:2] + struct.pack("!HHHHH", flags, 1, len(records), 0, 0)
        answers = b"".join(struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(a) for a in records)
        return header + question + answers

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, client = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            self.sock.sendto(self.answer(query), client)

    def __enter__(self) -> "TinyDNS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_config_rewrites_only_touch_docker_specifics():
    text = CONF.read_text()
    assert "resolver 127.0.0.11 " in text and "listen 8080;" in text and "http://densehybrid:8000" in text


def encode_count(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith('densehybrid_requests_total{route="/encode",status="200"}'):
            return float(line.split()[-1])
    return 0.0


def test_nginx_spreads_over_replicas_and_skips_a_dead_one(tmp_path):
    nginx = require_tool("nginx", shutil.which("nginx"))
    from support.fake_encoder import FakeEncoder
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings
    from densehybrid.bench.servers.start import LiveServer

    replica_port, listen_port = free_port(*REPLICA_HOSTS), free_port("127.0.0.1")
    replicas = [LiveServer(create_app(ServiceSettings(model="fake", log_json=False), encoder=FakeEncoder("cls")),
                           host=host, port=replica_port) for host in REPLICA_HOSTS]
    with TinyDNS("densehybrid", REPLICA_HOSTS) as dns, replicas[0], replicas[1]:
        conf = (CONF.read_text()
                .replace("resolver 127.0.0.11 ", f"resolver 127.0.0.1:{dns.port} ")
                .replace("listen 8080;", f"listen 127.0.0.1:{listen_port};")
                .replace("http://densehybrid:8000", f"http://densehybrid:{replica_port}")
                .replace("/tmp/", f"{tmp_path}/"))
        (tmp_path / "nginx.conf").write_text(conf)
        proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr",
                                 "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{listen_port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if httpx.get(url + "/lb-health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.1)

            body = {"texts": ["spread me"], "role": "query"}
            statuses = [httpx.post(url + "/encode", json=body, timeout=10).status_code for _ in range(40)]
            assert statuses == [200] * 40
            per_replica = [encode_count(r.url) for r in replicas]
            assert sum(per_replica) == 40 and min(per_replica) >= 5, per_replica  # both replicas served

            replicas[1].__exit__(None, None, None)  # one replica goes away
            statuses = [httpx.post(url + "/encode", json=body, timeout=10).status_code for _ in range(20)]
            assert statuses == [200] * 20  # refused connections are retried on the live replica
            assert encode_count(replicas[0].url) == per_replica[0] + 20
        finally:
            proc.terminate()
            output = proc.communicate(timeout=10)[0].decode(errors="replace")
        assert "[emerg]" not in output, output

"""Goodput (2xx/s) beyond saturation through the balancer, with and without its per-client rate limit.

Starts ``densehybrid serve --model minilm`` (encode-only) on loopback and a real nginx running
``deploy/nginx/nginx.conf`` in front of it (rewritten for loopback: listen port, upstream address,
temp paths). Load is wrk's closed loop (``wrk_closed_loop.lua``): every connection sends its next
request the moment an answer arrives, 429s included, i.e. clients that ignore Retry-After.

1. Saturation: ``--saturation-clients`` (default 12: as many 16-passage clients as fill the queue)
   straight to the server; their goodput is the server's capacity.
2. Through nginx, without the limit (its ``limit_req`` line removed) and with it (rate: the measured
   capacity; burst and delay: the config's), at each ``--multipliers`` x the saturating clients.

All wrk connections come from 127.0.0.1, i.e. one client address: here the per-client limit caps
the whole load, as it caps each address in a deployment. The limit's rate is the measured capacity
(rounded up). The server's queue is ``--queue-size`` texts
(default 192: 12 requests), so that an admitted request's wait (queue / capacity) stays well inside
a measured window; with the default 1024 it nears the window itself on this machine.

With ``--split-cores`` (the default where there are at least 2 CPUs) the server runs on the last CPU
and nginx and wrk on the others, the way clients and a balancer on other machines would not take the
encoder's CPU; without it all three share every core, and the cost of refusing (nginx's or the
server's) comes out of the encoder's time. Prints one JSON report.

    python -m densehybrid.bench.load.rate_limit --duration 8 --multipliers 2 10

Needs wrk and nginx on PATH.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from densehybrid.bench.load.wrk import run_wrk, wrk_executable
from densehybrid.bench.load.workloads import densehybrid_request
from densehybrid.bench.servers.start import (free_port, serve_command, start_server, stop_process,
                                            wait_for_process_ready)

NGINX_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "nginx.conf"
_RATE = re.compile(r"rate=\d+r/s;(\s*# rate limit: rate)")
_BURST = re.compile(r"burst=(\d+) delay=(\d+);(\s*# rate limit: burst)")
_LIMIT_LINE = re.compile(r"^\s*limit_req zone=.*# rate limit: burst\n", re.MULTILINE)


def config_burst(text: str) -> dict:
    """The burst and delay the config's rate limit sets."""
    found = _BURST.search(text)
    if not (_RATE.search(text) and found and _LIMIT_LINE.search(text)):
        raise SystemExit(f"{NGINX_CONF}: the rate limit's lines moved; update {__name__}")
    return {"burst": int(found.group(1)), "delay": int(found.group(2))}


def loopback_conf(text: str, listen_port: int, upstream: str, tmp: Path, rate: int | None,
                  burst: int | None = None) -> str:
    """The deploy config in front of ``upstream`` on loopback; ``rate`` None: without the limit;
    ``burst`` None: the config's burst and delay."""
    config_burst(text)
    if rate is None:
        text = _LIMIT_LINE.sub("", text)
    else:
        text = _RATE.sub(rf"rate={rate}r/s;\1", text)
        if burst is not None:
            text = _BURST.sub(rf"burst={burst} delay=\2;\3", text)
    return (text.replace("worker_connections 1024;", "worker_connections 8192;")
            .replace("resolver 127.0.0.11 ", "resolver 127.0.0.1:9 ")
            .replace("listen 8080;", f"listen 127.0.0.1:{listen_port};")
            .replace("http://densehybrid:8000", upstream)
            .replace("access_log /dev/stdout upstream;", "access_log off;")
            .replace("/tmp/", f"{tmp}/"))


def start_nginx(tmp: Path, conf: str, url: str, timeout_s: float = 20.0) -> subprocess.Popen:
    nginx = shutil.which("nginx")
    if nginx is None:
        raise SystemExit("nginx is not on PATH (Debian: apt-get install nginx-light)")
    (tmp / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", "stderr",
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_process_ready(url, proc, "/lb-health", timeout_s)
    return proc


def _cell(summary: dict) -> dict:
    return {"goodput_req_s": summary["req_s"], "statuses": summary.get("statuses"),
            "p50_ms": summary.get("p50_ms"), "p99_ms": summary.get("p99_ms"), "errors": summary.get("errors")}


def _split_cores() -> tuple[set[int], set[int]] | None:
    """(the server's CPUs, everyone else's), or None with fewer than 2 CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[-1]}, set(cpus[:-1])) if len(cpus) >= 2 else None


def run(model: str, saturation_clients: int, multipliers: list[int], duration_s: int, burst: int | None,
        split_cores: bool = True, queue_size: int = 192) -> dict:
    path, bodies = densehybrid_request("passages")
    split = _split_cores() if split_cores else None
    everyone = os.sched_getaffinity(0)
    if split is not None:
        os.sched_setaffinity(0, split[0])  # the server inherits it ...
    try:
        server, server_url = start_server(serve_command("--model", model, "--queue-size", str(queue_size)),
                                          ready_timeout_s=600)
    finally:
        os.sched_setaffinity(0, split[1] if split is not None else everyone)  # ... nginx and wrk this one
    report: dict = {"model": model, "workload": "passages (16 per request)", "duration_s": duration_s,
                    "saturation_clients": saturation_clients, "queue_size": queue_size,
                    "cpus": None if split is None else {"server": sorted(split[0]), "nginx_and_wrk": sorted(split[1])}}
    try:
        run_wrk(server_url, path, bodies, saturation_clients, 3)  # warm-up
        capacity = run_wrk(server_url, path, bodies, saturation_clients, duration_s)
        report["saturation_direct"] = _cell(capacity)
        rate = max(1, math.ceil(capacity["req_s"]))
        report["limit"] = {"rate_r_s": rate, **config_burst(NGINX_CONF.read_text())}
        if burst is not None:
            report["limit"]["burst"] = burst
        for label, limit in (("without_limit", None), ("with_limit", rate)):
            with tempfile.TemporaryDirectory(prefix="densehybrid-lb-") as tmp:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                conf = loopback_conf(NGINX_CONF.read_text(), port, server_url, Path(tmp), limit, burst)
                nginx = start_nginx(Path(tmp), conf, url)
                try:
                    for m in multipliers:
                        summary = run_wrk(url, path, bodies, m * saturation_clients, duration_s)
                        report.setdefault(label, {})[f"{m}x"] = _cell(summary)
                        print(f"{label} {m}x ({m * saturation_clients} clients): {_cell(summary)}", flush=True)
                finally:
                    stop_process(nginx)
    finally:
        stop_process(server, timeout_s=60)
        os.sched_setaffinity(0, everyone)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="zoo name or model directory to serve")
    parser.add_argument("--saturation-clients", type=int, default=12,
                        help="closed-loop 16-passage clients that saturate the server (12 fill a queue of 192)")
    parser.add_argument("--queue-size", type=int, default=192, help="the server's queue, in texts")
    parser.add_argument("--multipliers", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--duration", type=int, default=8, help="seconds measured per cell")
    parser.add_argument("--burst", type=int, help="the limit's burst (default: the config's)")
    parser.add_argument("--no-split-cores", dest="split_cores", action="store_false",
                        help="let the server, nginx and wrk share every CPU")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    wrk_executable()
    report = run(args.model, args.saturation_clients, args.multipliers, args.duration, args.burst, args.split_cores,
                 args.queue_size)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

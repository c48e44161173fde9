"""/encode under many clients, side by side with infinity-emb, and where the time goes (issue 18).

Starts ``densehybrid serve --model minilm`` (encode-only) on a free loopback port and drives ``/encode``
with closed-loop httpx clients: each client sends its next request as soon as the previous one is
answered. Two workloads: one short query per request, and 16 passages per request. For every client
count it prints req/s and p50/p99, and, from the ``timing`` each answer carries, the mean time per
stage: queue wait, tokenization, forward, and the rest (HTTP, validation, JSON serialization) as
client latency minus the server's own stages.

With ``--infinity`` it also creates a virtual environment for infinity-emb (never a dependency of this
project), serves the same model directory with it and drives it with the same load generator, then
prints the ratio table. Rounds are interleaved (densehybrid, peer, densehybrid, ...) on fresh servers and
the median round is reported, because this machine is shared and absolute numbers drift.

    python -m densehybrid.bench.encode_peers --rounds 3 --infinity
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from densehybrid.bench.servers import free_port, stop_process
from densehybrid.bench.service_latency import QUERIES
from densehybrid.encoder.zoo import resolve

INFINITY_REQUIREMENT = "infinity-emb[server,torch]==0.0.78"
TORCH_REQUIREMENT = "torch==2.13.0"  # first, so that pip takes the local CPU build
PASSAGE = ("Dense retrieval maps queries and passages to vectors and ranks passages by inner product; "
           "a lexical part keeps exact term matches that a dense vector alone blurs.")
STAGES = ("queue_ms", "tokenize_ms", "encode_ms")


@dataclass
class Run:
    """What one closed-loop run measured."""

    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    stage_ms: dict[str, list[float]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        out = {"requests": len(lat), "req_s": round(len(lat) / self.elapsed_s, 1) if self.elapsed_s else 0.0,
               "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
               "p99_ms": round(float(np.percentile(lat, 99)), 1) if len(lat) else None,
               "statuses": dict(self.statuses)}
        if self.stage_ms:
            stages = {name: round(statistics.fmean(values), 2) for name, values in self.stage_ms.items()}
            # the rest of the client's wait: HTTP, validation, JSON in and out, event-loop queueing
            stages["other_ms"] = round(statistics.fmean(self.latencies_ms) - sum(stages.values()), 2)
            out["stages"] = stages
        return out


def workload_texts(workload: str, i: int) -> list[str]:
    if workload == "query":
        return [QUERIES[i % len(QUERIES)]]
    return [f"{PASSAGE} ({i}.{j})" for j in range(16)]


async def closed_loop(url: str, request_for, clients: int, requests: int) -> Run:
    """``requests`` requests from ``clients`` closed-loop clients; only 200s count as answered."""
    run = Run()
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one_client() -> None:
            for i in counter:
                path, body = request_for(i)
                started = time.perf_counter()
                response = await client.post(path, json=body)
                elapsed_ms = (time.perf_counter() - started) * 1000
                run.statuses[response.status_code] += 1
                if response.status_code != 200:
                    continue
                run.latencies_ms.append(elapsed_ms)
                timing = response.json().get("timing") if path != "/embeddings" else None
                for stage in STAGES if timing else ():
                    run.stage_ms.setdefault(stage, []).append(float(timing.get(stage, 0.0)))

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        run.elapsed_s = time.perf_counter() - started
    return run


def densehybrid_request(workload: str):
    return lambda i: ("/encode", {"texts": workload_texts(workload, i), "role": "query" if workload == "query" else "passage"})


def infinity_request(workload: str, model: str):
    return lambda i: ("/embeddings", {"input": workload_texts(workload, i), "model": model})


def wait_ready(url: str, path: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server at {url} not ready after {timeout_s:g} s")


def start_densehybrid(model: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "densehybrid", "serve", "--model", model, "--port", str(port),
                             "--log-level", "WARNING", *extra])
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, "/ready", proc)
    return proc, url


def infinity_venv(directory: Path) -> Path:
    """The infinity-emb executable in its own virtual environment, created on first use."""
    executable = directory / "bin" / "infinity_emb"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
        pip = [str(directory / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
        subprocess.run([*pip, INFINITY_REQUIREMENT], check=True)
    return executable


def start_infinity(executable: Path, model_dir: Path, batch_size: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([str(executable), "v2", "--model-id", str(model_dir), "--engine", "torch", "--device", "cpu",
                             "--batch-size", str(batch_size), "--pooling-method", "mean", "--no-bettertransformer",
                             "--port", str(port), "--host", "127.0.0.1", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, "/health", proc)
    return proc, url


def measure(start, request_for_workload, workloads: list[str], clients: list[int], requests: int, warmup: int) -> dict:
    """One fresh server, every workload and client count; {workload: {clients: summary}}."""
    proc, url = start()
    try:
        results: dict = {}
        for workload in workloads:
            request_for = request_for_workload(workload)
            for count in clients:
                asyncio.run(closed_loop(url, request_for, count, warmup))
                summary = asyncio.run(closed_loop(url, request_for, count, requests)).summary()
                results.setdefault(workload, {})[count] = summary
                print(f"{url} {workload} {count} clients: {summary}", flush=True)  # partial results survive a kill
        return results
    finally:
        stop_process(proc, timeout_s=60)


def median_round(rounds: list[dict]) -> dict:
    """Per workload and client count, the round with the median req/s."""
    out: dict = {}
    for workload in rounds[0]:
        for count in rounds[0][workload]:
            ordered = sorted((r[workload][count] for r in rounds), key=lambda s: s["req_s"])
            out.setdefault(workload, {})[count] = ordered[len(ordered) // 2]
    return out


def print_table(ours: dict, peer: dict | None) -> None:
    for workload, by_clients in ours.items():
        print(f"\n/encode, {workload} ({'1 text' if workload == 'query' else '16 texts'} per request)")
        header = f"{'clients':>7} | {'densehybrid req/s':>17} | {'p50 / p99 ms':>13}"
        if peer:
            header += f" | {'infinity req/s':>14} | {'p50 / p99 ms':>13} | {'req/s ratio':>11}"
        print(header)
        for count, s in by_clients.items():
            line = f"{count:>7} | {s['req_s']:>17} | {s['p50_ms']:>6.0f} / {s['p99_ms']:<4.0f}"
            if peer:
                p = peer[workload][count]
                ratio = s["req_s"] / p["req_s"] if p["req_s"] else float("nan")
                line += f" | {p['req_s']:>14} | {p['p50_ms']:>6.0f} / {p['p99_ms']:<4.0f} | {ratio:>10.2f}x"
            print(line)
        top = max(by_clients)
        stages = by_clients[top].get("stages", {})
        print(f"where the time goes at {top} clients (mean ms per request): "
              + ", ".join(f"{k.removesuffix('_ms')} {v}" for k, v in stages.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="zoo name or model directory served by both")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workloads", nargs="+", default=["query", "passages"], choices=["query", "passages"])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for densehybrid serve (repeat)")
    parser.add_argument("--infinity", action="store_true", help="also run infinity-emb on the same model directory")
    parser.add_argument("--infinity-venv", type=Path, default=Path.home() / ".cache" / "densehybrid" / "infinity-venv")
    parser.add_argument("--batch-size", type=int, default=32, help="infinity-emb batch size")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    model_dir = Path(resolve(args.model))
    ours_rounds, peer_rounds = [], []
    executable = infinity_venv(args.infinity_venv) if args.infinity else None
    for _ in range(args.rounds):
        ours_rounds.append(measure(lambda: start_densehybrid(args.model, args.server_arg), densehybrid_request,
                                   args.workloads, args.clients, args.requests, args.warmup))
        if executable is not None:
            peer_rounds.append(measure(lambda: start_infinity(executable, model_dir, args.batch_size),
                                       lambda w: infinity_request(w, str(model_dir)),
                                       args.workloads, args.clients, args.requests, args.warmup))
    ours = median_round(ours_rounds)
    peer = median_round(peer_rounds) if peer_rounds else None
    print_table(ours, peer)
    if args.json:
        args.json.write_text(json.dumps({"densehybrid": ours, "infinity": peer, "rounds": args.rounds}, indent=1))


if __name__ == "__main__":
    main()

"""wrk, the C load generator the peer benchmarks drive servers with: ``-c N`` connections are N closed-loop
clients (``wrk_closed_loop.lua``: each sends its next request as soon as its last answer is in, request
bodies cycled from a file), and the summary of one run, the server's ``Server-Timing`` stages included.
The load generator stays off the Python interpreter whose server it measures. Needs wrk
(``apt-get install wrk``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

WRK_SCRIPT = "wrk_closed_loop.lua"
WRK_MARKER = "WRK_JSON "
WRK_TIMEOUT = "30s"
STAGE_ORDER = ("queue", "tokenize", "encode", "search", "rerank", "total", "serialize")


def wrk_executable() -> str:
    """The wrk on PATH, or stop saying how to install it."""
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk (the HTTP load generator this benchmark drives the servers with) is not installed: "
                         "`apt-get install wrk` (Debian/Ubuntu; `brew install wrk` on macOS)")
    return found


def parse_wrk_output(stdout: str) -> dict:
    """The one ``WRK_JSON {...}`` line ``wrk_closed_loop.lua`` prints at the end of a run."""
    for line in stdout.splitlines():
        if line.startswith(WRK_MARKER):
            return json.loads(line.removeprefix(WRK_MARKER))
    raise RuntimeError(f"no {WRK_MARKER.strip()} line in wrk's output:\n{stdout}")


def _stage_rank(name: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(name) if name in STAGE_ORDER else len(STAGE_ORDER), name)


def summarize(result: dict) -> dict:
    """A parsed wrk result -> requests, req_s (2xx answers per second), latency ms, statuses, errors, stages.

    ``stages`` are the server's mean ms per 2xx answer plus ``other_ms``: the mean client latency minus the
    server's own time (its ``total`` stage when it sends one, else the sum of its stages; plus ``serialize``,
    which the server times after its ``total``)."""
    latency, seconds = result["latency_ms"], result["duration_us"] / 1e6
    statuses = {int(code): count for code, count in result["statuses"].items()}
    answered = sum(count for code, count in statuses.items() if 200 <= code < 300)
    out = {"requests": result["requests"], "req_s": round(answered / seconds, 1) if seconds else 0.0,
           "p50_ms": round(latency["p50"], 1), "p90_ms": round(latency["p90"], 1),
           "p99_ms": round(latency["p99"], 1), "max_ms": round(latency["max"], 1),
           "statuses": statuses, "errors": {kind: n for kind, n in result["errors"].items() if n}}
    server = result["stages_ms"]
    stages = {f"{name}_ms": round(server[name], 2) for name in sorted(server, key=_stage_rank)}
    if stages and answered == result["requests"]:  # wrk's mean latency counts every answer, 429s too
        server_ms = (stages["total_ms"] + stages.get("serialize_ms", 0.0) if "total_ms" in stages
                     else sum(stages.values()))
        stages["other_ms"] = round(latency["mean"] - server_ms, 2)
    if stages:
        out["stages"] = stages
    return out


def run_wrk(url: str, path: str, bodies: list[dict], clients: int, duration_s: int) -> dict:
    """``clients`` closed-loop connections POSTing ``bodies`` (cycled) to ``url + path`` for ``duration_s``;
    the summary of what wrk measured."""
    wrk = wrk_executable()
    script_file = resources.files("densehybrid.bench.load") / WRK_SCRIPT
    with tempfile.TemporaryDirectory() as tmp, resources.as_file(script_file) as script:
        bodies_file = Path(tmp) / "bodies.jsonl"
        bodies_file.write_text("".join(json.dumps(body) + "\n" for body in bodies))
        done = subprocess.run([wrk, "-t", "1", "-c", str(clients), "-d", f"{duration_s}s", "--timeout", WRK_TIMEOUT,
                               "-s", str(script), url, "--", str(bodies_file), path], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return summarize(parse_wrk_output(done.stdout))

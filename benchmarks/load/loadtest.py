"""Load test of a live server on loopback: saturation, latency under load, shedding, memory over a soak.

``densehybrid loadtest`` starts a server process on 127.0.0.1 (``bench.servers.hash_server``: a
HashEncoder whose forward takes ``base_ms + per_text_ms * texts`` of sleep, like a device forward
that releases the GIL, over a small real index; or pass ``--url`` for a server already running),
then drives ``/search`` with a bounded async httpx client in five phases:

1. saturation: ``concurrency`` clients in a closed loop; throughput = answered requests per second;
2. open-loop Poisson arrivals at 50 % and 90 % of that throughput: latency percentiles;
3. open loop at ``overload`` x saturation: what is shed (429 + Retry-After), that nothing times out and
   that the encoder queue never passes its bound (sampled from ``/metrics``);
4. soak: open loop at 50 % for ``soak_s`` seconds, the server's RSS sampled from ``/proc``.

Everything is bounded: each phase has a fixed duration, at most ``max_in_flight`` requests are
outstanding (arrivals beyond that are counted as ``not_sent``, never queued in the client), every
request has a timeout, and the server process is stopped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from densehybrid.bench.load.probe import rss_drift, rss_mb, server_quantiles
from densehybrid.bench.servers import hash_server
from densehybrid.bench.servers.start import server_process
from densehybrid.bench.timing import percentile

log = logging.getLogger(__name__)

WORDS = ("dense retrieval lexical matching gated inner product aggregation term weights faiss flat index "
         "query latency passage ranking bm25 baseline neural reranking vector quantization").split()


@dataclass(frozen=True)
class FakeServerConfig:
    """The server ``run_load`` starts when no ``--url`` is given: the HashEncoder with a device-like forward
    (``base_ms + per_text_ms * texts``) over a toy index of ``documents`` passages."""

    # measured (docs/performance.md): a DistilBERT-base forward of one 32-token query takes 46-79 ms on this machine kind
    base_ms: float = 40.0
    per_text_ms: float = 10.0
    max_batch_size: int = 4
    queue_size: int = 32
    documents: int = 500


@contextlib.contextmanager
def fake_server(config: FakeServerConfig, workdir: Path, timeout_s: float = 120) -> Iterator[tuple[str, int]]:
    """``servers.hash_server`` over a toy index built in ``workdir`` (once) -> (url, pid); stopped afterwards."""
    from densehybrid.bench.servers.hash_encoder import HashEncoder
    from densehybrid.bench.servers.toy_index import build_toy_index

    index = workdir / "index" / "index"
    if not index.exists():
        build_toy_index(HashEncoder("dhr"), workdir / "index", count=config.documents)
    command = hash_server.command(index, "--forward-ms", str(config.base_ms), str(config.per_text_ms),
                                  "--max-batch-size", str(config.max_batch_size), "--queue-size", str(config.queue_size))
    with server_process(command, ready_timeout_s=timeout_s) as (proc, url):
        yield url, proc.pid


@dataclass(frozen=True)
class LoadConfig:
    saturation_s: float = 10.0
    phase_s: float = 10.0
    soak_s: float = 60.0
    concurrency: tuple[int, ...] = (8, 32)  # closed-loop client counts; saturation = the best of them
    overload: float = 2.0  # offered load beyond saturation, as a multiple of it
    max_in_flight: int = 512
    timeout_s: float = 10.0
    rss_every_s: float = 2.0
    seed: int = 0


@dataclass
class Phase:
    name: str
    offered_rps: float | None
    seconds: float
    statuses: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)  # of 200 answers
    retry_after_missing: int = 0
    max_queue_depth: float = 0.0
    server: dict = field(default_factory=dict)  # quantiles the server itself observed (see server_quantiles)

    def summary(self) -> dict:
        total = sum(self.statuses.values())
        lat = sorted(self.latencies_ms)
        return {
            "phase": self.name, "offered_rps": None if self.offered_rps is None else round(self.offered_rps, 1),
            "seconds": round(self.seconds, 2), "requests": total, "sent_rps": round(total / self.seconds, 1),
            "answered_rps": round(self.statuses[200] / self.seconds, 1),
            "statuses": dict(sorted(self.statuses.items(), key=str)),
            "shed_fraction": round(self.statuses[429] / total, 4) if total else 0.0,
            "p50_ms": percentile_ms(lat, 50), "p95_ms": percentile_ms(lat, 95), "p99_ms": percentile_ms(lat, 99),
            "retry_after_missing": self.retry_after_missing, "max_queue_depth": self.max_queue_depth,
            "server": self.server,
        }


def percentile_ms(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile, to 0.01 ms, for the report."""
    value = percentile(values, q)
    return None if value is None else round(value, 2)


def queries(seed: int) -> Iterator[dict]:
    rng = random.Random(seed)
    while True:
        yield {"query": " ".join(rng.choices(WORDS, k=rng.randint(2, 8))), "k": 10, "candidates": 100}


# -- one request -----------------------------------------------------------------------------
async def _one(client: httpx.AsyncClient, body: dict, phase: Phase) -> None:
    started = time.perf_counter()
    try:
        response = await client.post("/search", json=body)
    except httpx.TimeoutException:
        phase.statuses["timeout"] += 1
        return
    except httpx.HTTPError as exc:
        phase.statuses[f"error:{type(exc).__name__}"] += 1
        return
    phase.statuses[response.status_code] += 1
    if response.status_code == 200:
        phase.latencies_ms.append((time.perf_counter() - started) * 1000)
    elif response.status_code == 429 and not response.headers.get("retry-after", "").isdigit():
        phase.retry_after_missing += 1


# -- phases ------------------------------------------------------------------------------------
async def closed_loop(client: httpx.AsyncClient, bodies: Iterator[dict], clients: int, seconds: float) -> Phase:
    phase = Phase(f"saturation c={clients}", None, seconds)
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop:
            await _one(client, next(bodies), phase)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    phase.seconds = time.perf_counter() - started
    return phase


async def open_loop(client: httpx.AsyncClient, bodies: Iterator[dict], name: str, rps: float, seconds: float,
                    config: LoadConfig, rng: random.Random, on_tick=None) -> Phase:
    """Poisson arrivals at ``rps`` for ``seconds``; never more than ``max_in_flight`` outstanding."""
    phase = Phase(name, rps, seconds)
    in_flight: set[asyncio.Task] = set()
    started = time.perf_counter()
    next_at = started
    while (now := time.perf_counter()) < started + seconds:
        await asyncio.sleep(max(0.0, next_at - now))  # yields even when behind schedule
        next_at += rng.expovariate(rps)
        if len(in_flight) >= config.max_in_flight:
            phase.statuses["not_sent"] += 1
            continue
        task = asyncio.create_task(_one(client, next(bodies), phase))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(set(in_flight))
    phase.seconds = seconds
    return phase


async def _sample_queue_depth(client: httpx.AsyncClient, deepest: list[float], stop: asyncio.Event) -> None:
    """Scrape the encoder queue depth every 0.2 s until ``stop``; the largest seen goes into ``deepest[0]``."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            for line in (await client.get("/metrics")).text.splitlines():
                if line.startswith("densehybrid_queue_depth "):
                    deepest[0] = max(deepest[0], float(line.split()[1]))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def _sample_rss(pid: int | None, every_s: float, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    started = time.perf_counter()
    while pid is not None and not stop.is_set():
        if (mb := rss_mb(pid)) is not None:
            samples.append((round(time.perf_counter() - started, 1), round(mb, 1)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def observed_phase(client: httpx.AsyncClient, probe: httpx.AsyncClient, bodies: Iterator[dict], name: str,
                         rps: float, config: LoadConfig, rng: random.Random) -> Phase:
    """One open-loop phase, with the queue depth sampled and the server's own quantiles attached."""
    before = (await probe.get("/metrics")).text
    deepest, stop = [0.0], asyncio.Event()
    sampler = asyncio.create_task(_sample_queue_depth(probe, deepest, stop))
    phase = await open_loop(client, bodies, name, rps, config.phase_s, config, rng)
    stop.set()
    await sampler
    after = (await probe.get("/metrics")).text
    phase.max_queue_depth = deepest[0]
    phase.server = {"request": server_quantiles(before, after, "densehybrid_request_duration_seconds",
                                                {"route": "/search"}),
                    "queue_wait": server_quantiles(before, after, "densehybrid_queue_wait_seconds", {})}
    return phase


async def drive(url: str, config: LoadConfig, server_pid: int | None = None, api_key: str | None = None) -> dict:
    """All phases against ``url``; returns the report (phase summaries, saturation, RSS over the soak)."""
    rng = random.Random(config.seed)
    bodies = queries(config.seed)
    limits = httpx.Limits(max_connections=config.max_in_flight, max_keepalive_connections=config.max_in_flight)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    async with httpx.AsyncClient(base_url=url, timeout=config.timeout_s, limits=limits, headers=headers) as client, \
            httpx.AsyncClient(base_url=url, timeout=5, headers=headers) as probe:
        tries = [await closed_loop(client, bodies, clients, config.saturation_s / len(config.concurrency))
                 for clients in config.concurrency]
        saturation = max(tries, key=lambda p: p.statuses[200] / p.seconds)
        capacity = saturation.statuses[200] / saturation.seconds
        if capacity <= 0:
            raise RuntimeError(f"no request succeeded while measuring saturation: {dict(saturation.statuses)}")
        phases = [saturation]
        for name, factor in (("50%", 0.5), ("90%", 0.9), (f"{config.overload:g}x", config.overload)):
            phases.append(await observed_phase(client, probe, bodies, name, factor * capacity, config, rng))
        rss: list[tuple[float, float]] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_rss(server_pid, config.rss_every_s, rss, stop))
        phases.append(await open_loop(client, bodies, "soak", 0.5 * capacity, config.soak_s, config, rng))
        stop.set()
        await sampler
    return {"url": url, "saturation_rps": round(capacity, 1), "phases": [p.summary() for p in phases],
            "soak_rss": rss_drift(rss) if server_pid is not None else None, "config": asdict(config)}


def run_load(config: LoadConfig, server: FakeServerConfig, workdir: Path, url: str | None = None,
             server_pid: int | None = None, api_key: str | None = None) -> dict:
    if url is not None:
        return asyncio.run(drive(url, config, server_pid, api_key))
    with fake_server(server, workdir) as (started_url, pid):
        report = asyncio.run(drive(started_url, config, pid))
    report["server"] = {"fake": asdict(server)}
    return report

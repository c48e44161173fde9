"""Reading a server's ``/metrics`` with prometheus_client's own text parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def read_metrics(server) -> dict:
    """The metric families on ``/metrics`` by family name (a counter's without ``_total``).

    ``server`` is a base URL or an ``httpx.Client`` with a base URL."""
    answer = server.get("/metrics") if isinstance(server, httpx.Client) else httpx.get(server + "/metrics", timeout=10)
    answer.raise_for_status()
    return {f.name: f for f in text_string_to_metric_families(answer.text)}


def sample_total(families: dict, sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels`` (0.0 when none)."""
    return sum(s.value for f in families.values() for s in f.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def scrape(server, sample: str, **labels: str) -> float:
    """:func:`sample_total` of one fresh read of ``server``'s ``/metrics``."""
    return sample_total(read_metrics(server), sample, **labels)


def rejected(server) -> dict[str, float]:
    """``densehybrid_rejected_total`` by reason."""
    family = read_metrics(server)["densehybrid_rejected"]
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}

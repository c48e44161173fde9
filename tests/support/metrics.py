"""Reading a server's ``/metrics`` text with prometheus_client's own parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, **labels: str) -> list:
    """The samples called ``name`` whose labels include ``labels``."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the matching samples (0.0 when there are none)."""
    return sum(s.value for s in samples(text, name, **labels))


def scrape(url: str, name: str, **labels: str) -> float:
    """:func:`metric_value` of ``url + "/metrics"``."""
    return metric_value(httpx.get(url + "/metrics", timeout=10).text, name, **labels)

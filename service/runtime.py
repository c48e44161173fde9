"""What one server process serves, as built by :mod:`service.startup`: a plain container."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from densehybrid.encoder.base import Encoder
from densehybrid.service.batcher import Batcher
from densehybrid.service.health import Health
from densehybrid.service.live_recall import LiveRecall
from densehybrid.service.recall_steering import RecallSteering
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.pipeline import Pipeline
from densehybrid.service.search_batcher import SearchBatcher
from densehybrid.service.settings import ServiceSettings

if TYPE_CHECKING:
    from densehybrid.index.writes.live import LiveIndex
    from densehybrid.service.compaction import Compactor
    from densehybrid.service.tracing import Tracing


@dataclass
class Runtime:
    settings: ServiceSettings
    encoder: Encoder
    index: LiveIndex | None  # None: encode-only
    batcher: Batcher
    search_pool: ThreadPoolExecutor
    search_batcher: SearchBatcher | None
    pipeline: Pipeline
    metrics: ServiceMetrics
    health: Health
    compactor: Compactor | None
    tracing: Tracing | None = None  # None: tracing off (no otlp_endpoint)
    live_recall: LiveRecall | None = None  # None: no local index to measure
    steering: RecallSteering | None = None  # None: recall steering off

    @property
    def ready(self) -> bool:
        return self.health.ready

    @property
    def status(self) -> str:
        return self.health.describe()

"""The live recall and recall steering of a served index, wired to the settings and the metrics at start-up."""

from __future__ import annotations

import logging

from densehybrid.index.served.stated_recall import BreadthLimits
from densehybrid.service.live_recall import LiveRecall
from densehybrid.service.metrics import ServiceMetrics
from densehybrid.service.recall_steering import RecallSteering
from densehybrid.service.settings import ServiceSettings

log = logging.getLogger(__name__)


def live_recall_of(settings: ServiceSettings, served, metrics: ServiceMetrics) -> LiveRecall:
    """The live recall of a local index's first stage, reported to ``metrics`` (a Milvus collection's rows are
    not here to scan)."""
    first_stage = served.first_stage
    target = (first_stage.get("calibration") or {}).get("target_recall")
    live = LiveRecall(served.first_stage_recall, rate=settings.recall_sample_rate,
                      queue_size=settings.recall_sample_queue, window=settings.recall_window)
    live.report_to(*metrics.watch_recall(served.name, first_stage["type"], target, live))
    return live


def steering_of(settings: ServiceSettings, served, live: LiveRecall | None, metrics: ServiceMetrics
              ) -> RecallSteering | None:
    """Recall steering of the default breadth, when asked for and the index can be steered (else a warning)."""
    if not settings.recall_steering:
        return None
    if live is None or settings.recall_sample_rate == 0:
        log.warning("recall steering is off: it needs the live recall of a local index (recall_sample_rate > 0)")
        return None
    try:
        steering = RecallSteering(served.first_stage, served.set_default_breadth,
                                  BreadthLimits(settings.max_ef_search, settings.max_nprobe),
                                  samples=settings.recall_steering_samples, slack=settings.recall_steering_slack)
    except ValueError as exc:
        log.warning("recall steering is off: %s", exc)
        return None
    steering.report_to(metrics.watch_breadth(steering.knob, steering.breadth))
    live.steer_with(steering.observe)
    return steering

"""Keep the recall users get at the target: the default breadth steered by the recall measured on live traffic.

The build chose the default breadth (``ef_search``, ``nprobe`` or pqscan's ``margin``) on calibration queries.
When users' queries are harder (another domain, a drift), the live recall (``service.live_recall``) falls under
the target at that breadth; when they are easier, a narrower breadth would do. With ``recall_steering`` on,
every ``recall_steering_samples`` unfiltered samples searched at the default breadth are compared with the
index's target: under it, the default moves one step wider along the breadths the build measured; at least
``recall_steering_slack`` above it, one step narrower. It never leaves the operator's limits (``max_ef_search``,
``max_nprobe``), each change is logged and kept in ``/info`` (``first_stage.steering``) and the metrics, and the
samples taken at the old breadth are set aside. Requests that send their own breadth or ``recall`` are theirs:
they neither count nor move.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.index.search.params import BREADTH, SearchParams
from densehybrid.index.served.stated_recall import BreadthLimits

log = logging.getLogger(__name__)

HISTORY = 20  # changes kept for /info


@dataclass(frozen=True)
class Change:
    at: float  # Unix time
    breadth_from: float
    breadth_to: float
    live_recall: float
    samples: int

    def to_dict(self, knob: str) -> dict:
        return {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)), "from": self.breadth_from,
                "to": self.breadth_to, "knob": knob, "live_recall_at_10": round(self.live_recall, 4),
                "samples": self.samples}


def steps(curve: Sequence[dict], cap: float | None) -> list[float]:
    """The breadths the build measured, narrowest first, within the operator's ``cap``."""
    return sorted({p["breadth"] for p in curve if cap is None or p["breadth"] <= cap})


def next_breadth(current: float, measured: Sequence[float], wider: bool) -> float | None:
    """The measured breadth one step wider (or narrower) than ``current``; None at the end of the range."""
    beyond = [b for b in measured if b > current] if wider else [b for b in measured if b < current]
    if not beyond:
        return None
    return min(beyond) if wider else max(beyond)


class RecallSteering:
    """Steers ``first_stage``'s default breadth through ``apply(knob, breadth)``; fed by the live recall's samples."""

    def __init__(self, first_stage: dict, apply: Callable[[str, float], None], limits: BreadthLimits, *,
                 samples: int = 200, slack: float = 0.02):
        calibration = first_stage.get("calibration") or {}
        self.knob = BREADTH.get(first_stage["type"])
        self.target = calibration.get("target_recall")
        if self.knob is None or self.target is None:
            raise ValueError(f"a {first_stage['type']} first stage without a calibrated target has no breadth to steer")
        self.measured = steps(calibration["curve"], limits.cap(self.knob))
        self.breadth = float(first_stage[self.knob])
        self.samples, self.slack = samples, slack
        self._apply = apply
        self._on_change: Callable[[str, float], None] = lambda knob, breadth: None
        self._recent: deque[float] = deque(maxlen=samples)
        self._lock = threading.Lock()
        self.changes: deque[Change] = deque(maxlen=HISTORY)

    def report_to(self, on_change: Callable[[str, float], None]) -> None:
        """Where each change (knob, new breadth) is reported after it is applied (the metrics)."""
        self._on_change = on_change

    def observe(self, params: SearchParams, filtered: bool, recall: float) -> None:
        """One measured sample (on the live recall's thread): counted when unfiltered and at the default breadth."""
        if filtered or getattr(params, self.knob) is not None:
            return
        with self._lock:
            self._recent.append(recall)
            if len(self._recent) < self.samples:
                return
            mean = float(np.mean(self._recent))
            to = None
            if mean < self.target:
                to = next_breadth(self.breadth, self.measured, wider=True)
            elif mean >= self.target + self.slack:
                to = next_breadth(self.breadth, self.measured, wider=False)
            if to is None:
                return
            change = Change(time.time(), self.breadth, to, mean, len(self._recent))
            self._apply(self.knob, to)
            self.breadth = to
            self._recent.clear()  # measured at the old breadth
            self.changes.append(change)
        log.warning("recall steering: live recall@10 %.4f over %d samples is %s the target %.3f: default %s %g -> %g",
                    mean, change.samples, "under" if to > change.breadth_from else "well above", self.target,
                    self.knob, change.breadth_from, to)
        self._on_change(self.knob, to)

    def summary(self) -> dict:
        with self._lock:
            return {"knob": self.knob, "breadth": self.breadth, "target_recall": self.target,
                    "samples_per_step": self.samples, "slack": self.slack, "measured_breadths": list(self.measured),
                    "samples_at_breadth": len(self._recent),
                    "changes": [c.to_dict(self.knob) for c in self.changes]}

"""The answer shapes of the recall measured on live traffic and of recall steering, as ``/info`` shows them."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RecallWindow(BaseModel):
    recall_at_10: float | None = Field(description="mean recall@10 of these samples (null before the first)")
    count: int


class LiveRecall(BaseModel):
    recall_at_10: float | None = Field(description="mean recall@10 of the last `window` sampled live queries against "
                                                   "an exact scan of the same rows (null before the first)")
    count: int = Field(description="sampled queries in the window")
    window: int = Field(description="the most recent samples kept (recall_window)")
    unfiltered: RecallWindow
    filtered: RecallWindow
    sample_rate: float = Field(description="share of searched queries sampled (recall_sample_rate; 0: off)")
    measured: int = Field(description="samples measured since start")
    dropped: int = Field(description="samples dropped since start because the sample queue was full")
    failed: int = Field(description="samples whose measurement failed since start")
    busy_s: float = Field(description="CPU seconds the sampling thread spent measuring since start (one exact scan a "
                                      "sample): its share of the uptime is what the sampling costs")


class BreadthChange(BaseModel):
    at: str = Field(description="when (UTC)")
    knob: str
    from_: float = Field(alias="from")
    to: float
    live_recall_at_10: float = Field(description="the live recall at the old breadth that moved it")
    samples: int


class Steering(BaseModel):
    knob: str = Field(description="the breadth steered: ef_search, nprobe or margin")
    breadth: float = Field(description="the default breadth now")
    target_recall: float
    samples_per_step: int
    slack: float
    measured_breadths: list[float] = Field(description="the breadths it steps along: those the build measured, "
                                                       "within the server's limits")
    samples_at_breadth: int = Field(description="unfiltered samples taken at the current breadth so far")
    changes: list[BreadthChange] = Field(description="the latest changes, oldest first")

"""The recall a served approximate first stage may promise: a requested recall turned into a breadth, and the
recall an answer states for what it searched.

The build measured recall@10 against the exact scan at each breadth of a grid (the curve in the manifest's
``first_stage.calibration``, written by ``index.building.calibrate``). What it measured is narrow: unfiltered
searches of the ``ip`` first stage for the top 10, at the index's least rescored count. An answer states that
figure only for a search of that shape; any other search (a filter, ``approx_gip``, a page past the top 10, a
smaller ``rescore``) states no figure and says why, instead of borrowing one measured for something else. The
live figure (``service.live_recall``) measures what users really search, filters included.

Pure functions of the manifest's ``first_stage`` entry, the request's breadth and the operator's limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from densehybrid.index.search.params import BREADTH, SEARCH_FIELDS, SearchParams

K = 10  # the calibration measures recall@10
# Milvus index types that scan every row exactly
MILVUS_EXACT = frozenset({"FLAT", "GPU_BRUTE_FORCE"})


class RecallUnavailable(ValueError):
    """A recall was asked of a first stage that cannot turn one into a breadth (the message says what to do)."""


@dataclass(frozen=True)
class Point:
    """One breadth's measurement over the calibration queries. With several groups of queries (from the corpus,
    from another domain) ``recall`` and ``exact_share`` are the lowest group's, and ``groups`` holds each
    group's (name -> (recall, exact_share)): a breadth keeps a target only if every group keeps it."""

    breadth: float  # ef_search, nprobe (whole numbers) or a pqscan margin
    recall: float  # mean recall@10
    exact_share: float  # share of queries whose top 10 is the exact one entire
    p50_ms: float
    p99_ms: float
    groups: dict[str, tuple[float, float]] | None = field(default=None, compare=False)

    def to_dict(self) -> dict:
        point = {"breadth": self.breadth, "recall_at_10": round(self.recall, 4),
                 "exact_top10": round(self.exact_share, 4), "p50_ms": round(self.p50_ms, 3),
                 "p99_ms": round(self.p99_ms, 3)}
        if self.groups:
            point["groups"] = {name: {"recall_at_10": round(r, 4), "exact_top10": round(e, 4)}
                               for name, (r, e) in self.groups.items()}
        return point

    @classmethod
    def from_dict(cls, record: dict) -> "Point":
        groups = {name: (float(g["recall_at_10"]), float(g["exact_top10"]))
                  for name, g in record.get("groups", {}).items()} or None
        return cls(record["breadth"], float(record["recall_at_10"]), float(record["exact_top10"]),
                   float(record["p50_ms"]), float(record["p99_ms"]), groups)


@dataclass(frozen=True)
class Choice:
    point: Point
    reached: bool  # whether ``point`` keeps the target; else the best recall the grid found
    target: float


def choose(points: Sequence[Point], target: float) -> Choice:
    """The narrowest breadth at which at least ``target`` of the calibration queries find their whole exact top 10
    (so their mean recall@10 is at least that too); without one, the breadth of the best recall.

    Whole top 10s, not a mean recall: queries unlike the calibration queries (another domain) lose more of
    their top 10 at a breadth, and a breadth that leaves few calibration queries short keeps more of theirs
    (on 827k package summaries, a pqscan margin chosen for a mean recall of 0.95 on queries cut from the
    corpus gave MS MARCO questions 0.948; one chosen for whole top 10s, 0.988 at 4 % more time). The
    narrowest, not the fastest measured: a wider breadth costs more, and a busy machine's timings vary."""
    if not points:
        raise ValueError("no breadth was measured")
    reaching = [p for p in points if p.exact_share >= target]
    if reaching:
        return Choice(min(reaching, key=lambda p: p.breadth), True, target)
    return Choice(max(points, key=lambda p: (p.recall, -p.breadth)), False, target)


def breadth_for(curve: Sequence[dict], recall: float) -> dict:
    """The manifest curve's narrowest point (a ``Point.to_dict``) where ``recall`` of the calibration queries found
    their whole top 10 (:func:`choose`); the best one there is when none does."""
    return choose([Point.from_dict(p) for p in curve], recall).point.to_dict()


def recall_at(curve: Sequence[dict], breadth: float) -> float | None:
    """The recall the manifest curve measured at ``breadth``, or for a breadth between its points the recall of
    the widest one below it (a wider search finds at least as much); None below the narrowest."""
    below = [p["recall_at_10"] for p in curve if p["breadth"] <= breadth]
    return max(below) if below else None


@dataclass(frozen=True)
class BreadthLimits:
    """The widest breadths the operator allows a search (the service's ``max_ef_search``, ``max_nprobe``); a
    recall is never turned into a breadth past them."""

    ef_search: int
    nprobe: int

    def cap(self, knob: str) -> float | None:
        return {"ef_search": self.ef_search, "nprobe": self.nprobe}.get(knob)


@dataclass(frozen=True)
class RecallBreadth:
    """A requested recall turned into a breadth: the fields to search with, the recall measured there (None: an
    exact first stage, which keeps any), and whether it keeps the recall asked for."""

    fields: dict
    recall: float | None
    reached: bool


def is_exact(first_stage: dict) -> bool:
    """Whether the first stage scans every row exactly (a flat index, or a Milvus collection of such a type)."""
    kind = first_stage["type"]
    return kind in ("flat", "flat_ip") or (kind == "milvus" and first_stage.get("index_type") in MILVUS_EXACT)


def breadth_for_recall(first_stage: dict, recall: float, limits: BreadthLimits) -> RecallBreadth:
    """The narrowest breadth of ``first_stage`` (the served index's entry, with its calibration) whose measured
    share of whole top 10s keeps ``recall``, within the operator's ``limits``; RecallUnavailable naming the
    engine when it has no breadth the build measured."""
    if is_exact(first_stage):
        return RecallBreadth({}, None, True)
    kind, knob = first_stage["type"], BREADTH.get(first_stage["type"])
    if knob is None:
        what = f"Milvus {first_stage.get('index_type')} collection" if kind == "milvus" else f"{kind} first stage"
        raise RecallUnavailable(f"this index's {what} has no breadth calibrated for recall: leave recall out, or "
                                f"serve an index built with --ann pqscan or hnsw (or --ann flat for an exact scan)")
    calibration = first_stage.get("calibration")
    if calibration is None:
        raise RecallUnavailable(f"this index's {kind} first stage was not calibrated for recall (built before "
                                f"calibration existed): ask for a breadth ({knob}) instead, or rebuild it")
    cap = limits.cap(knob)
    allowed = [Point.from_dict(p) for p in calibration["curve"] if cap is None or p["breadth"] <= cap]
    if not allowed:  # even the narrowest measured breadth is past the limit: the limit, unmeasured
        return RecallBreadth({knob: cap}, None, False)
    chosen = choose(allowed, recall)
    return RecallBreadth({knob: chosen.point.breadth}, chosen.point.recall, chosen.reached)


def unmeasured_because(first_stage: dict, params: SearchParams) -> str | None:
    """Why the build's curve says nothing of this search (None: it does)."""
    if params.filter is not None:
        return "a filtered search: the build measured unfiltered ones"
    if params.first_stage != "ip":
        return f"first_stage {params.first_stage}: the build measured the ip first stage"
    if params.offset + params.k > K:
        return f"hits past the top {K}: the build measured recall@{K}"
    least = first_stage.get("rescore")
    if params.rescore is not None and least is not None and params.rescore < least:
        return f"rescore {params.rescore} below the {least} the build measured with"
    return None


def stated(first_stage: dict, params: SearchParams, asked: RecallBreadth | None = None) -> dict:
    """An answer's ``index.first_stage``: the type, the breadth searched with and the recall@10 the build measured
    for such a search (1.0 for an exact scan), or ``recall_at_10`` None with ``recall_note`` saying why; with
    ``asked`` (a request's ``recall``), ``reached`` says whether that breadth keeps it."""
    # the server's own settings (its scan threads) are /info's, not an answer's
    answer = {key: value for key, value in first_stage.items() if key not in ("calibration", "scan_threads")}
    # a Milvus collection's breadths are named as the index holds them (ef_search or nprobe)
    fields = [f for f in ("ef_search", "nprobe") if f in answer] if first_stage["type"] == "milvus" \
        else SEARCH_FIELDS.get(first_stage["type"], ())
    answer |= {field: getattr(params, field) for field in fields if getattr(params, field) is not None}
    if asked is not None:
        answer["reached"] = asked.reached
    if is_exact(first_stage):
        return answer | {"recall_at_10": 1.0}
    knob, calibration = BREADTH.get(first_stage["type"]), first_stage.get("calibration")
    if knob is None or calibration is None:
        return answer | {"recall_at_10": None, "recall_note": f"this {first_stage['type']} first stage was not "
                                                              f"calibrated for recall"}
    note = unmeasured_because(first_stage, params)
    recall = None if note else recall_at(calibration["curve"], answer[knob])
    if recall is None and note is None:
        note = f"{knob} {answer[knob]} is below the narrowest breadth the build measured"
    return answer | {"recall_at_10": recall, **({"recall_note": note} if note else {})}

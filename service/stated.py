"""What a search promises about its first stage: the breadth a request's ``recall`` becomes, and /info's recall
measured on live traffic (with the breadth recall steering keeps)."""

from __future__ import annotations

from densehybrid.index.search.params import SEARCH_FIELDS
from densehybrid.index.served.stated_recall import BreadthLimits, RecallBreadth, RecallUnavailable, breadth_for_recall
from densehybrid.service.errors import InvalidRequest
from densehybrid.service.runtime import Runtime


def requested_breadth(rt: Runtime, first_stage: dict, body) -> tuple[dict, RecallBreadth | None]:
    """The breadth fields of a search: a request's own (ef_search, nprobe, margin, rescore), and for a ``recall``
    (with no breadth of this first stage given, which wins) the narrowest breadth the index's build measured to keep
    it within the server's limits, with whether it does (422 for a first stage that cannot say)."""
    breadth = {field: getattr(body, field) for fields in SEARCH_FIELDS.values() for field in fields
               if getattr(body, field) is not None}
    if body.recall is None:
        return breadth, None
    try:
        asked = breadth_for_recall(first_stage, body.recall, BreadthLimits(rt.settings.max_ef_search,
                                                                           rt.settings.max_nprobe))
    except RecallUnavailable as exc:
        raise InvalidRequest(str(exc)) from None
    if any(field in breadth for field in asked.fields):  # the request's own breadth wins: no recall was chosen
        return breadth, None
    return breadth | asked.fields, asked


def measured_on_traffic(rt: Runtime) -> dict:
    """/info's ``first_stage.live_recall`` (the recall measured on sampled live queries; none for Milvus) and, with
    recall steering on, ``steering`` (the default breadth it keeps and its changes)."""
    measured = {} if rt.live_recall is None else {"live_recall": rt.live_recall.summary()}
    return measured | ({} if rt.steering is None else {"steering": rt.steering.summary()})

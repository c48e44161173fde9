"""The request bodies the load benchmarks send: short queries, and the workloads of the wrk-driven
benchmarks (``query``: one query to /encode; ``passages``: 16 passages to /encode; ``search``: one query
to /search, k=10)."""

from __future__ import annotations

QUERIES = ["parse command line arguments", "read a csv file", "send an email message", "compress data with zlib",
           "regular expression matching", "start a thread pool", "format a date and time", "open a network socket",
           "serialize objects to json", "compute a hash digest", "walk a directory tree", "sort a list in place"]
PASSAGE = ("Dense retrieval maps queries and passages to vectors and ranks passages by inner product; "
           "a lexical part keeps exact term matches that a dense vector alone blurs.")
WORKLOADS = ("query", "passages", "search")
BODIES = 64  # distinct request bodies per workload; wrk cycles through them


def workload_texts(workload: str, i: int) -> list[str]:
    if workload == "passages":
        return [f"{PASSAGE} ({i}.{j})" for j in range(16)]
    return [QUERIES[i % len(QUERIES)]]


def densehybrid_request(workload: str) -> tuple[str, list[dict]]:
    """The route and request bodies of ``workload`` for densehybrid."""
    texts = [workload_texts(workload, i) for i in range(BODIES)]
    if workload == "search":
        return "/search", [{"query": t[0], "k": 10} for t in texts]
    role = "passage" if workload == "passages" else "query"
    return "/encode", [{"texts": t, "role": role} for t in texts]

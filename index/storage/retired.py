"""First stages this release no longer builds or serves, and the message that refuses an index using one.

An index names its first stage in its manifest; one built with a retired first stage is refused when it is
opened (served, verified, folded or exported), with the command that rebuilds it. Its ``vectors.faiss`` is
intact, so an import of the same vectors or a build of the same corpus gives an index that serves.
"""

from __future__ import annotations

# first stage type in the manifest -> what it was, as its flag named it
RETIRED = {
    "ivf": "inverted lists of 8-bit codes (--ann ivf)",
    "pq": "IndexPQ codes scored without rescoring (--pq)",
}

REBUILD = ("rebuild it with `densehybrid index build ... --ann pqscan` (or `--ann hnsw`, or `--ann flat` for the "
           "exact scan); an index imported from Pyserini: `densehybrid index import ... --ann pqscan`")


def retired_first_stage(first_stage: dict) -> str | None:
    """Why ``first_stage`` (the manifest's entry) cannot be served, with the command that rebuilds the index;
    None when it can."""
    what = RETIRED.get(first_stage.get("type"))
    if what is None:
        return None
    return f"its first stage, {what}, is no longer served: {REBUILD}"

"""Where a top list's cut runs through equal scores: which engine keeps which of a tied run is its own choice, so
the searcher reads such runs whole or keeps none of them (``index.search.searcher``)."""

from __future__ import annotations

import numpy as np


def above_the_cut(scores: np.ndarray, rows: np.ndarray, depth: int) -> np.ndarray:
    """The top ``depth`` rows of a sorted top list (Q, ≥ depth) less those tied with the row after the cut
    (-1 instead); a list of ``depth`` rows or fewer comes back whole.

    Which of a tied group makes the cut is engine-specific (Faiss, torch and Milvus order ties
    differently), so keeping none of it gives every engine the same candidates. Such ties are in
    practice a part's zero scores (no term matched), which the other part's candidates cover.
    """
    if rows.shape[1] <= depth:
        return rows
    keep = scores[:, :depth] > scores[:, depth:depth + 1]
    return np.where(keep, rows[:, :depth], -1)


def tied_at_cut(scores: np.ndarray, rows: np.ndarray, depth: int) -> bool:
    """Whether some query's sorted top list (Q, > depth) has the row after the cut tied with the last one kept."""
    return bool(((rows[:, depth] >= 0) & (scores[:, depth] == scores[:, depth - 1])).any())


def run_reaches_the_end(scores: np.ndarray, rows: np.ndarray, depth: int) -> bool:
    """Whether some query's run of scores equal to its last kept one (at ``depth - 1``) lasts to the end of
    its list, so that rows past the list may belong to it too."""
    return bool(((rows[:, -1] >= 0) & (scores[:, -1] == scores[:, depth - 1])).any())

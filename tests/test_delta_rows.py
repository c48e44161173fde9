"""The live delta's row storage: appends in place, dead rows, re-packing, and snapshots that never change,
checked against a plain dict of the live documents; and the partial top-k against a full sort."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from densehybrid.index.writes import delta as D, merged
from densehybrid.index.search import gip
from densehybrid.index.storage.documents import Document

DIM, GATED = 6, 4


class Base:
    """A base generation of ``n`` rows with ids ``b0..``: only what the delta asks of it."""

    def __init__(self, n: int):
        self.count = n

    def row_of(self, doc_id: str):
        return int(doc_id[1:]) if doc_id.startswith("b") and int(doc_id[1:]) < self.count else None

    def rows_of(self, doc_ids):
        return np.array([-1 if (row := self.row_of(i)) is None else row for i in doc_ids], np.int64)


def rows_for(ids, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    return [Document(i, "", f"text {i} {seed}") for i in ids], values, rng.integers(0, 2, (len(ids), GATED), np.uint8)


def live_view(delta: D.Delta) -> dict:
    docs, values, gates = delta.live()
    assert len(docs) == len(delta) == len(delta.row_of)
    view = {}
    if delta.values is None:
        return view
    for doc, v, g in zip(docs, values, gates):
        row = delta.row_of[doc.id]
        assert delta.docs[row] == doc and row not in delta.dead
        np.testing.assert_array_equal(delta.values[row], v)
        np.testing.assert_array_equal(delta.values16[row], v.astype(np.float16))
        np.testing.assert_array_equal(delta.gates[row], g)
        view[doc.id] = (doc.text, v.tobytes(), g.tobytes())
    return view


ops = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.lists(st.integers(0, 30), min_size=1, max_size=12)),
    st.tuples(st.just("delete"), st.integers(0, 30)),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=ops, base_n=st.integers(0, 10))
def test_the_delta_holds_exactly_the_live_documents_and_snapshots_never_change(ops, base_n):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(D, "_FIRST_CAPACITY", 4)  # grow and re-pack often
        patch.setattr(D, "_MIN_DEAD_TO_REPACK", 3)
        check_random_writes(ops, Base(base_n))


def check_random_writes(ops, base):
    delta, want, hidden, changes = D.Delta(), {}, set(), 0
    snapshots = []
    for step, (op, arg) in enumerate(ops):
        if op == "upsert":
            ids = [f"{'b' if n % 3 == 0 else 'n'}{n}" for n in arg]
            docs, values, gates = rows_for(ids, step)
            delta = D.upsert(delta, base, docs, values, gates)
            changes += 1
            for doc, v, g in zip(docs, values, gates):  # a later duplicate in the batch wins
                want[doc.id] = (doc.text, v.tobytes(), g.tobytes())
                if base.row_of(doc.id) is not None:
                    hidden.add(base.row_of(doc.id))
        else:
            doc_id = f"{'b' if arg % 3 == 0 else 'n'}{arg}"
            if doc_id in want or (base.row_of(doc_id) is not None and base.row_of(doc_id) not in hidden):
                delta = D.delete(delta, base, doc_id)
                changes += 1
                want.pop(doc_id, None)
                if base.row_of(doc_id) is not None:
                    hidden.add(base.row_of(doc_id))
            else:
                with pytest.raises(D.UnknownDocument):
                    D.delete(delta, base, doc_id)
        assert delta.changes == changes
        assert live_view(delta) == want and delta.hidden == hidden
        assert len(delta.dead) <= max(3, len(delta))  # re-packed once the dead outnumber the live
        snapshots.append((delta, dict(want)))
    for snapshot, seen in snapshots:  # later writes appended past every snapshot's rows
        assert live_view(snapshot) == seen


def test_a_delta_grown_from_an_older_snapshot_copies_instead_of_overwriting():
    base = Base(0)
    first = D.upsert(D.Delta(), base, *rows_for(["n1"], 1))
    left = D.upsert(first, base, *rows_for(["n2"], 2))
    right = D.upsert(first, base, *rows_for(["n3"], 3))  # same store, rows past `first` already taken
    assert set(left.row_of) == {"n1", "n2"} and set(right.row_of) == {"n1", "n3"}
    np.testing.assert_array_equal(left.values[1], rows_for(["n2"], 2)[1][0])
    np.testing.assert_array_equal(right.values[1], rows_for(["n3"], 3)[1][0])
    assert right.store is not left.store


def test_rows_of_another_width_are_refused():
    delta = D.upsert(D.Delta(), Base(0), *rows_for(["n1"], 1))
    docs, values, gates = rows_for(["n2"], 2)
    with pytest.raises(ValueError, match="do not fit"):
        D.upsert(delta, Base(0), docs, values[:, :3], gates)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), q=st.integers(1, 4), n=st.integers(1, 80), k=st.integers(1, 90),
       levels=st.integers(1, 6))
def test_top_by_score_equals_a_full_sort_ties_included(seed, q, n, k, levels):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, levels, (q, n)).astype(np.float32)  # few levels: many ties at the cut
    rows = np.stack([rng.permutation(n) + 5 for _ in range(q)]).astype(np.int64)
    got = merged.top_by_score(scores, rows, k)
    want = gip.sort_by_score(scores, rows, k)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])

"""The one offline encoding loop: every text once, in its place, whatever the batch size."""

import numpy as np
import pytest

from support.fake_encoder import FakeEncoder
from densehybrid.encoder.batches import encode_all, encode_in_batches, plan_batches

TEXTS = [("word " * n).strip() + f" t{n}" for n in (5, 1, 9, 3, 3, 12, 2, 7, 1, 4)]


@pytest.fixture
def encoder():
    return FakeEncoder("dhr")


@pytest.mark.parametrize("batch_size", [1, 3, 4, 10, 64])
@pytest.mark.parametrize("by_length", [False, True])
def test_every_text_is_encoded_once_in_input_order(encoder, batch_size, by_length):
    alone = np.concatenate([encoder.encode([t], "passage").values for t in TEXTS])
    seen = []
    got = encode_all(encoder, TEXTS, "passage", batch_size, by_length=by_length, progress=seen.append)
    np.testing.assert_allclose(got.values, alone, atol=1e-6)
    assert got.gates.shape == (len(TEXTS), encoder.spec.gated_dim)
    expected_sizes = [batch_size] * (len(TEXTS) // batch_size) + ([len(TEXTS) % batch_size] if len(TEXTS) % batch_size else [])
    assert seen == expected_sizes


def test_batches_by_length_are_sorted_and_carry_their_positions(encoder):
    batches = list(encode_in_batches(encoder, TEXTS, "query", 3, by_length=True))
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(len(TEXTS)))
    lengths = [t.length for t in encoder.tokenize(TEXTS, "query")]
    assert [lengths[i] for i in rows] == sorted(lengths)
    for batch in batches:
        np.testing.assert_allclose(batch.encoded.values, encoder.encode([TEXTS[i] for i in batch.rows], "query").values,
                                   atol=1e-6)


def test_no_texts_gives_no_batches_and_zero_rows(encoder):
    assert list(encode_in_batches(encoder, [], "query", 4)) == []
    empty = encode_all(encoder, [], "query", 4)
    assert empty.values.shape == (0, encoder.spec.dim) and empty.gates.shape == (0, encoder.spec.gated_dim)


def test_a_given_plan_is_followed(encoder):
    plan = [[4, 0], [2], [1, 3]]
    batches = list(encode_in_batches(encoder, TEXTS[:5], "passage", plan=plan))
    assert [b.rows.tolist() for b in batches] == plan


def test_plan_rejects_an_empty_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([1, 2], 0)

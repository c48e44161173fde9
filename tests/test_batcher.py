"""The encoder worker (service.batcher) against the deterministic FakeEncoder."""

import threading

import numpy as np
import pytest

from densehybrid.service.batcher import Batcher
from densehybrid.service.errors import EncoderFailed, NotReady, QueueFull

from support.fake_encoder import FakeEncoder
from support.waiting import wait_until

TEXTS = [f"query number {i} about " + " ".join(f"w{j}" for j in range(i % 7 + 1)) for i in range(32)]


class Recorder:
    """Collects what the worker reports (a stand-in for ServiceMetrics)."""

    def __init__(self):
        self.batches, self.waits, self.depths, self.rejected, self.failures = [], [], [], [], []

    def observe_batch(self, role, texts, tokens, seconds):
        self.batches.append((role, texts, tokens))

    def observe_queue_wait(self, seconds):
        self.waits.append(seconds)

    def set_queue_depth(self, texts):
        self.depths.append(texts)

    def count_rejected(self, reason):
        self.rejected.append(reason)

    def count_batch_failure(self, role):
        self.failures.append(role)


def make(encoder, **kwargs):
    recorder = Recorder()
    batcher = Batcher(encoder, observer=recorder, **{"max_wait_s": 0.005, **kwargs})
    batcher.start()
    return batcher, recorder


def submit_all(batcher, encoder, texts, role="query"):
    return [batcher.submit(encoder.tokenize([t], role), role) for t in texts]


def test_concurrent_jobs_share_forwards_and_each_gets_its_own_rows():
    encoder = FakeEncoder("dhr", delay_s=0.02)
    batcher, recorder = make(encoder, max_batch_size=16)
    try:
        futures = submit_all(batcher, encoder, TEXTS)
        outcomes = [f.result(timeout=10) for f in futures]
    finally:
        batcher.stop()
    assert len(encoder.batch_sizes) < len(TEXTS)
    assert max(encoder.batch_sizes) <= 16 and sum(encoder.batch_sizes) == len(TEXTS)
    alone = FakeEncoder("dhr")
    for text, outcome in zip(TEXTS, outcomes):
        expected = alone.encode([text], "query")
        np.testing.assert_array_equal(outcome.encoded.values, expected.values)
        np.testing.assert_array_equal(outcome.encoded.gates, expected.gates)
        assert outcome.queue_ms >= 0 and outcome.encode_ms > 0 and outcome.batch_texts >= 1
    assert [b[1] for b in recorder.batches] == encoder.batch_sizes
    assert len(recorder.waits) == len(TEXTS)


def test_token_budget_splits_batches():
    encoder = FakeEncoder("dlr", delay_s=0.01)
    long_text = " ".join(f"t{i}" for i in range(30))  # 32 tokens with [CLS]/[SEP]
    batcher, recorder = make(encoder, max_batch_size=64, max_batch_tokens=4 * 32)
    try:
        for f in submit_all(batcher, encoder, [long_text] * 12):
            f.result(timeout=10)
    finally:
        batcher.stop()
    assert all(tokens <= 4 * 32 for _, _, tokens in recorder.batches)
    assert max(encoder.batch_sizes) <= 4 and sum(encoder.batch_sizes) == 12


def test_a_job_over_the_limits_runs_alone_and_whole():
    encoder = FakeEncoder("cls")
    batcher, _ = make(encoder, max_batch_size=4)
    texts = TEXTS[:10]
    try:
        outcome = batcher.submit(encoder.tokenize(texts, "passage"), "passage").result(timeout=10)
    finally:
        batcher.stop()
    np.testing.assert_array_equal(outcome.encoded.values, FakeEncoder("cls").encode(texts, "passage").values)


def test_roles_are_never_mixed_in_one_forward():
    encoder = FakeEncoder("dhr", delay_s=0.01, max_query_length=8, max_passage_length=64)
    calls = []
    original = encoder.encode_tokenized

    def spy(items, role):
        calls.append((role, len(items)))
        return original(items, role)

    encoder.encode_tokenized = spy
    batcher, _ = make(encoder)
    long_text = " ".join(f"t{i}" for i in range(40))
    try:
        futures = []
        for i in range(10):
            role = "query" if i % 2 else "passage"
            futures.append((role, batcher.submit(encoder.tokenize([long_text], role), role)))
        results = [(role, f.result(timeout=10)) for role, f in futures]
    finally:
        batcher.stop()
    assert {role for role, _ in calls} == {"query", "passage"}
    for role, outcome in results:  # a passage keeps 64 tokens, a query 8: results differ by role
        np.testing.assert_array_equal(outcome.encoded.values, FakeEncoder("dhr", max_query_length=8,
                                      max_passage_length=64).encode([long_text], role).values)


def test_failed_forward_fails_only_its_batch_and_the_worker_lives_on():
    encoder = FakeEncoder("dhr", delay_s=0.02,
                          fail_when=lambda items: any(len(i.ids["hash"]) == 5 for i in items))
    batcher, recorder = make(encoder, max_batch_size=8)
    try:
        blocker = batcher.submit(encoder.tokenize(["slow job"], "query"), "query")  # occupies the worker
        wait_until(lambda: encoder.batch_sizes, what="its forward started")  # later jobs form the next batch
        doomed = submit_all(batcher, encoder, ["one two three", "a b"])  # "one two three" has 5 tokens
        blocker.result(timeout=10)
        for f in doomed:
            with pytest.raises(EncoderFailed):
                f.result(timeout=10)
        after = batcher.submit(encoder.tokenize(["works again"], "query"), "query").result(timeout=10)
    finally:
        batcher.stop()
    assert batcher.alive is False and recorder.failures == ["query"]
    np.testing.assert_array_equal(after.encoded.values, FakeEncoder("dhr").encode(["works again"], "query").values)


def test_full_queue_is_refused_and_depth_stays_bounded():
    encoder = FakeEncoder("cls", delay_s=0.2)
    batcher, recorder = make(encoder, max_batch_size=2, queue_size=6, retry_after_s=3)
    try:
        batcher.submit(encoder.tokenize(["running"], "query"), "query")
        wait_until(lambda: encoder.batch_sizes, what="the worker is busy with the first job")
        accepted = submit_all(batcher, encoder, ["q"] * 6)
        with pytest.raises(QueueFull) as refused:
            batcher.submit(encoder.tokenize(["one too many"], "query"), "query")
        assert refused.value.headers["Retry-After"] == "3"
        assert batcher.depth == 6 and max(recorder.depths) <= 6
        for f in accepted:
            f.result(timeout=10)
    finally:
        batcher.stop()
    assert recorder.rejected == ["queue_full"] and batcher.depth == 0


def test_cancelled_job_is_dropped_before_encoding():
    encoder = FakeEncoder("cls", delay_s=0.1)
    batcher, _ = make(encoder, max_batch_size=1)
    try:
        first = batcher.submit(encoder.tokenize(["busy"], "query"), "query")
        wait_until(lambda: encoder.batch_sizes, what="the worker is busy with the first job")
        gone = batcher.submit(encoder.tokenize(["gone"], "query"), "query")
        assert gone.cancel()
        kept = batcher.submit(encoder.tokenize(["kept"], "query"), "query")
        first.result(timeout=10), kept.result(timeout=10)
    finally:
        batcher.stop()
    assert encoder.batch_sizes == [1, 1]  # "gone" never reached the encoder


def test_stop_finishes_queued_jobs_then_refuses_new_ones():
    encoder = FakeEncoder("cls", delay_s=0.02)
    batcher, _ = make(encoder, max_batch_size=1)
    futures = submit_all(batcher, encoder, ["a", "b", "c"])
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(10)
    assert all(f.result(timeout=1) is not None for f in futures)
    with pytest.raises(NotReady):
        batcher.submit(encoder.tokenize(["late"], "query"), "query")


def blocked_worker(encoder):
    """A worker held inside its first forward until the returned event is set (jobs queue up meanwhile)."""
    gate, inside = threading.Event(), threading.Event()
    original = encoder.encode_tokenized
    order = []

    def forward(items, role):
        order.append([item.ids["hash"][1] for item in items])  # each text's first word id names it
        if not inside.is_set():
            inside.set()
            gate.wait(10)
        return original(items, role)

    encoder.encode_tokenized = forward
    return gate, inside, order


def test_writes_and_searches_are_encoded_in_arrival_order():
    """Writes make room for searches before they queue (service.write_pacing): the worker takes jobs in
    arrival order, batching the queued jobs of one role together."""
    encoder = FakeEncoder("dhr")
    gate, inside, order = blocked_worker(encoder)
    batcher, _ = make(encoder, max_wait_s=0.0)
    word = {name: encoder.tokenize([name], "query")[0].ids["hash"][1] for name in ("first", "w1", "w2", "q1", "q2")}
    try:
        futures = [batcher.submit(encoder.tokenize(["first"], "query"), "query")]
        assert inside.wait(10)
        futures += [batcher.submit(encoder.tokenize([name], "passage"), "passage") for name in ("w1", "w2")]
        futures += [batcher.submit(encoder.tokenize([name], "query"), "query") for name in ("q1", "q2")]
        gate.set()
        for f in futures:
            f.result(timeout=10)
    finally:
        batcher.stop()
    names = {v: k for k, v in word.items()}
    got = [[names[w] for w in batch] for batch in order]
    assert got == [["first"], ["w1", "w2"], ["q1", "q2"]]

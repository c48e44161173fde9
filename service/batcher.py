"""The encoder worker: one thread owns the model and batches concurrent requests (docs/architecture.md).

Requests arrive already tokenized (tokenization runs on the request side) and
wait in a bounded queue counted in texts. The worker takes the oldest job and
adds the following jobs of the same role and output while the batch stays within
``max_batch_size`` texts and ``max_batch_tokens`` padded tokens, waiting at most
``max_wait_s`` for more to arrive. One forward encodes the batch; each job gets
its own rows back. A job bigger than the limits runs alone (the encoder bounds
its own memory). Jobs are taken in arrival order: writes leave room for
searches before they reach this queue (``service.write_pacing``). A forward
that raises fails every job of that batch and the worker carries on with the
next; a job whose caller went away (its future was cancelled) is dropped
before it is encoded. A full queue is refused at once
(:class:`~service.errors.QueueFull`, HTTP 429) instead of growing.

A job may carry its next stage (``then``): the worker hands it the job's rows
and future right after the forward, so that the next stage starts from this
thread and the caller's future resolves only with the final answer.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Literal, Protocol

from densehybrid.encoder.base import Encoded, Encoder, Role, SparseVector, TokenizedText
from densehybrid.service.errors import EncoderFailed, NotReady, QueueFull

log = logging.getLogger(__name__)

# what a job asks the forward for: the index's rows, or the V-dim lexical vectors (TEI's /embed_sparse)
Output = Literal["vectors", "lexical"]


class BatchObserver(Protocol):
    def observe_batch(self, role: str, texts: int, tokens: int, seconds: float) -> None: ...
    def observe_queue_wait(self, seconds: float) -> None: ...
    def set_queue_depth(self, texts: int) -> None: ...
    def count_rejected(self, reason: str) -> None: ...
    def count_batch_failure(self, role: str) -> None: ...


class _NoObserver:
    def __getattr__(self, _name):
        return lambda *args, **kwargs: None


@dataclass(frozen=True)
class EncodeOutcome:
    """One job's rows and where its time went."""

    encoded: Encoded | list[SparseVector]  # rows, or lexical vectors for output="lexical"
    queue_ms: float
    encode_ms: float
    batch_texts: int


# takes over a job after its forward: it must resolve the future (now RUNNING) itself, now or later
Then = Callable[[EncodeOutcome, Future], None]


@dataclass
class _Job:
    items: list[TokenizedText]
    role: Role
    output: Output = "vectors"
    then: Then | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)

    @property
    def longest(self) -> int:
        return max((item.length for item in self.items), default=0)


class Batcher:
    def __init__(self, encoder: Encoder, *, max_batch_size: int = 64, max_batch_tokens: int = 16384,
                 max_wait_s: float = 0.0, queue_size: int = 1024, retry_after_s: int = 1,
                 observer: BatchObserver | None = None, hand_on: Callable[[], ContextManager] | None = None):
        self.encoder = encoder
        # entered around the hand-on of one batch's jobs to their next stage (the search batcher holds its drain)
        self.hand_on = hand_on or contextlib.nullcontext
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.queue_size = queue_size
        self.retry_after_s = retry_after_s
        self.observer = observer or _NoObserver()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._queued_texts = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="densehybrid-encoder", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the jobs already queued (up to ``timeout``), then stop; later jobs are refused."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            leftovers, self._jobs = list(self._jobs), collections.deque()
            self._queued_texts = 0
        for job in leftovers:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(NotReady("the service is shutting down"))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def depth(self) -> int:
        """Texts waiting for the worker."""
        return self._queued_texts

    # -- request side -----------------------------------------------------------
    def check_room(self, texts: int) -> None:
        """Refuse now (:class:`QueueFull`) a job of ``texts`` texts that the queue could not take, before its
        caller spends time tokenizing it: beyond the queue limit, refusals stay cheap and leave the CPU to
        the forwards. :meth:`submit` checks again, under the lock."""
        if self._queued_texts + texts > self.queue_size:
            self._refuse_full()

    def _refuse_full(self) -> None:
        self.observer.count_rejected("queue_full")
        raise QueueFull(f"encoder queue is full ({self._queued_texts} texts waiting); retry later", self.retry_after_s)

    def submit(self, items: list[TokenizedText], role: Role, output: Output = "vectors",
               then: Then | None = None) -> Future:
        """Queue one job; its future resolves to an :class:`EncodeOutcome` (or what ``then`` makes of it) or an
        error. Cancelling the future while the job waits drops it."""
        job = _Job(list(items), role, output, then)
        with self._cond:
            if self._closing:
                self.observer.count_rejected("shutting_down")
                raise NotReady("the service is shutting down")
            if self._queued_texts + len(job.items) > self.queue_size:
                self._refuse_full()
            self._jobs.append(job)
            self._queued_texts += len(job.items)
            self.observer.set_queue_depth(self._queued_texts)
            self._cond.notify()
        return job.future

    def withdraw(self, future: Future) -> None:
        """Take a cancelled job out of the queue now, so that it stops holding queue places until the worker
        reaches it (many clients giving up behind a slow forward would otherwise cause 429s for nothing)."""
        with self._cond:
            for job in self._jobs:
                if job.future is future:
                    self._jobs.remove(job)
                    self._queued_texts -= len(job.items)
                    self.observer.set_queue_depth(self._queued_texts)
                    return

    # -- worker side ------------------------------------------------------------
    def _run(self) -> None:
        log.info("encoder worker started (batch %d texts / %d tokens, wait %.1f ms, queue %d texts)",
                 self.max_batch_size, self.max_batch_tokens, self.max_wait_s * 1000, self.queue_size)
        while (batch := self._next_batch()) is not None:
            self._process(batch)
        log.info("encoder worker stopped")

    def _fits(self, batch: list[_Job], job: _Job) -> bool:
        texts = sum(len(j.items) for j in batch) + len(job.items)
        longest = max(job.longest, *(j.longest for j in batch))
        return texts <= self.max_batch_size and texts * longest <= self.max_batch_tokens

    def _next_joining(self, batch: list[_Job]) -> _Job | None:
        """(Under the lock.) The oldest queued job when it joins ``batch`` (same role and output, and it fits);
        else None."""
        first, job = batch[0], self._jobs[0]
        if (job.role, job.output) != (first.role, first.output) or not self._fits(batch, job):
            return None
        return self._jobs.popleft()

    def _next_batch(self) -> list[_Job] | None:
        """Block for the oldest job, then gather same-role, same-output jobs that fit, waiting at most max_wait_s."""
        with self._cond:
            while not self._jobs and not self._closing:
                self._cond.wait()
            if not self._jobs:
                return None
            batch = [self._jobs.popleft()]
            deadline = time.perf_counter() + self.max_wait_s
            while True:
                if self._jobs:
                    joining = self._next_joining(batch)
                    if joining is None:
                        break
                    batch.append(joining)
                    continue
                remaining = deadline - time.perf_counter()
                if remaining <= 0 or self._closing or sum(len(j.items) for j in batch) >= self.max_batch_size:
                    break
                self._cond.wait(remaining)
            self._queued_texts -= sum(len(j.items) for j in batch)
            self.observer.set_queue_depth(self._queued_texts)
            return batch

    def _process(self, batch: list[_Job]) -> None:
        """Encode one batch; whatever happens, every live job's future is resolved."""
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        role = live[0].role
        items = [item for job in live for item in job.items]
        try:
            started = time.perf_counter()
            for job in live:
                self.observer.observe_queue_wait(started - job.enqueued)
            forward = self.encoder.lexical_tokenized if live[0].output == "lexical" else self.encoder.encode_tokenized
            encoded = forward(items, role)
            if len(encoded) != len(items):
                raise RuntimeError(f"encoder returned {len(encoded)} rows for {len(items)} texts")
            seconds = time.perf_counter() - started
            self.observer.observe_batch(role, len(items), len(items) * max(i.length for i in items), seconds)
            offset = 0
            with self.hand_on():
                for job in live:
                    rows = slice(offset, offset + len(job.items))
                    outcome = EncodeOutcome(encoded[rows], (started - job.enqueued) * 1000, seconds * 1000, len(items))
                    offset += len(job.items)
                    if job.then is None:
                        job.future.set_result(outcome)
                    else:
                        _hand_on(job, outcome)
        except Exception as exc:  # noqa: BLE001 - the worker must survive any forward failure
            log.exception("encoder forward failed (%d texts, role %s)", len(items), role)
            self.observer.count_batch_failure(role)
            message = f"encoding failed for this batch of {len(items)} texts: {type(exc).__name__}"
            for job in live:
                if not job.future.done():
                    job.future.set_exception(EncoderFailed(message))


def _hand_on(job: _Job, outcome: EncodeOutcome) -> None:
    """Start the job's next stage; if even that fails, the job fails, not the rest of its batch."""
    try:
        job.then(outcome, job.future)
    except Exception as exc:  # noqa: BLE001 - delivered to this job's caller
        if not job.future.done():
            job.future.set_exception(exc)

"""A deterministic encoder without weights, for batcher, index and API tests.

It is the benchmarks' :class:`HashEncoder` (hashed words, the real representation math) plus knobs
for fault and load tests: ``delay_s`` per forward, ``fail_when`` a predicate on the texts' token ids
that makes the forward raise, and ``batch_sizes``, the size of every forward so far.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from densehybrid.bench.servers.hash_encoder import HashEncoder
from densehybrid.encoder.base import Encoded, Role, TokenizedText


class FakeEncoderError(RuntimeError):
    """Raised by a fault-injected forward."""


class FakeEncoder(HashEncoder):
    model_prefix = "fake"

    def __init__(self, kind="dhr", *, delay_s: float = 0.0,
                 fail_when: Callable[[Sequence[TokenizedText]], bool] | None = None, **sizes):
        super().__init__(kind, **sizes)
        self.delay_s = delay_s
        self.fail_when = fail_when
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def encode_tokenized(self, items: Sequence[TokenizedText], role: Role) -> Encoded:
        with self._lock:
            self.batch_sizes.append(len(items))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_when is not None and self.fail_when(items):
            raise FakeEncoderError("injected forward failure")
        return super().encode_tokenized(items, role)

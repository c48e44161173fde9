"""Large index files copied in a stream, gently: read through one small buffer, hashed as written.

A fold copies a whole index, 1.5 GB of vectors at a million rows, beside searches that scan the
same rows. Read through a memory map, every 4 KB page of the source costs a page fault (about half
of the copy's CPU time at a million rows); written and then hashed for the manifest, every byte of
the result is read twice. So :func:`row_blocks` reads rows with ``readinto`` into one buffer small enough to stay in
the CPU cache, and :class:`HashingWriter` hashes each block while it is still there, writing it out
once. (It fsyncs once, at the end: an fdatasync every 64 MB cost the fold ~0.5 s more CPU at a
million rows, and the searches beside it read from the page cache, not the disk.)
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BLOCK_BYTES = 1 << 20  # fits a core's L2 cache: the hash and the write read the block from there


class HashingWriter:
    """A new file written front to back; :attr:`sha256` is the hex digest of what was written so far."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "wb")
        self._hash = hashlib.sha256()

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._file.write(view)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> str:
        """Flush, fsync and close -> the digest of the whole file."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        return self.sha256

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:  # a failed write leaves a partial file, which its caller's work directory holds
            self._file.close()


def row_blocks(stored: np.ndarray, runs: list[tuple[int, int]],
               block_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """The rows ``[start, stop)`` of each run of ``stored``, in blocks of at most ``block_bytes``.

    A whole memory map (``np.memmap``, ``np.load(mmap_mode="r")``, not a slice of one) is read from
    its file into one buffer that every block reuses: take each block before asking for the next.
    Any other array is sliced."""
    row_bytes = stored.dtype.itemsize * int(np.prod(stored.shape[1:], dtype=np.int64))
    rows_per_block = max(1, block_bytes // max(1, row_bytes))
    # only a map as opened starts at its ``offset`` (a slice of one keeps its parent's)
    opened_map = isinstance(stored, np.memmap) and isinstance(stored.base, mmap.mmap) and stored.filename
    if not (opened_map and stored.flags.c_contiguous):
        for start, stop in runs:
            for s in range(start, stop, rows_per_block):
                yield np.asarray(stored[s:min(stop, s + rows_per_block)])
        return
    buffer = np.empty((rows_per_block, *stored.shape[1:]), stored.dtype)
    with open(stored.filename, "rb", buffering=0) as f:
        for start, stop in runs:
            for s in range(start, stop, rows_per_block):
                block = buffer[:min(stop, s + rows_per_block) - s]
                f.seek(stored.offset + s * row_bytes)
                if f.readinto(memoryview(block).cast("B")) != block.nbytes:
                    raise OSError(f"{stored.filename}: ended before row {s + len(block)} (truncated while being read?)")
                yield block

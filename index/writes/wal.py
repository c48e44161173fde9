"""The write-ahead log of a live index: every acknowledged change, durable before it is acknowledged.

A log is a directory of segments ``00000001.log``, ``00000002.log``, ... Each segment is a
sequence of frames::

    length (u32, little-endian) | crc32 of payload (u32) | payload (length bytes)

and each payload one :class:`Change` (an upsert of a batch of encoded documents, or a
delete). :meth:`WriteAheadLog.append` writes one frame and fsyncs the file (and the
directory when it created the segment) before returning. Reading stops at the first frame
that is short or fails its checksum: the torn tail of a crash, which was never
acknowledged; :meth:`WriteAheadLog.open` cuts it off so that later frames follow whole ones.

Compaction rotates to a new segment (:meth:`rotate`), folds the older ones into a new index
generation, and deletes them (:meth:`drop_through`) only once that generation is durable.
A write that fails (a full disk) is rolled back to the frame boundary, so nothing half
written stays in the log.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from densehybrid.index.storage.documents import Document
from densehybrid.index.errors import IndexWriteError

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")
_HEADER_LEN = struct.Struct("<I")
_SEGMENT = re.compile(r"^(\d{8})\.log$")
# a frame longer than this is corrupt, not a real change (the service caps requests far below)
MAX_FRAME_BYTES = 1 << 30


class LogFullError(IndexWriteError):
    """The disk is full (ENOSPC/EDQUOT); the change was not logged and nothing of it remains."""


@dataclass(frozen=True)
class Change:
    """One logged change. ``upsert``: ``docs`` with ``values (n, dim)`` float32 and ``gates (n, G)`` uint8
    or None; ``delete``: ``docs`` holds the one id to delete (title and text empty)."""

    seq: int
    op: Literal["upsert", "delete"]
    docs: tuple[Document, ...]
    values: np.ndarray | None = None
    gates: np.ndarray | None = None


def encode_change(change: Change) -> bytes:
    """Change -> payload: a JSON header (length-prefixed), then the raw values and gates."""
    header = {"seq": change.seq, "op": change.op,
              "docs": [[d.id, d.title, d.text, *([d.fields] if d.fields else [])] for d in change.docs]}
    arrays = b""
    if change.values is not None:
        values = np.ascontiguousarray(change.values, dtype=np.float32)
        header["values_shape"] = list(values.shape)
        arrays += values.tobytes()
        if change.gates is not None:
            gates = np.ascontiguousarray(change.gates, dtype=np.uint8)
            header["gates_shape"] = list(gates.shape)
            arrays += gates.tobytes()
    head = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return _HEADER_LEN.pack(len(head)) + head + arrays


def decode_change(payload: bytes) -> Change:
    (head_len,) = _HEADER_LEN.unpack_from(payload)
    header = json.loads(payload[4:4 + head_len].decode("utf-8"))
    at = 4 + head_len
    values = gates = None
    if "values_shape" in header:
        shape = tuple(header["values_shape"])
        values = np.frombuffer(payload, np.float32, int(np.prod(shape)), at).reshape(shape)
        at += values.nbytes
        if "gates_shape" in header:
            gshape = tuple(header["gates_shape"])
            gates = np.frombuffer(payload, np.uint8, int(np.prod(gshape)), at).reshape(gshape)
    docs = tuple(Document(*d) for d in header["docs"])
    return Change(int(header["seq"]), header["op"], docs, values, gates)


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def read_frames(path: Path) -> tuple[list[bytes], int]:
    """The whole frames of a segment and the byte offset where they end (a torn tail starts there)."""
    data = path.read_bytes()
    payloads, at = [], 0
    while at + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, at)
        end = at + _FRAME.size + length
        if length > MAX_FRAME_BYTES or end > len(data):
            break
        payload = data[at + _FRAME.size:end]
        if zlib.crc32(payload) != crc:
            break
        payloads.append(payload)
        at = end
    return payloads, at


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Appends are serialized by a lock; each returns only when its frame is on disk."""

    def __init__(self, directory: Path, segments: list[int], changes: list[Change]):
        self.directory = directory
        self._segments = segments
        self.recovered = changes
        self._lock = threading.Lock()
        self._file = open(self._segment_path(segments[-1]), "ab")

    @classmethod
    def open(cls, directory: str | os.PathLike) -> WriteAheadLog:
        """Open (or create) the log in ``directory``; read every whole change and cut off a torn tail."""
        directory = Path(directory)
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if created:
            fsync_directory(directory.parent)
        numbers = sorted(int(m.group(1)) for p in directory.iterdir() if (m := _SEGMENT.match(p.name)))
        changes: list[Change] = []
        for number in numbers:
            path = directory / f"{number:08d}.log"
            payloads, end = read_frames(path)
            if end != path.stat().st_size:
                log.warning("%s: dropping a torn tail of %d bytes (a write that was never acknowledged)",
                            path, path.stat().st_size - end)
                with open(path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            changes.extend(decode_change(p) for p in payloads)
        if not numbers:
            numbers = [1]
            cls._create_segment(directory, 1)
        return cls(directory, numbers, changes)

    @staticmethod
    def _create_segment(directory: Path, number: int) -> None:
        with open(directory / f"{number:08d}.log", "xb") as f:
            os.fsync(f.fileno())
        fsync_directory(directory)

    def _segment_path(self, number: int) -> Path:
        return self.directory / f"{number:08d}.log"

    def size_bytes(self) -> int:
        return sum(self._segment_path(n).stat().st_size for n in self._segments if self._segment_path(n).exists())

    def append(self, change: Change) -> None:
        """Write one change and fsync; on failure truncate back so the log holds only whole frames."""
        data = frame(encode_change(change))
        with self._lock:
            start = self._file.tell()
            try:
                self._file.write(data)
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as exc:
                self._roll_back(start)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise LogFullError(f"{self.directory}: no space left for a {len(data)}-byte log record") from exc
                raise IndexWriteError(f"{self.directory}: cannot write the log ({exc})") from exc

    def _roll_back(self, start: int) -> None:
        """Drop what a failed write left (Python's buffer and the file's tail) back to ``start``."""
        path = self._file.name
        try:
            self._file.close()
        except OSError:
            pass  # the buffered bytes that could not be flushed are discarded with the handle
        with open(path, "r+b") as f:
            f.truncate(start)
            try:
                os.fsync(f.fileno())
            except OSError as exc:  # readers see the cut; after a crash the frame, whole or torn, is at most this one
                log.warning("%s: cannot fsync the roll-back to %d bytes (%s)", path, start, exc)
        self._file = open(path, "ab")

    def rotate(self) -> int:
        """Start a new segment; returns the number of the last closed one (fold it and those before)."""
        with self._lock:
            closed = self._segments[-1]
            self._create_segment(self.directory, closed + 1)
            self._file.close()
            self._segments.append(closed + 1)
            self._file = open(self._segment_path(closed + 1), "ab")
            return closed

    def drop_through(self, number: int) -> None:
        """Delete the segments up to ``number`` (their changes are in a durable index generation)."""
        with self._lock:
            for n in [n for n in self._segments if n <= number]:
                self._segment_path(n).unlink(missing_ok=True)
                self._segments.remove(n)
            fsync_directory(self.directory)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def iter_changes(directory: Path, through: int | None = None) -> Iterator[Change]:
    """Every whole change in a log directory (segments up to ``through``), read only."""
    numbers = sorted(int(m.group(1)) for p in Path(directory).iterdir() if (m := _SEGMENT.match(p.name)))
    for number in (n for n in numbers if through is None or n <= through):
        yield from (decode_change(p) for p in read_frames(Path(directory) / f"{number:08d}.log")[0])

"""The write-ahead log: round trip, torn tails dropped, a full disk leaves nothing half written."""

import errno
import os
import subprocess

import numpy as np
import pytest

from densehybrid.index.writes import wal
from densehybrid.index.storage.documents import Document
from densehybrid.index.writes.wal import Change, LogFullError, WriteAheadLog


def upsert(seq: int, n: int = 2, dim: int = 6, gated: int = 4, seed: int = 0) -> Change:
    rng = np.random.default_rng(seed + seq)
    docs = tuple(Document(f"d{seq}-{i}", f"title {i} é", f"text {seq} {i}") for i in range(n))
    return Change(seq, "upsert", docs, rng.standard_normal((n, dim)).astype(np.float32),
                  rng.integers(0, 255, (n, gated), dtype=np.uint8))


def same(a: Change, b: Change) -> bool:
    arrays_equal = all((x is None and y is None) or np.array_equal(x, y)
                       for x, y in ((a.values, b.values), (a.gates, b.gates)))
    return (a.seq, a.op, a.docs) == (b.seq, b.op, b.docs) and arrays_equal


def test_changes_round_trip_through_reopen(tmp_path):
    written = [upsert(1), Change(2, "delete", (Document("d1-0", "", ""),)), upsert(3, n=1)]
    log = WriteAheadLog.open(tmp_path / "wal")
    for change in written:
        log.append(change)
    log.close()
    recovered = WriteAheadLog.open(tmp_path / "wal").recovered
    assert len(recovered) == 3 and all(same(a, b) for a, b in zip(written, recovered))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_torn_last_frame_is_dropped_and_appends_continue(tmp_path, damage):
    log = WriteAheadLog.open(tmp_path / "wal")
    for seq in (1, 2, 3):
        log.append(upsert(seq))
    log.close()
    segment = tmp_path / "wal" / "00000001.log"
    data = bytearray(segment.read_bytes())
    whole_two = len(wal.frame(wal.encode_change(upsert(1)))) + len(wal.frame(wal.encode_change(upsert(2))))
    if damage == "truncate":
        del data[-7:]
    else:
        data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))

    log = WriteAheadLog.open(tmp_path / "wal")
    assert [c.seq for c in log.recovered] == [1, 2]
    assert segment.stat().st_size == whole_two  # the torn tail is gone from disk
    log.append(upsert(4))
    log.close()
    assert [c.seq for c in wal.iter_changes(tmp_path / "wal")] == [1, 2, 4]


def test_disk_full_rolls_back_to_the_last_whole_frame(tmp_path, monkeypatch):
    log = WriteAheadLog.open(tmp_path / "wal")
    log.append(upsert(1))
    size = log.size_bytes()
    real_fsync = os.fsync

    def full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log") and os.fstat(fd).st_size > size:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(LogFullError):
        log.append(upsert(2))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert log.size_bytes() == size
    log.append(upsert(3))
    log.close()
    assert [c.seq for c in wal.iter_changes(tmp_path / "wal")] == [1, 3]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only): a disk that really fills up."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the injected ENOSPC test covers the logic")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_real_full_disk(tiny_tmpfs):
    log = WriteAheadLog.open(tiny_tmpfs / "wal")
    acknowledged = []
    with pytest.raises(LogFullError):
        for seq in range(1, 1000):
            log.append(upsert(seq, n=4, dim=256, gated=128))
            acknowledged.append(seq)
    assert acknowledged  # some fit before the disk filled
    log.close()
    assert [c.seq for c in WriteAheadLog.open(tiny_tmpfs / "wal").recovered] == acknowledged


def test_rotate_and_drop_keep_only_unfolded_segments(tmp_path):
    log = WriteAheadLog.open(tmp_path / "wal")
    log.append(upsert(1))
    closed = log.rotate()
    log.append(upsert(2))
    log.drop_through(closed)
    log.close()
    assert [c.seq for c in WriteAheadLog.open(tmp_path / "wal").recovered] == [2]

"""Before a rename publishes a directory, every file in it is fsynced (and nothing else is opened)."""

import os

from densehybrid.index.storage import durable


def test_every_file_of_the_directory_is_fsynced(tmp_path, monkeypatch):
    for name in ("a.npy", "b.sqlite", "c"):
        (tmp_path / name).write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner").write_bytes(b"y")
    synced = []
    real = os.fsync

    def recording(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", recording)
    durable.fsync_files(tmp_path)
    assert sorted(synced) == ["a.npy", "b.sqlite", "c"]

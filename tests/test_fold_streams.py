"""A fold's copy: rows read through one reused buffer, files hashed while written, pauses bounded, and a
fold stopped mid-copy leaves the old generation serving and verifying."""

import hashlib

import numpy as np
import pytest

from densehybrid.index.building.build import build_from_arrays, encode_passages
from densehybrid.index.served import loading
from densehybrid.index.storage import documents, files
from densehybrid.index.storage.documents import Document, DocTable, write_docs, write_docs_folded
from densehybrid.index.storage.streams import HashingWriter, row_blocks
from densehybrid.index.storage.vectors import write_vectors
from densehybrid.index.writes import compaction
from densehybrid.index.writes.delta import Delta, delete, upsert
from densehybrid.index.writes.fold_pacing import FoldPacer

from support.fake_encoder import FakeEncoder


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_digest_computed_while_writing_is_the_written_files(tmp_path):
    rng = np.random.default_rng(0)
    with HashingWriter(tmp_path / "f") as f:
        for n in (0, 1, 4096, 100_003):
            f.write(rng.integers(0, 256, n, dtype=np.uint8))
        f.write(b"tail")
    assert f.close() == f.sha256 == sha256_of(tmp_path / "f")
    xb = rng.standard_normal((300, 16)).astype(np.float32)
    digest = write_vectors(tmp_path / "v", [xb[:7], xb[7:]], count=300, dim=16)
    assert digest == sha256_of(tmp_path / "v")


def random_runs(rng, count):
    dropped = np.sort(rng.choice(count, size=rng.integers(0, count // 2 + 1), replace=False)).astype(np.int64)
    return compaction.kept_runs(count, dropped)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_row_blocks_of_a_memory_map_are_its_rows_of_the_runs(tmp_path, dtype):
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 100, (257, 12)).astype(dtype)
    np.save(tmp_path / "rows.npy", rows)
    stored = np.load(tmp_path / "rows.npy", mmap_mode="r")
    sliced = stored[5:]  # a slice of a map keeps its parent's offset: it is sliced, not read from the file
    for _ in range(5):
        runs = random_runs(rng, len(stored))
        want = np.concatenate([rows[a:b] for a, b in runs] or [rows[:0]])
        for block_bytes in (1, 100, 10_000):
            got = [b.copy() for b in row_blocks(stored, runs, block_bytes)]  # blocks share a buffer: copy each
            assert all(b.nbytes <= max(block_bytes, rows[0].nbytes) for b in got)
            np.testing.assert_array_equal(np.concatenate(got or [rows[:0]]), want)
        runs = [(a, b) for a, b in runs if b <= len(sliced)]
        np.testing.assert_array_equal(np.concatenate([b.copy() for b in row_blocks(sliced, runs, 100)] or [rows[:0]]),
                                      np.concatenate([rows[5:][a:b] for a, b in runs] or [rows[:0]]))


def test_pauses_are_in_proportion_to_the_work_and_bounded():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    pacer = FoldPacer(share=0.25, max_pause_s=10.0, clock=lambda: now[0], sleep=sleep)
    out = []
    for item in pacer.paced(range(5)):
        out.append(item)
        now[0] += 1.0  # a second of work on each
    assert out == list(range(5))
    assert slept == [3.0, 3.0, 3.0, 1.0]  # three times the work at a quarter share, until 10 s are spent
    assert pacer.paused_s == 10.0 and pacer.pause_after(5.0) == 0.0
    assert FoldPacer(share=1.0, sleep=sleep).pause_after(2.0) == 0.0 and len(slept) == 4
    for share, pause in ((0, 1), (1.5, 1), (0.5, -1)):
        with pytest.raises(ValueError):
            FoldPacer(share, pause)


def test_the_document_table_folds_range_by_range(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "_FOLD_ROWS", 3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    docs = [Document(f"d{i}", f"t{i}", f"text {i}") for i in range(11)]
    write_docs(tmp_path / "a", docs)
    added = [Document("x", "tx", "text x")]
    ranges = []

    def pace(items):
        for item in items:
            ranges.append(item)
            yield item

    write_docs_folded(tmp_path / "b", tmp_path / "a" / "docs.sqlite", [1, 3, 4, 5, 10], added, pace)
    table = DocTable(tmp_path / "b" / "docs.sqlite")
    assert ranges == [0, 3, 6, 9]  # one range, 3..5, drops every row it holds
    assert list(table.iter_rows()) == [d for i, d in enumerate(docs) if i not in (1, 3, 4, 5, 10)] + added
    assert [r[0] for r in table._rows("SELECT row FROM docs ORDER BY row", ())] == list(range(7))


def index_with_writes(tmp_path, n=30):
    encoder = FakeEncoder("dhr")
    docs = [Document(f"b{i}", "", f"alpha beta {i}") for i in range(n)]
    base = loading.load_index(build_from_arrays(tmp_path / "index", encoder.spec,
                                              encode_passages(encoder, [d.text for d in docs], 16), docs))
    added = [Document("new", "", "gamma delta")]
    encoded = encode_passages(encoder, [d.text for d in added], 16)
    return base, upsert(delete(Delta(), base, "b3"), base, added, encoded.values, encoded.gates)


def test_a_paced_fold_publishes_a_generation_whose_manifest_hashes_verify(tmp_path):
    base, delta = index_with_writes(tmp_path)
    slept = []
    out = compaction.fold(base, delta, tmp_path / "index", applied_seq=2, pacer=FoldPacer(0.5, sleep=slept.append))
    manifest = loading.verify_index(out)
    assert {name: meta["sha256"] for name, meta in manifest["files"].items()} == \
           {p.name: sha256_of(p) for p in out.iterdir() if p.name != files.MANIFEST}
    assert loading.load_index(out).count == 30 and slept  # it paused


class Stopped(Exception):
    pass


def test_a_fold_stopped_mid_copy_leaves_the_old_generation(tmp_path):
    base, delta = index_with_writes(tmp_path)
    before = {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()}

    def stop(_seconds):  # the fold dies in its first pause: after one block of vectors is written
        raise Stopped

    with pytest.raises(Stopped):
        compaction.fold(base, delta, tmp_path / "index", applied_seq=2, pacer=FoldPacer(0.5, sleep=stop))
    assert {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()} == before
    loading.verify_index(tmp_path / "index")
    folded = loading.load_index(compaction.fold(loading.load_index(tmp_path / "index"), delta, tmp_path / "index",
                                              applied_seq=2))  # the next fold clears the unfinished one
    assert folded.count == 30 and folded.row_of("new") == 29 and folded.row_of("b3") is None
    assert not compaction.shards.work_dir(tmp_path / "index").exists()

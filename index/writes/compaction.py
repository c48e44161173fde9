"""Fold a live index's delta into a new generation, published the way builds are.

The live base rows (hidden ones dropped) and then the delta rows are written into
``<index>.partial/index/``, given a manifest that records the last folded log sequence number
(``writes.applied_seq``, so a restart never applies a change twice), fsynced, and renamed into place
by :func:`index.storage.durable.publish`. A crash at any point leaves either the old generation or the new
one, and the log still holds every change the new one lacks.

A server folds in a child process (:class:`FoldWorker`): the child rebuilds the delta from the
index and the closed log segments on disk, so the fold neither holds the server's GIL nor competes
with its request threads for the CPU (it runs niced). The child stays up between folds: starting
one per fold cost its imports (torch among them, ~1.7 s of CPU) every time, most of a fold's CPU,
and at low priority on a busy machine that stretched each fold to seconds while the delta grew.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from densehybrid.index import errors

from densehybrid.index.served import loading
from densehybrid.index.storage import durable, files

from densehybrid.index.building import ann, calibration, pqscan, shards
from densehybrid.index.building.first_stage import write_checked_vectors, write_first_stage
from densehybrid.index.engines import hnsw_engine, pqscan_engine
from densehybrid.index.served.local import IndexFiles
from densehybrid.index.storage.doc_ids import DocIds, encode as encode_ids
from densehybrid.index.storage.durable import fsync_files
from densehybrid.index.storage.documents import write_docs_folded
from densehybrid.index.storage.payload import Payload
from densehybrid.index.storage.payload_fold import folded_payload
from densehybrid.index.storage.streams import row_blocks
from densehybrid.index.storage.vectors import VECTORS, open_vectors
from densehybrid.index.writes import fold_pacing
from densehybrid.index.writes.fold_pacing import FoldPacer
from densehybrid.index.writes.wal import fsync_directory


def kept_runs(count: int, dropped: np.ndarray) -> list[tuple[int, int]]:
    """The [start, stop) runs of rows ``0..count-1`` left between the sorted row numbers ``dropped``."""
    starts = np.concatenate([[0], dropped + 1])
    stops = np.concatenate([dropped, [count]])
    return [(int(a), int(b)) for a, b in zip(starts, stops) if b > a]


def _blocks(stored: np.ndarray, runs: list[tuple[int, int]], added: np.ndarray | None):
    """The kept rows of ``stored`` in small blocks read from its file (``streams.row_blocks``), then ``added``."""
    yield from row_blocks(stored, runs)
    if added is not None and len(added):
        yield added


def _kept_ids(doc_ids: DocIds, runs: list[tuple[int, int]], added: list[str]) -> np.ndarray:
    """The stored keys of the kept runs, then the added ids': copied as arrays, never decoded."""
    return np.concatenate([doc_ids.keys[start:stop] for start, stop in runs] + [encode_ids(added)])


def _folded_graph(base: IndexFiles, staged: Path, keep: np.ndarray, count: int) -> tuple[dict, bool]:
    """The base's graph with the written rows added, its dropped rows dead nodes (or built anew, as the
    base's was: ``ann.fold_ann``) -> (the manifest's ``first_stage`` record, whether it was built anew)."""
    new_row_of = np.full(base.count, -1, np.int64)
    new_row_of[keep] = np.arange(len(keep))
    base_nodes = np.arange(base.ann.ntotal) if base.ann_rows is None else np.asarray(base.ann_rows)
    _, values = open_vectors(staged / VECTORS, count=count, dim=base.spec.dim, dtype=str(base.values.dtype))
    nodes = ann.folded_nodes(base_nodes, new_row_of, count)
    config = hnsw_engine.HNSWConfig.from_dict(base.manifest["first_stage"])
    rebuilt = ann.must_rebuild(nodes, values[len(keep):], config)
    return ann.fold_ann(values, staged, base.path, nodes, len(keep), config), rebuilt


def _folded_codes(base: IndexFiles, staged: Path, keep: np.ndarray, count: int) -> tuple[dict, bool]:
    """The base's product codes of the kept rows with the written rows encoded after them (or trained anew:
    ``pqscan.fold_pqscan``) -> (the manifest's ``first_stage`` record, whether trained anew)."""
    _, values = open_vectors(staged / VECTORS, count=count, dim=base.spec.dim, dtype=str(base.values.dtype))
    config = pqscan_engine.PQScanConfig.from_dict(base.manifest["first_stage"])
    return pqscan.fold_pqscan(values, staged, base.path, keep, len(keep), config), pqscan.must_retrain(count, config)


def fold(base: IndexFiles, delta, out: Path, applied_seq: int, pacer: FoldPacer | None = None) -> Path:
    """Write base (minus ``delta.hidden``) + ``delta`` rows as a new generation at ``out`` (replacing it).

    Everything is copied in bulk, never row by row in Python: the vectors (and gates) in blocks read
    from the stored files, the texts by SQLite from table to table, the ids as slices of their stored
    array and the payload as columns. Only the written rows pass through Python objects. The vectors
    are hashed while written (the manifest does not read them again) and, with a ``pacer``, copied
    with pauses that leave the searches beside the fold most of the time."""
    pace = pacer.paced if pacer is not None else iter
    out = Path(out)
    work = shards.work_dir(out)
    shutil.rmtree(work, ignore_errors=True)  # an interrupted earlier compaction
    staged = work / "index"
    staged.mkdir(parents=True)
    dropped = np.array(sorted(delta.hidden), dtype=np.int64)
    runs = kept_runs(base.count, dropped)
    written, values, gates = delta.live()  # dead (replaced or deleted) delta rows left out
    count = base.count - len(dropped) + len(written)
    spec = base.spec
    values_dtype = str(base.values.dtype)
    keep = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs] or [np.empty(0, np.int64)])
    added = None if values is None else np.asarray(values, dtype=values_dtype)
    digests = {VECTORS: write_checked_vectors(staged, pace(_blocks(base.values, runs, added)), count=count,
                                              dim=spec.dim, values_dtype=values_dtype)}
    first_stage = write_first_stage(staged, count=count, dim=spec.dim, values_dtype=values_dtype)
    rebuilt = False
    if hnsw_engine.is_hnsw(base.manifest["first_stage"]):
        first_stage, rebuilt = _folded_graph(base, staged, keep, count)
    if pqscan_engine.is_pqscan(base.manifest["first_stage"]):
        first_stage, rebuilt = _folded_codes(base, staged, keep, count)
    if "calibration" in base.manifest["first_stage"]:  # measured at build (stale once the first stage moved on)
        first_stage["calibration"] = calibration.after_fold(base.manifest["first_stage"]["calibration"],
                                                            len(written), len(dropped), rebuilt)
    if spec.gated_dim:
        shards.write_rows(staged / files.GATES, pace(_blocks(base.gates, runs, gates)), (count, spec.gated_dim),
                          np.uint8)
    files.write_doc_ids(staged, _kept_ids(base.doc_ids, runs, [d.id for d in written]))
    write_docs_folded(staged, base.docs.path, dropped, written, pace)
    schema = base.field_types
    if schema:  # the kept rows' columns, then the fields the written documents carried
        added_fields = Payload.from_rows(schema, [d.fields for d in written])
        folded_payload(schema, base.payload, keep, added_fields).write(staged)
    extra = {k: v for k, v in base.manifest.items() if k not in files.COMPUTED_MANIFEST_KEYS}
    files.write_manifest(staged, name=base.name, spec=spec, count=count, lam=base.lam,
                         first_stage=first_stage, values_dtype=values_dtype, digests=digests,
                         extra={**extra, "writes": {"applied_seq": applied_seq}})
    fsync_files(staged)
    fsync_directory(staged)
    durable.publish(staged, out, overwrite=True)
    fsync_directory(out.parent)
    shards.finish(work)
    return out


def fold_from_log(path: Path, log_dir: Path, through_segment: int, applied_seq: int,
                  pacer: FoldPacer | None = None) -> Path:
    """Fold the changes of log segments up to ``through_segment`` into the index at ``path``."""
    from densehybrid.index.writes.delta import replayed
    from densehybrid.index.writes.wal import iter_changes

    base = loading.load_index(path)
    already = int(base.manifest.get("writes", {}).get("applied_seq", 0))
    return fold(base, replayed(base, iter_changes(log_dir, through_segment), already), path, applied_seq, pacer)


def _exit_with_server(parent_pid: int, every_s: float = 0.2) -> None:
    """Exit as soon as the server is gone, mid-fold too: no orphan fold races a restarted server's.

    The child outlives the server thread that started it, so Linux's PR_SET_PDEATHSIG (which fires
    when that *thread* ends) would kill it after the first compaction; a watcher thread polls instead."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os._exit(1)

    if os.getppid() != parent_pid:  # the server died before this child got here
        raise SystemExit("the server that started this fold process is gone")
    threading.Thread(target=watch, name="densehybrid-fold-watch", daemon=True).start()


class FoldWorker:
    """A niced child process that folds on request (:func:`fold_from_log`), one fold at a time, paced
    (:class:`FoldPacer`: working at most ``share`` of the time, pausing at most ``max_pause_s`` a fold).

    Started on first use (or by :meth:`start`, ahead of the first fold) and kept for the next folds;
    a child that died is started anew by the next fold. Jobs and answers are JSON lines on its stdin
    and stdout; its stderr goes to a temporary file, quoted when the child fails."""

    def __init__(self, niceness: int = 10, share: float = fold_pacing.DEFAULT_SHARE,
                 max_pause_s: float = fold_pacing.DEFAULT_MAX_PAUSE_S):
        FoldPacer(share, max_pause_s)  # a bad value fails here, not in the child at the first fold
        self.niceness = niceness
        self.pacing = {"share": share, "max_pause_s": max_pause_s}
        self._child: subprocess.Popen | None = None
        self._stderr = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._started()

    def _started(self) -> subprocess.Popen:
        """(Under the lock.) The running child, started now if there is none."""
        if self._child is not None and self._child.poll() is None:
            return self._child
        self._discard()
        self._stderr = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "densehybrid.index.writes.compaction", str(os.getpid())]
        # niced from here, right after it starts (before its imports): a ``preexec_fn`` would make the
        # server fork rather than vfork, copying its page tables while holding the GIL, which stalls
        # every request thread (docs/performance.md, "What each change measured")
        self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                       text=True)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, self._child.pid, self.niceness)
        return self._child

    def fold(self, path: Path, log_dir: Path, through_segment: int, applied_seq: int) -> None:
        """:func:`fold_from_log` in the child; raises IndexWriteError (with the child's error) on failure."""
        job = {"path": str(path), "log_dir": str(log_dir), "through_segment": through_segment,
               "applied_seq": applied_seq, "pacing": self.pacing}
        with self._lock:
            child = self._started()
            try:
                child.stdin.write(json.dumps(job) + "\n")
                child.stdin.flush()
                answer = child.stdout.readline()
            except OSError:
                answer = ""
            if not answer:  # the child is gone: its exit status and stderr say why
                code = child.wait()
                raise errors.IndexWriteError(f"compaction of {path} failed (the fold process exited with "
                                             f"{code}): {self._stderr_tail()}")
            reply = json.loads(answer)
            if not reply.get("ok"):
                raise errors.IndexWriteError(f"compaction of {path} failed: {reply.get('error')}")

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode("utf-8", "replace")

    def _discard(self) -> None:
        if self._child is not None:
            for stream in (self._child.stdin, self._child.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(10)
            if self._child.poll() is None:
                self._child.kill()
                self._child.wait()
        if self._stderr is not None:
            self._stderr.close()
        self._child = self._stderr = None

    def close(self) -> None:
        """Let the child finish its fold, if any, and exit (end of its input)."""
        with self._lock:
            self._discard()


def _serve_folds(parent_pid: int) -> None:
    """The child's loop: one JSON job a line in, one JSON answer a line out, until its input ends."""
    _exit_with_server(parent_pid)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else writes to stdout (a library's progress) goes to stderr, not into the answers
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        try:
            fold_from_log(Path(job["path"]), Path(job["log_dir"]), int(job["through_segment"]),
                          int(job["applied_seq"]), FoldPacer(**job["pacing"]))
            reply = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - reported to the server, which keeps the log and retries
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve_folds(int(sys.argv[1]))

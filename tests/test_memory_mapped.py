"""An index is served from memory maps: its vectors are page cache the kernel may drop, not process memory.

So an index larger than the memory the server may use still opens and serves, pages coming from disk.
The first test shows the mechanism anywhere on Linux (the scan grows file-backed pages, not anonymous
memory); the second runs a search under a cgroup memory limit smaller than the index, where the test
creates a child of its own memory cgroup (a v1 memory controller or cgroup v2; it skips where it may not).
"""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pytest

from support.fake_encoder import FakeEncoder
from densehybrid.index.building.importing import import_pyserini

pytestmark = pytest.mark.slow  # writes a few hundred MB and scans them in a child process

COUNT, DIM = 400_000, 128  # 102 MB of float16 vectors
LIMIT = 512 * 2**20


def _large_index(root: Path, count: int = COUNT, dim: int = DIM) -> Path:
    source = root / "pyserini"
    source.mkdir()
    flat = faiss.IndexFlatIP(dim)
    rng = np.random.default_rng(3)
    for _ in range(count // 100_000):
        flat.add(rng.standard_normal((100_000, dim), dtype=np.float32))
    faiss.write_index(flat, str(source / "index"))
    del flat
    (source / "docid").write_text("".join(f"d{i}\n" for i in range(count)))
    out = import_pyserini(source, root / "ix", FakeEncoder("cls", dense_dim=dim).spec)
    (source / "index").unlink()
    return out


# the child: open, measure, search (a full exact scan), measure; prints JSON
_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from densehybrid.encoder.base import Encoded
    from densehybrid.index.search.params import SearchParams
    from densehybrid.index.served.loading import load_index

    def status():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}

    before = status()
    index = load_index(sys.argv[1])
    opened = status()
    xq = np.random.default_rng(0).standard_normal((1, index.spec.dim)).astype(np.float32)
    found = index.search(Encoded(xq, None), SearchParams(k=10))
    want = np.argsort(-(np.asarray(index.values[:], np.float32) @ xq[0]), kind="stable")[:10] if len(sys.argv) < 3 else None
    print(json.dumps({"before": before, "opened": opened, "searched": status(), "rows": found.rows[0],
                      "want": None if want is None else want.tolist()}))
""")


def _run_child(index_dir: Path, *extra: str, preexec=None) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(index_dir), *extra], capture_output=True, text=True,
                          timeout=300, preexec_fn=preexec)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_full_scan_reads_file_pages_not_process_memory(tmp_path):
    index_dir = _large_index(tmp_path)
    vector_bytes = COUNT * DIM * 2
    seen = _run_child(index_dir)
    anon = seen["searched"]["RssAnon"] - seen["before"]["RssAnon"]
    mapped = seen["searched"]["RssFile"] - seen["opened"]["RssFile"]
    assert mapped > vector_bytes // 2, seen  # the scan read the vectors through the file's pages ...
    # ... and neither opening nor searching copied them (a copy is >= vector_bytes; the id list takes ~30 MB)
    assert anon < vector_bytes // 2, seen
    assert seen["rows"] == seen["want"]


@dataclass(frozen=True)
class _MemoryFiles:
    """The files of a memory cgroup, by cgroup version: the limit, its swap companion and the peak."""

    limit: str
    swap: str
    peak: str


_V1 = _MemoryFiles("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max_usage_in_bytes")
_V2 = _MemoryFiles("memory.max", "memory.swap.max", "memory.peak")


def _own_memory_cgroup() -> tuple[Path, _MemoryFiles] | None:
    """This process's memory cgroup, where it may make a child: a v1 memory controller or a pure cgroup v2."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory"]
    if v1:
        group, files = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/"), _V1
    elif lines and all(line.startswith("0::") for line in lines):
        group, files = Path("/sys/fs/cgroup") / lines[0][3:].lstrip("/"), _V2
        controllers = group / "cgroup.controllers"
        if not controllers.exists() or "memory" not in controllers.read_text().split():
            return None
    else:
        return None
    return (group, files) if (group / files.limit).exists() and os.access(group, os.W_OK) else None


def test_an_index_larger_than_the_memory_limit_serves(tmp_path):
    found = _own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup (v1 controller or v2) where this process may make a child")
    group, files = found
    index_dir = _large_index(tmp_path, count=1_200_000, dim=384)  # 922 MB of float16 vectors
    child = group / f"densehybrid-test-{os.getpid()}"
    child.mkdir()
    try:
        # the child's own memory (interpreter, numpy, faiss: ~200 MB) fits; the vectors do not, beside it
        (child / files.limit).write_text(str(LIMIT))
        if (child / files.swap).exists():  # no swap beyond the limit (v1 counts memory + swap, v2 swap alone)
            (child / files.swap).write_text(str(LIMIT) if files is _V1 else "0")
        seen = _run_child(index_dir, "no-brute-force",
                          preexec=lambda: (child / "cgroup.procs").write_text(str(os.getpid())))
        assert len(seen["rows"]) == 10
        assert int((child / files.peak).read_text()) <= LIMIT if (child / files.peak).exists() else True
    finally:
        child.rmdir()

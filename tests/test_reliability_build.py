"""A build SIGKILLed anywhere never publishes a corrupted index, and resuming it gives the same index.

Kill points: every file-system operation of a small build (the child kills itself just before
operation n, for every n), plus builds killed from outside after random delays. After each kill the
target directory is either absent or a complete index equal to an uninterrupted build; resuming then
finishes it, again equal. (tests/test_build.py has the single kill-after-three-shards case.)
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from support.index_files import index_files
from densehybrid.index.building import shards
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.errors import IndexLoadError, IndexWriteError
from densehybrid.index.served.loading import load_index

from support.fake_encoder import FakeEncoder

pytestmark = pytest.mark.slow  # kills builds at every file operation

REPO = Path(__file__).resolve().parents[1]
KILLER = Path(__file__).with_name("reliability_build_killer.py")
OPTIONS = BuildOptions(batch_size=4, shard_size=8, progress=False, name="same", resume=True)
DOCUMENTS = 44  # six shards, the last one short


def write_corpus(path: Path) -> Path:
    rng = random.Random(7)
    words = [f"term{i}" for i in range(300)]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(DOCUMENTS):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(words, k=rng.randint(2, 20)))})
                    + "\n")
    return path


def run_killer(corpus: Path, root: Path, plan: list[dict]) -> list[dict]:
    done = subprocess.run([sys.executable, str(KILLER), str(corpus), str(root), json.dumps(plan)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def assert_published_whole_or_absent(out: Path, reference: dict[str, bytes]) -> None:
    if out.exists():
        load_index(out)  # manifest, sizes, checksums, shapes
        assert index_files(out) == reference
    assert not any(p.name.startswith(out.name) and p != out and not p.name.endswith(".partial")
                   for p in out.parent.iterdir()), sorted(p.name for p in out.parent.iterdir())


def resume_and_check(out: Path, corpus: Path, reference: dict[str, bytes]) -> None:
    if out.exists():  # killed after the publishing rename: done; a second build refuses to clobber it
        with pytest.raises(IndexWriteError, match="already exists"):
            build_index(FakeEncoder("dhr"), corpus, out, OPTIONS)
    else:
        with pytest.raises(IndexLoadError):
            load_index(out)  # what a server given this path would do: refuse, clearly
        build_index(FakeEncoder("dhr"), corpus, out, OPTIONS)
        assert not shards.work_dir(out).exists()
    assert index_files(out) == reference


@pytest.fixture(scope="module")
def build_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("killed-builds")
    corpus = write_corpus(root / "corpus.jsonl")
    reference_dir = build_index(FakeEncoder("dhr"), corpus, root / "reference", OPTIONS)
    return root, corpus, index_files(reference_dir)


def test_build_killed_before_every_file_operation_never_publishes_a_broken_index(build_case):
    root, corpus, reference = build_case
    [counted] = run_killer(corpus, root / "count", [{"count": True}])
    operations = counted["operations"]
    assert counted["exit"] == 0 and operations > 6 * 5  # each shard alone takes several writes and a rename
    results = run_killer(corpus, root / "events", [{"event": n} for n in range(1, operations + 1)])
    assert len(results) == operations
    published_early = 0
    for result in results:
        out = Path(result["out"])
        assert result["killed"], result
        assert_published_whole_or_absent(out, reference)
        published_early += out.exists()
        resume_and_check(out, corpus, reference)
    assert published_early <= 3  # only kills after the publishing rename find a published index


def test_build_killed_at_random_times_resumes_to_the_same_index(build_case):
    root, corpus, reference = build_case
    [whole] = run_killer(corpus, root / "timed", [{"count": True, "delay_s": 0.01}])
    rng = random.Random(2026)
    plan = [{"after_s": round(rng.uniform(0.0, whole["seconds"]), 4), "delay_s": 0.01} for _ in range(10)]
    results = run_killer(corpus, root / "random", plan)
    assert sum(r["killed"] for r in results) >= 5, results  # most of them died mid-build
    for result in results:
        out = Path(result["out"])
        assert_published_whole_or_absent(out, reference)
        if not result["killed"]:
            assert result["exit"] == 0 and out.exists()
        resume_and_check(out, corpus, reference)

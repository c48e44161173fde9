"""A fold rewrites the index: the builder's manifest entries (fusion default, λ choice, prompts) survive it."""

from __future__ import annotations

from densehybrid.bench.servers.hash_encoder import HashEncoder
from densehybrid.bench.servers.toy_index import write_toy_corpus
from densehybrid.index.storage import files
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.writes.compaction import fold
from densehybrid.index.writes.delta import Delta
from densehybrid.index.served.loading import load_index


def test_a_fold_keeps_the_builders_manifest_entries(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus.jsonl", 30)
    built = build_index(HashEncoder("fusion"), corpus, tmp_path / "index",
                        BuildOptions(progress=False, batch_size=16, fusion_method="zscore"))
    base = load_index(built)
    assert base.fusion_method == "zscore"

    folded = load_index(fold(base, Delta(hidden=frozenset({0, 1})), tmp_path / "gen", applied_seq=3))

    assert folded.count == 28 and folded.fusion_method == "zscore"
    builders = {k: v for k, v in base.manifest.items() if k not in files.COMPUTED_MANIFEST_KEYS}
    assert "fusion" in builders
    assert {k: v for k, v in folded.manifest.items() if k in builders} == builders
    assert folded.manifest["writes"] == {"applied_seq": 3}

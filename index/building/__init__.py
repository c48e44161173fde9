"""Making an index: build from a corpus, Pyserini import, shards and first-stage writers, the mix from the corpus."""

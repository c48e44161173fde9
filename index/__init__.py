"""The index layer, in floors that import only downward (an import-linter contract in pyproject.toml):
``storage`` (the files of an index) at the ground; ``search`` (the searcher, GIP and fusion math, filters, the
``ServedIndex`` protocol) and ``engines`` (one per first stage) on it; then ``served`` (a local directory, a
Milvus collection), ``building`` and ``writes`` (the live index) at the top."""

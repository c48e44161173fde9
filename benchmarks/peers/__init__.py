"""The same work beside another system.

- ``encode``: /encode and /search under many clients beside infinity-emb (``infinity``: its own
  environment and server); ``python -m densehybrid.bench.peers.encode``;
- ``milvus_parity``: Milvus against the local index on judged queries;
- ``graphs``: our HNSW graph beside hnswlib and usearch on a sample of a real index's rows (build, memory,
  recall and latency unfiltered and filtered, adding rows); ``python -m densehybrid.bench.peers.graphs``.
"""

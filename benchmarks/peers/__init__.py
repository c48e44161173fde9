"""The same work beside another system.

- ``encode``: /encode and /search under many clients beside infinity-emb (``infinity``: its own
  environment and server); ``python -m densehybrid.bench.peers.encode``;
- ``milvus_parity``: Milvus against the local index on judged queries.
"""

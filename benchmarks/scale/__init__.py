"""Millions of rows.

- ``run``: ``densehybrid bench --scale N``: ``search`` (N seeded rows imported, flat against the HNSW
  first stage: recall and latency), then ``serve`` (a real query encoder over them, over HTTP), then
  ``report`` (table, JSON, plot); ``vectors`` draws the rows, ``pyserini_layout`` writes them;
- ``fold``: a fold at scale, each phase timed (``python -m densehybrid.bench.scale.fold``);
- ``ids``: the id list's open and first lookup at N ids (``python -m densehybrid.bench.scale.ids``);
- ``scan_threads``: a pqscan query's code scan spread over threads, latency alone and throughput under
  concurrent clients (``python -m densehybrid.bench.scale.scan_threads``).
"""

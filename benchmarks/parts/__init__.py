"""One part's cost.

- ``memory``, ``search``, ``encoder``: the ``memory``, ``search`` and ``encoder`` sections of
  ``densehybrid bench`` (read bandwidth; first stage and rerank; encoder forwards);
- ``first_stage``: where a batch-1 torch first stage spends its time, part by part;
- ``filters``: filtered search against unfiltered; ``int8_gate``: int8 encoding's retrieval quality;
- ``tracing``: what tracing costs a request under load.
"""

"""Performance benchmarks (docs/performance.md): ``densehybrid bench``, also ``python -m densehybrid.bench``.

At the top, the run: ``cli`` (its flags), ``config`` (the presets), ``runner`` (the sections in order),
``report`` (the table and the JSON), ``targets`` (the measured targets), ``timing`` (percentiles). Each
room is what a user measures:

- ``load/``: a live server under many clients (the ``service`` section, ``densehybrid loadtest``, writes,
  the balancer's rate limit), with the one closed-loop client and the wrk driver;
- ``scale/``: millions of rows (``densehybrid bench --scale``, folds and the id list at scale);
- ``peers/``: the same work beside another system (infinity-emb, Milvus);
- ``parts/``: one part's cost (memory bandwidth, first stage and rerank, encoders, filters, int8, tracing);
- ``servers/``: the server under test, started one way, and the weightless encoder and toy index it serves;
- ``gpu/``: the lent GPU machine's one-command run and its results file.
"""

"""A live server under many clients.

- ``service``: the ``service`` section of ``densehybrid bench``: /search and /encode at each client count
  over a random model and index, beside the same work in process;
- ``latency``: the same table for an index of your own (``python -m densehybrid.bench.load.latency``);
- ``loadtest``: ``densehybrid loadtest``: saturation, open-loop latency, shedding and a soak;
- ``writes``: search latency while writes stream in (``python -m densehybrid.bench.load.writes``);
- ``rate_limit``: goodput through the balancer with and without its rate limit;
- ``client``: the closed-loop HTTP client they drive servers with; ``wrk``: the wrk driver of the peer
  benchmarks; ``workloads``: the request bodies they send; ``probe``: what a load test reads of the
  server process (its histograms, its memory).
"""

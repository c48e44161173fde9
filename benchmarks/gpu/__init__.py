"""The lent GPU machine's one-command run (``benchmarks/gpu/gpu_run.sh``) and ``results``, its one file."""

"""``python -m densehybrid.bench``: the same command as ``densehybrid bench``."""

from densehybrid.bench.cli import main

main()

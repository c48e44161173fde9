"""``python -m densehybrid.bench [--quick|--full] [--out FILE] [--only SECTION ...]``."""

from densehybrid.bench.cli import main

main()

"""``python -m benchmarks [--quick|--full] [--out FILE] [--only SECTION ...]``."""

from benchmarks.cli import main

main()

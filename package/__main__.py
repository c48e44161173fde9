"""``python -m densehybrid`` is the ``densehybrid`` command."""

from densehybrid.cli.main import main

main()

"""``python -m densehybrid`` is the ``densehybrid`` command."""

from densehybrid.cli.launcher import main

main()

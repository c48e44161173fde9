"""The ``densehybrid`` command line: flags in, tables out (the work is in service, index and encoder)."""

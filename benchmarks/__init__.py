"""Performance benchmarks (DESIGN §8, issue 6): ``python -m densehybrid.bench`` or ``densehybrid bench``."""

"""Performance benchmarks (docs/performance.md): ``python -m densehybrid.bench`` or ``densehybrid bench``."""

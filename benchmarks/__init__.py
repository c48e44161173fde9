"""Performance benchmarks (DESIGN §8, issue 6): ``python -m benchmarks`` or ``densehybrid bench``."""

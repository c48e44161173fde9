"""The live index: the write-ahead log, the delta, search over base and delta, and the fold (compaction)."""

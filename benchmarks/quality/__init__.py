"""Quality benchmarks: measured on judged queries, never on the data a choice was tuned on."""

"""Search over a stored index: first stage, rerank and top-k with timings; GIP and fusion math; filters."""

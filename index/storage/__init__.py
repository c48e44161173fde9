"""The ground: an index's files (layout and manifest, vectors, ids, texts, payload columns, durable publishing)."""

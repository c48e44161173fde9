"""Text -> Aggretriever / DHR / DLR / fusion / [CLS] vectors (docs/concepts.md)."""

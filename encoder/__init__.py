"""Text -> Aggretriever / DHR / DLR / fusion / [CLS] vectors (DESIGN §1–§3)."""

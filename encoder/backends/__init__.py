"""Encoder backends: torch (real checkpoints), onnx, and a deterministic fake for tests."""

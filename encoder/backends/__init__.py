"""Encoder backends behind one interface: torch (as loaded) and ONNX Runtime."""

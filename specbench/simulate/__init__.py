"""Replay without the model: the offline acceptance simulator, model-free drafters over conversation logs and
recorded outputs, and token trees against paths."""

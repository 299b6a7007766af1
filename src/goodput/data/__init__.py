"""Data pipeline: remote cache, sharded and folder datasets (and, from other modules, the resumable loader)."""

__all__: list[str] = []

"""Warm restarts: the agent that replaces only a failed worker with a hot spare, the worker's side of the
hand-over, the RNG record each rank keeps, and how spares start (collector held, idle priority)."""

__all__: list[str] = []

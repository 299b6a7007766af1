"""Checks that a resumed run is the same run: each step's records, their comparison, and verify-resume for
the demo and for a user's script. The library itself never imports this package."""

__all__: list[str] = []

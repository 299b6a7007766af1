"""Helpers for goodput's tests and benchmarks: a real S3 server on 127.0.0.1, free ports."""

from __future__ import annotations

from goodput.testing.dist import run_ranks
from goodput.testing.seaweed import S3Server, free_port

__all__ = ["S3Server", "free_port", "run_ranks"]

"""Capture and restore every random number generator a training step can draw from.

The captured state is a small JSON-able dict (python ``random``, numpy's global generator, torch's CPU
generator and every CUDA device's), so it can travel through a checkpoint without pickling and be restored by
``torch.load(weights_only=True)`` or plain JSON.

A rank that the saving run did not have (a job resumed on more ranks) has no saved state to restore; its RNGs
are seeded by :func:`seed_new_rank` from :func:`rank_seed` ``(seed, rank, step)``: a pure function of the run's
seed, the rank and the restored step, so a rank that joins at the same step of the same run always draws the
same streams, and two new ranks never share one.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "rank_seed", "restore_rng", "seed_new_rank"]

_M64 = (1 << 64) - 1


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """The state of every RNG of this process, as a JSON-able dict."""
    version, internal, gauss = random.getstate()
    np_kind, np_key, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [np_kind, [int(x) for x in np_key], int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put every RNG back to a state returned by :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a new rank's RNGs: splitmix64 over (seed, rank, step), a non-negative int below 2**63.

    Args:
        seed: the run's seed (``TrainingState(seed=...)``, else the data loader's seed, else 0).
        rank: the new rank.
        step: the step the run resumes from.
    """
    acc = 0x6E6577_72616E6B  # "newrank": keeps these seeds apart from other uses of the same triple
    for part in (seed, rank, step):
        acc = _splitmix(acc ^ (int(part) & _M64))
    return acc >> 1


def seed_new_rank(seed: int, rank: int, step: int) -> int:
    """Seed python's, numpy's and torch's (CPU and every CUDA device's) generators from :func:`rank_seed`.

    Returns:
        The seed used (python and torch get it whole, numpy its low 32 bits).
    """
    value = rank_seed(seed, rank, step)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    torch.manual_seed(value)  # also seeds every CUDA device
    return value

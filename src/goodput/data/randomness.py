"""Random generators that depend only on what they are for, never on workers, ranks or restarts.

Two kinds:

* :func:`sample_rng` / :func:`sample_np_rng`: one generator per sample, a pure function of (sample index,
  epoch, the loader's seed). Draw augmentations from it and they are the same whichever worker or rank loads
  the sample and wherever the run was resumed. ``ResumableLoader`` hands datasets with a ``get_seeded(index,
  seed)`` method the per-sample seed; ``torch.Generator().manual_seed(seed)`` there is the same generator as
  ``sample_rng(index, epoch, loader_seed)``.
* :func:`loader_seed`: the seed of the DataLoader's own generator for one rank's epoch, so that creating a
  DataLoader iterator never draws from torch's global generator (torch's DataLoader draws the workers' base
  seed from it when it has no generator: a resumed run's training stream would be one draw ahead) and the
  workers' seeds are a pure function of (seed, epoch, rank).
"""

from __future__ import annotations

import numpy as np
import torch

from goodput.data.order import _mix_int, sample_seed

__all__ = ["loader_seed", "sample_np_rng", "sample_rng"]

_LOADER_STREAM = 0x10AD


def sample_rng(index: int, epoch: int, seed: int) -> torch.Generator:
    """A torch CPU generator for sample ``index`` in ``epoch``, seeded from :func:`~goodput.data.sample_seed`.

    Args:
        index: the sample's index in the dataset.
        epoch: the epoch it is drawn in (so each epoch augments differently).
        seed: the loader's seed.
    """
    return torch.Generator().manual_seed(sample_seed(seed, epoch, index))


def sample_np_rng(index: int, epoch: int, seed: int) -> np.random.Generator:
    """A numpy generator for sample ``index`` in ``epoch`` (same seed as :func:`sample_rng`)."""
    return np.random.default_rng(sample_seed(seed, epoch, index))


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of rank ``rank``'s DataLoader generator in ``epoch`` (non-negative, below 2**63)."""
    return _mix_int(seed, epoch, rank, _LOADER_STREAM) >> 1

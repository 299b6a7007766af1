"""goodput: keep PyTorch training productive when hardware fails.

The public names (``goodput._api``) are imported on first use, so ``import goodput`` (and the command line)
stays fast while ``goodput.Run`` or ``goodput.CheckpointManager`` pull in torch only when touched. Type
checkers read the same names from ``__init__.pyi``.
"""

from __future__ import annotations

from goodput._api import ON_TOUCH, PUBLIC
from goodput._lazy import lazy_names

__version__ = "0.1.0"

__all__ = ["__version__", *sorted(PUBLIC)]

__getattr__, __dir__ = lazy_names(__name__, {**PUBLIC, **ON_TOUCH}, globals(), __all__)

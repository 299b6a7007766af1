"""goodput: keep PyTorch training productive when hardware fails.

The public names (``goodput._api``) are imported on first use, so ``import goodput`` (and the command line)
stays fast while ``goodput.Run`` or ``goodput.CheckpointManager`` pull in torch only when touched. Type
checkers read the same names from ``__init__.pyi``.
"""

from __future__ import annotations

import importlib
from typing import Any

from goodput._api import ON_TOUCH, PUBLIC

__version__ = "0.1.0"

__all__ = ["__version__", *sorted(PUBLIC)]


def __getattr__(name: str) -> Any:
    module = PUBLIC.get(name) or ON_TOUCH.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""An object whose unpickling would run code: what the tests that nothing a checkpoint or a hand-over holds
runs plant in it."""

from __future__ import annotations

import os
from typing import Any


class Planted:
    """Unpickling it would create the folder named ``path`` (a test checks that folder is never there)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))

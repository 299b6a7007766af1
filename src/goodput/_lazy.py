"""Names a package imports on first use, so importing the package stays fast: ``import goodput`` (and the command
line) or ``import goodput.data`` (a cache reader, a spawned helper) pulls in torch only with the first name
that needs it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, table: Mapping[str, str], namespace: dict[str, Any], listed: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` over ``table`` (name -> the module that defines it).

    Args:
        package: the package's name, for the AttributeError of a name it does not have.
        table: the names imported on first use, each with its module.
        namespace: the package's ``globals()``, where a name's value is kept once imported.
        listed: the names ``dir()`` shows besides the namespace's (the package's ``__all__``).
    """
    listed = list(listed)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(listed))

    return __getattr__, __dir__

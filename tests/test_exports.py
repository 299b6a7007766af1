"""Every public module's __all__ is reachable from the goodput package (httpx's test_exported_members)."""

from __future__ import annotations

import importlib
import pkgutil

import goodput

_PRIVATE_OR_TOOLING = ("goodput.cli", "goodput.testing", "goodput.bench", "goodput.demo", "goodput.__main__")


def _public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(goodput.__path__, "goodput."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        if info.name.startswith(_PRIVATE_OR_TOOLING):
            continue
        names.append(info.name)
    return names


def test_every_public_name_is_exported() -> None:
    missing = []
    for name in _public_modules():
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for member in module.__all__:
            if getattr(goodput, member, None) is not getattr(module, member):
                missing.append(f"{name}.{member}")
    assert missing == []


def test_package_all_names_exist() -> None:
    for member in goodput.__all__:
        assert hasattr(goodput, member), member

"""Every public name is reachable from the goodput package (httpx's test_exported_members).

A public module is a top-level module or a part's package (``goodput.ledger``, ``goodput.run``, ...) and the
modules a part's ``__init__`` does not hide: inside a part, the part's ``__init__`` says what is public, so
its own modules need no leading underscore; their ``__all__`` must still be reachable from ``goodput``.
"""

from __future__ import annotations

import importlib
import pkgutil

import goodput

_PRIVATE_OR_TOOLING = ("goodput.cli", "goodput.testing", "goodput.bench", "goodput.demo", "goodput.__main__")
# The rooms made by the #22 moves keep their modules internal: what is public there is exported by name.
_INTERNAL_ROOMS = ("goodput.launch.", "goodput.warm.", "goodput.verify.", "goodput.checkpoint.memory.")


def _public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(goodput.__path__, "goodput."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        if info.name.startswith(_PRIVATE_OR_TOOLING + _INTERNAL_ROOMS):
            continue
        names.append(info.name)
    return names


def test_every_public_name_is_exported() -> None:
    missing = []
    for name in _public_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # an integration whose optional framework is not installed
            if name.startswith("goodput.integrations.") and not (err.name or "").startswith("goodput"):
                continue
            raise
        for member in getattr(module, "__all__", ()):
            if getattr(goodput, member, None) is not getattr(module, member):
                missing.append(f"{name}.{member}")
    assert missing == []


def test_parts_and_leaves_declare_their_api() -> None:
    """Each part's package and each top-level module says what is public."""
    for name in _public_modules():
        if name.count(".") == 1:
            assert hasattr(importlib.import_module(name), "__all__"), f"{name} has no __all__"


def test_package_all_names_exist() -> None:
    for member in goodput.__all__:
        assert hasattr(goodput, member), member


def test_former_module_names_still_export_what_they_did() -> None:
    """goodput.ledger and goodput.planning were modules; their packages keep every name."""
    import goodput.ledger
    import goodput.planning

    for name in ("Ledger", "LedgerConfig", "LedgerFile", "ledger_files", "read_events"):
        assert name in goodput.ledger.__all__
    for name in ("PlanInputs", "goodput_daly", "optimal_interval", "young_interval", "mtbf_seconds"):
        assert name in goodput.planning.__all__

"""The public API of ``goodput`` is the list below, declared once in ``goodput._api`` (httpx's
test_exported_members, turned around): adding or removing a public name changes this file, a visible decision.

Run ``python tests/test_exports.py`` to rewrite ``src/goodput/__init__.pyi`` after changing ``goodput._api``.
"""

from __future__ import annotations

import importlib
import os
import sys

import goodput
from goodput._api import ON_TOUCH, PUBLIC

FROZEN = [
    "AccessRefused",
    "ArrowDataset",
    "CacheConfig",
    "CheckpointConfig",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "Costs",
    "CrashLoop",
    "DataError",
    "DevicePrefetcher",
    "Fault",
    "FaultPlan",
    "FingerprintMismatch",
    "FolderDataset",
    "GoodputError",
    "Ledger",
    "LedgerConfig",
    "MDSDataset",
    "MLflowExporter",
    "MemoryTier",
    "MetricsExporter",
    "NoValidCheckpoint",
    "NumericConfig",
    "NumericFault",
    "ParquetDataset",
    "PlanInputs",
    "Report",
    "ResumableLoader",
    "Run",
    "RunHook",
    "SaveFailed",
    "ShardedDataset",
    "StateMismatch",
    "StorageError",
    "StragglerConfig",
    "StragglerStop",
    "TensorBoardExporter",
    "TokenDataset",
    "TrainingState",
    "WebDataset",
    "__version__",
    "account",
    "available_exporters",
    "build_report",
    "format_duration",
    "goodput_daly",
    "init_distributed",
    "list_checkpoints",
    "load_report",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "parse_faults",
    "rank_seed",
    "read_events",
    "sample_np_rng",
    "sample_rng",
    "sample_seed",
    "simulate_goodput",
    "young_interval",
]

STUB = os.path.join(os.path.dirname(__file__), "..", "src", "goodput", "__init__.pyi")


def _import_order(item: tuple[str, str]) -> tuple[str, int, str]:
    """isort's order (as ruff applies it): by module, then constants, classes, functions, each case-blind."""
    name, module = item
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return module, kind, name.lower()


def stub_text() -> str:
    """``goodput/__init__.pyi`` as ``goodput._api`` declares it."""
    lines = [
        '"""Generated from goodput._api by tests/test_exports.py: the names type checkers see in goodput."""',
        "",
    ]
    for name, module in sorted({**PUBLIC, **ON_TOUCH}.items(), key=_import_order):
        lines.append(f"from {module} import {name} as {name}")
    lines += ["", '__version__: str = "0.1.0"', "", "__all__ = ["]
    lines += [f'    "{name}",' for name in sorted(["__version__", *PUBLIC])]
    lines += ["]", ""]
    return "\n".join(lines)


def test_the_public_api_is_the_frozen_list() -> None:
    assert sorted(goodput.__all__) == sorted(FROZEN)


def test_every_name_in_all_resolves_to_its_module_s_object() -> None:
    for name in goodput.__all__:
        if name == "__version__":
            continue
        assert getattr(goodput, name) is getattr(importlib.import_module(PUBLIC[name]), name), name


def test_the_integrations_resolve_only_when_touched() -> None:
    assert not set(ON_TOUCH) & set(goodput.__all__)
    for name, module in ON_TOUCH.items():
        try:
            value = getattr(goodput, name)
        except ModuleNotFoundError as err:  # the integration's optional framework is not installed
            assert not (err.name or "").startswith("goodput"), err
            continue
        assert value is getattr(importlib.import_module(module), name)


def test_the_type_stub_declares_the_same_names() -> None:
    with open(STUB) as f:
        assert f.read() == stub_text(), "goodput/__init__.pyi is stale: run python tests/test_exports.py"


def test_former_module_names_still_export_what_they_did() -> None:
    """goodput.ledger and goodput.planning were modules; their packages keep every name."""
    import goodput.ledger
    import goodput.planning

    for name in ("Ledger", "LedgerConfig", "LedgerFile", "ledger_files", "read_events"):
        assert name in goodput.ledger.__all__
    for name in ("PlanInputs", "goodput_daly", "optimal_interval", "young_interval", "mtbf_seconds"):
        assert name in goodput.planning.__all__


if __name__ == "__main__":
    with open(STUB, "w") as f:
        f.write(stub_text())
    print(f"wrote {os.path.normpath(STUB)}", file=sys.stderr)

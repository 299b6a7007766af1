"""``goodput ls DIR_OR_URL``: one row per checkpoint (step, saved at, size, strategy, ranks, status and why).

goodput's ``step-N`` folders, and a Hugging Face Trainer's ``checkpoint-N`` folders (an ``output_dir``)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any

from goodput.cli._command import add_command
from goodput.errors import AccessRefused, ConfigError

__all__ = ["register"]


_HELP = "list the checkpoints under a folder or URL and whether each is usable"
_DESCRIPTION = (
    "List every checkpoint under DIR_OR_URL: committed, partial (never committed) or corrupt "
    "(with the reason); also a Hugging Face Trainer's output_dir (its checkpoint-N folders). Remote URLs "
    "use fsspec; credentials come from the environment (AWS_* for s3://) or --option."
)


def register(sub: Any) -> None:
    parser = add_command(sub, "ls", help=_HELP, description=_DESCRIPTION)
    parser.add_argument("root", metavar="DIR_OR_URL", help="checkpoint root: a folder or an fsspec URL")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--checksums", action="store_true", help="also verify every file's sha256 (reads every byte)"
    )
    parser.add_argument(
        "--memory-folder", default="/dev/shm/goodput", metavar="DIR",
        help="where the run's memory tier lives on this machine (default /dev/shm/goodput)",
    )  # fmt: skip
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option (VALUE parsed as JSON when it is JSON), e.g. "
        'client_kwargs=\'{"endpoint_url": "http://127.0.0.1:8333"}\'',
    )
    parser.set_defaults(handler=_run)


def _options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r} must look like KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n}"


def _when(wall_time: float | None) -> str:
    if wall_time is None:
        return "-"
    return datetime.datetime.fromtimestamp(wall_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _memory_rows(root: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from goodput.checkpoint.memory.listing import list_memory_checkpoints

    try:
        return list_memory_checkpoints(root, args.memory_folder, _options(args.option))
    except OSError:
        return []


def _print_memory(rows: list[dict[str, Any]], folder: str) -> None:
    if not rows:
        return
    print(f"memory tier on this machine ({folder}):")
    for r in rows:
        missing = f", unmarked parts of ranks {r['unmarked']} (incomplete)" if r["unmarked"] else ""
        print(
            f"  node {r['node']}  step {r['step']:<6} {r['kind']:<8} ranks {r['ranks']}  {_size(r['bytes'])}{missing}"
        )
    print()


def _run(args: argparse.Namespace) -> int:
    from goodput._storage_errors import refusals_named
    from goodput.checkpoint._trainer_folders import list_trainer_checkpoints
    from goodput.checkpoint.durable.layout import list_checkpoints

    root: str = args.root
    if "://" not in root and not os.path.isdir(root):
        raise ConfigError(f"{root!r} is not a folder; give a checkpoint root folder or an fsspec URL")
    options = _options(args.option)
    try:
        with refusals_named(root, options, verb="list"):
            rows = list_checkpoints(root, storage_options=options, checksums=args.checksums)
    except AccessRefused:
        raise  # a ConfigError already: one line naming where credentials are read from
    except (OSError, ValueError, ImportError) as err:
        raise ConfigError(f"cannot list {root!r}: {type(err).__name__}: {err}") from None
    trainer_rows = list_trainer_checkpoints(root) if "://" not in root else []
    if trainer_rows:
        rows = sorted([*rows, *trainer_rows], key=lambda r: -r.step)
    memory = _memory_rows(root, args)
    if args.json:
        print(
            json.dumps({"root": root, "checkpoints": [r.to_dict() for r in rows], "memory": memory}, indent=1)
        )
        return 0
    _print_memory(memory, args.memory_folder)
    if not rows:
        print(f"no checkpoints under {root}")
        return 0
    table = [("STEP", "SAVED (UTC)", "SIZE", "STRATEGY", "RANKS", "STATUS")]
    for r in rows:
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        ranks = "-" if r.world_size is None else str(r.world_size)
        table.append((str(r.step), _when(r.wall_time), _size(r.size_bytes), r.strategy or "-", ranks, status))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5])
    return 0

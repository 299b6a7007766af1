"""The drill's contract: what a scenario is given, what it reports, and the registry that lists them.

A scenario injects one kind of fault into a user's training script and reports whether the documented outcome
held. It is given a :class:`DrillContext` (the script, the uninterrupted reference run, a folder of its own)
and returns a :class:`ScenarioResult`, one row of the drill's table. Scenarios know nothing of the table, the
command line or each other; :mod:`goodput.drill.runs` holds what most of them share (launching the script with
a fault plan, judging its records against the reference, the ledger's account).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from goodput.verify.records import RunRecords

__all__ = ["DrillContext", "Reference", "Scenario", "ScenarioResult", "register", "registered"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reference:
    """The uninterrupted run every scenario is compared with.

    Attributes:
        run_dir: its run folder (ledger, records, checkpoints unless the script saves elsewhere).
        records: what ``Run`` recorded in it (``GOODPUT_RECORDS=1``).
        steps: the last step it trained.
        saves: the steps at which a checkpoint became durable.
        async_saves: whether its saves were asynchronous (``dcp_async``).
        seconds: its wall time, from launch to exit.
    """

    run_dir: str
    records: RunRecords
    steps: int
    saves: tuple[int, ...]
    async_saves: bool
    seconds: float

    @classmethod
    def empty(cls) -> Reference:
        """No run to compare with: the reference of the launches made before or without one (the uninterrupted
        run itself, the soak's job)."""
        return cls(
            run_dir="", records=RunRecords({}, {}, []), steps=0, saves=(), async_saves=False, seconds=0.0
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrillContext:
    """Everything a scenario is given.

    Attributes:
        script: the training script and its arguments (the demo's when the user gave none).
        nproc: ranks per node; the job has ``nproc`` x ``nnodes`` ranks, which the scenarios that need no
            second node run on one.
        nnodes: nodes (agents on this machine); 1 unless ``--nnodes 2``.
        seed: seeds the scenario's random choices (which rank, which step).
        work_dir: this scenario's own folder, created and empty.
        reference: the uninterrupted run.
        say: prints one progress line (the drill takes minutes).
    """

    script: tuple[str, ...]
    nproc: int
    nnodes: int
    seed: int
    work_dir: str
    reference: Reference
    say: Callable[[str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """One row of the drill's table.

    Attributes:
        injected: what was injected, concretely (``"kill@step=12,rank=1"``, ``"SIGTERM at step 9"``).
        outcome: how the run ended: ``"completed"`` or ``"stopped, exit 75"`` (``"failed, exit 1"``...).
        met: every check of the scenario held (its documented outcome).
        exactly_once: every sample trained exactly once (None: not checked by this scenario).
        identical: the final state equals the reference's (None: not expected, see ``not_expected``).
        not_expected: why ``identical`` is not expected (``"a NaN step is skipped"``); empty otherwise.
        time_lost: seconds beyond the reference run's wall time.
        ledger: the ledger's account of the run in a few words (``"2 attempts; lost 3.1 s: restart 2.0 s,
            rework 1.1 s"``).
        problems: one line per check that failed (why ``met`` is False).
    """

    injected: str
    outcome: str
    met: bool
    exactly_once: bool | None
    identical: bool | None
    not_expected: str = ""
    time_lost: float = 0.0
    ledger: str = ""
    problems: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scenario:
    """One fault goodput claims to survive, and how to drill it.

    Attributes:
        name: the name on the command line (``--scenarios rank,agent``).
        injects: what it injects, in words (the table's and docs/drill.md's "injected").
        outcome: its documented outcome, in words (docs/drill.md).
        run: runs the scenario against ``context.script`` and reports.
        nnodes: the nodes it needs (2 for the node scenario); the drill skips it, with one line, otherwise.
        runs: how long it takes, roughly, in uninterrupted runs of the script (its launches, restarts and the
            work they redo), for the drill's estimate of its own length.
        hang_timeouts: how many of the script's hang timeouts it waits besides (the hang scenario's).
    """

    name: str
    injects: str
    outcome: str
    run: Callable[[DrillContext], ScenarioResult]
    nnodes: int = 1
    runs: int = 1
    hang_timeouts: int = 0


_REGISTRY: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario`` to the drill (in the order registered); returns it, so a module can keep the name."""
    assert scenario.name not in _REGISTRY, f"two scenarios named {scenario.name}"
    _REGISTRY[scenario.name] = scenario
    return scenario


def registered() -> dict[str, Scenario]:
    """Name -> scenario, of every module :mod:`goodput.drill.catalog` lists, in the drill's order."""
    import importlib

    from goodput.drill.catalog import MODULES

    for module in MODULES:
        importlib.import_module(module)  # registers its scenarios (once: Python keeps the module)

    return dict(_REGISTRY)

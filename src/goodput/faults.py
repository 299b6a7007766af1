"""Declarative fault injection for tests, demos and chaos drills.

A fault plan is a string, given on the command line (``--faults``) or in the environment variable
``GOODPUT_FAULTS`` so that it reaches every rank under torchrun. Faults are separated by ``;``; each is
``ACTION@KEY=VALUE,KEY=VALUE``::

    kill@step=30,rank=1            SIGKILL rank 1 when it finishes step 30
    raise@step=50                  raise InjectedFault on every rank at step 50
    hang@phase=checkpoint_write    stop making progress inside a checkpoint write (the watchdog's job)
    slow@step=10,seconds=2         sleep 2 s at step 10 (a hiccup)
    slow@rank=1,factor=1.5,persist rank 1's steps take 1.5x as long from its first step (``step=N``: from step
                                   N) until its process ends: a straggler; a process that takes the rank later
                                   (a restart, a hot spare) is not slowed
    kill@mtbf=60s,seed=3           SIGKILL one rank at random, exponential times with a 60 s mean per attempt
    nodeloss@step=40,node=1        lose node 1 at step 40: SIGKILL every rank on it, and its memory tier is
                                   wiped before the next attempt (a replaced machine comes back with empty RAM)
    nan@step=12,rank=1             rank 1's loss at step 12 is NaN (``into=grad``: one of its gradients before
                                   the optimizer step; ``value=inf`` for an Inf)
    spike@step=20,factor=50        every rank's loss at step 20, multiplied by 50
    bitflip@step=30,rank=1         flip one bit (``bit=``, default 0: the lowest) of one parameter element on
                                   rank 1 after its optimizer step of step 30 (silent data corruption)

``checkpoint_begin`` fires on a rank as it enters a save, before the strategy's collectives (a rank failing
alone while its peers wait inside DCP). ``optimizer_step`` fires right after the optimizer step of each
optimizer given to ``Run.restore`` (with ``step=N``: of step N), before ``step_done``: the rank's gradients
are already summed into its peers' step, the step is not yet recorded as done (a warm job adopts it; nothing
may be lost). Actions: ``kill``, ``raise``, ``hang``, ``slow``, ``nodeloss``. Keys: ``step``, ``rank``,
``phase`` (one of ``PHASES``), ``mtbf`` (a duration), ``seed``, ``seconds`` (for ``slow``), ``attempt`` (fire
only in that attempt), ``node`` (only on that node: torchrun's GROUP_RANK), and for the numeric faults
``factor``, ``bit``, ``into`` (``loss`` or ``grad``) and ``value`` (``nan``, ``inf``); the flag ``persist``
(no value) makes a ``slow`` fault last, stretching each step by ``factor``.

The numeric faults (``NUMERIC_ACTIONS``) kill nothing: ``goodput.run.numeric`` takes them with
:meth:`FaultPlan.take` at the point of the step where they change a value. Like every step fault each fires once
per run and rank, so a fault repeated in the plan (``nan@step=12; nan@step=12``) fires again on the step's redo
after a rollback, as a fault in the data would.

A fault at a step or phase fires once per run and rank: before it acts it leaves a marker in
``<run_dir>/faults/``, so the restarted attempt that passes the same step again does not die again. The marker
is named by the fault's own text (:meth:`Fault.spec`), its place among equal faults of the plan and the rank
(``kill@step=12,rank=1#0-rank1``), so a relaunch into the same folder with another plan inherits no marker
of a fault it does not have. Random
(``mtbf``) faults draw a fresh schedule for every attempt from (seed, attempt), identical on every rank, so
exactly one rank is chosen as the victim of each draw.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Mapping

import numpy as np

from goodput._env import FAULTS
from goodput.errors import ConfigError, GoodputError
from goodput.units import parse_duration

__all__ = [
    "NUMERIC_ACTIONS",
    "PHASES",
    "Fault",
    "FaultPlan",
    "InjectedFault",
    "check_plan",
    "fault_point",
    "install_faults",
    "lost_node_file",
    "parse_faults",
]

ENV_VAR = FAULTS.name
NUMERIC_ACTIONS = ("nan", "spike", "bitflip")
ACTIONS = ("kill", "raise", "hang", "slow", "nodeloss", *NUMERIC_ACTIONS)
PHASES = (
    "step",
    "checkpoint_begin",
    "checkpoint_write",
    "async_upload",
    "checkpoint_purge",
    "restore",
    "optimizer_step",
    "cache_download",
    "memory_write",
    "memory_replicate",
    "memory_restore",
)
_KEYS = (
    "step", "rank", "phase", "mtbf", "seed", "seconds", "attempt", "node", "factor", "bit", "into", "value",
    "persist",
)  # fmt: skip


class InjectedFault(GoodputError):
    """The exception a ``raise`` fault throws."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault: what to do, and where or how often.

    Exactly one trigger: ``step`` (with the default phase ``step``), ``phase`` (optionally with a step: the
    first time that phase runs at or after it), or ``mtbf`` (random).
    """

    action: str
    step: int | None = None
    rank: int | None = None
    phase: str = "step"
    mtbf: float | None = None
    seed: int = 0
    seconds: float = 1.0
    attempt: int | None = None
    node: int | None = None
    factor: float = 10.0
    bit: int = 0
    into: str = "loss"
    value: str = "nan"
    persist: bool = False

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ConfigError(f"fault action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.phase not in PHASES:
            raise ConfigError(f"fault phase {self.phase!r} is not one of {', '.join(PHASES)}")
        if self.mtbf is not None and (self.step is not None or self.phase != "step"):
            raise ConfigError("a fault takes either mtbf= or step=/phase=, not both")
        if self.persist and (self.action != "slow" or self.phase != "step" or self.mtbf is not None):
            raise ConfigError("persist applies to a slow fault at steps: slow@rank=R,factor=F,persist")
        if self.mtbf is None and self.step is None and self.phase == "step" and not self.persist:
            raise ConfigError(f"fault {self.action!r} needs step=, phase= or mtbf=")
        if self.mtbf is not None and self.mtbf <= 0:
            raise ConfigError(f"fault mtbf must be > 0, got {self.mtbf}")
        if self.step is not None and self.step < 0:
            raise ConfigError(f"fault step must be >= 0, got {self.step}")
        if self.seconds < 0:
            raise ConfigError(f"fault seconds must be >= 0, got {self.seconds}")
        if self.action == "nodeloss" and (self.node is None or self.rank is not None):
            raise ConfigError("a nodeloss fault names the node it loses (node=N) and no rank")
        if self.action in NUMERIC_ACTIONS and (self.step is None or self.phase != "step"):
            raise ConfigError(f"a {self.action} fault fires at a step: {self.action}@step=N")
        if self.action == "bitflip" and self.rank is None:
            raise ConfigError("a bitflip fault corrupts one replica: name it (bitflip@step=N,rank=R)")
        if self.into not in ("loss", "grad"):
            raise ConfigError(f"fault into={self.into!r} is not one of loss, grad")
        if self.value not in ("nan", "inf"):
            raise ConfigError(f"fault value={self.value!r} is not one of nan, inf")
        if not 0 <= self.bit < 64:
            raise ConfigError(f"fault bit must be in 0..63, got {self.bit}")
        if not math.isfinite(self.factor) or self.factor <= 0:
            raise ConfigError(f"fault factor must be a positive number, got {self.factor}")

    def spec(self) -> str:
        """The fault as plan text in one spelling (fields in a fixed order, defaults left out): equal faults
        have equal specs however the plan wrote them."""
        changed = [(key, getattr(self, key)) for key in _KEYS if getattr(self, key) != _DEFAULTS[key]]
        parts = ["persist" if key == "persist" else f"{key}={value}" for key, value in changed]
        return f"{self.action}@{','.join(parts)}"


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Fault)}


def parse_faults(text: str) -> list[Fault]:
    """Parse a fault plan string (see the module docstring).

    Raises:
        ConfigError: naming the part that is malformed.
    """
    faults = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        action, _, rest = part.partition("@")
        fields: dict[str, str] = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            if key == "persist" and not eq:
                eq, value = "=", "1"
            if not eq or key not in _KEYS:
                raise ConfigError(f"fault {part!r}: {item!r} is not KEY=VALUE with KEY in {', '.join(_KEYS)}")
            fields[key] = value
        try:
            faults.append(
                Fault(
                    action=action.strip(),
                    step=int(fields["step"]) if "step" in fields else None,
                    rank=int(fields["rank"]) if "rank" in fields else None,
                    phase=fields.get("phase", "step"),
                    mtbf=parse_duration(fields["mtbf"], what="fault mtbf") if "mtbf" in fields else None,
                    seed=int(fields.get("seed", 0)),
                    seconds=_seconds(fields.get("seconds", "1")),
                    attempt=int(fields["attempt"]) if "attempt" in fields else None,
                    node=int(fields["node"]) if "node" in fields else None,
                    factor=float(fields.get("factor", "10")),
                    bit=int(fields.get("bit", "0")),
                    into=fields.get("into", "loss"),
                    value=fields.get("value", "nan"),
                    persist=fields.get("persist", "0").lower() in ("1", "true", "yes"),
                )
            )
        except ValueError as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(f"fault {part!r}: {err}") from None
    return faults


def _describe(fault: Fault) -> str:
    """The fault as it is written in a plan, e.g. ``kill@step=30,rank=1``."""
    fields = [
        f"{k}={getattr(fault, k)}" for k in ("step", "rank", "attempt") if getattr(fault, k) is not None
    ]
    if fault.phase != "step":
        fields.insert(0, f"phase={fault.phase}")
    if fault.mtbf is not None:
        fields.insert(0, f"mtbf={fault.mtbf:g}s")
    return f"{fault.action}@{','.join(fields)}"


def check_plan(faults: list[Fault], *, world_size: int | None = None, total_steps: int | None = None) -> None:
    """Refuse a plan with a fault that can never fire, before the run starts.

    Args:
        faults: the parsed plan.
        world_size: the most ranks the job can have (None: unknown).
        total_steps: the run's last step (None: unknown).

    Raises:
        ConfigError: naming the fault and why it cannot fire.
    """
    for fault in faults:
        if world_size is not None and fault.rank is not None and fault.rank >= world_size:
            raise ConfigError(
                f"fault {_describe(fault)} can never fire: rank {fault.rank} does not exist in a job of "
                f"{world_size} rank{'s' if world_size != 1 else ''} (ranks 0..{world_size - 1})"
            )
        if total_steps is not None and fault.step is not None and fault.step > total_steps:
            raise ConfigError(
                f"fault {_describe(fault)} can never fire: step {fault.step} is past the run's last step "
                f"{total_steps}"
            )


def _seconds(text: str) -> float:
    """A duration that may omit its unit (plain seconds): ``2``, ``2s``, ``500ms``."""
    try:
        return float(text)
    except ValueError:
        return parse_duration(text, what="fault seconds")


class FaultPlan:
    """The faults that apply to this process, checked at steps and phases.

    Args:
        faults: the parsed plan.
        rank: this process's global rank.
        world_size: number of ranks (random faults pick their victim among them).
        attempt: this attempt's number (torchrun's restart count).
        marker_dir: where fired faults are remembered across attempts; None remembers nothing.
        on_fire: called with (fault, where) just before a fault acts, e.g. to log it to the ledger.
        node: this process's node (torchrun's GROUP_RANK; None reads it from the environment).
    """

    def __init__(
        self,
        faults: list[Fault],
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        marker_dir: str | None = None,
        on_fire: Callable[[Fault, str], None] | None = None,
        node: int | None = None,
    ) -> None:
        self.rank = rank
        self.node = int(os.environ.get("GROUP_RANK", "0")) if node is None else node
        self.attempt = attempt
        self._marker_dir = marker_dir
        self._on_fire = on_fire
        self._started = time.monotonic()
        # Named in the whole plan, so a fault's marker names the same fault in every attempt and rank.
        self._faults = [
            (i, f)
            for i, f in _named(faults)
            if (f.rank is None or f.rank == rank)
            and (f.attempt is None or f.attempt == attempt)
            and (f.node is None or f.node == self.node)
        ]
        self._deadlines = {
            i: self._random_deadline(f, world_size) for i, f in self._faults if f.mtbf is not None
        }
        self._stretch = 0.0  # a persistent slow fault's factor minus 1, once it fired in this process
        self._last_step = time.monotonic()

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        **kwargs: object,
    ) -> FaultPlan:
        """The plan in ``GOODPUT_FAULTS`` (empty when unset)."""
        text = FAULTS.get(env)
        return cls(parse_faults(text), **kwargs)  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        return bool(self._faults)

    def mine(self) -> list[Fault]:
        """The faults of the plan that apply to this process (its rank, node and attempt)."""
        return [f for _, f in self._faults]

    def _random_deadline(self, fault: Fault, world_size: int) -> float | None:
        assert fault.mtbf is not None
        rng = np.random.default_rng([fault.seed, self.attempt])
        delay = float(rng.exponential(fault.mtbf))
        victim = int(rng.integers(world_size))
        return delay if victim == self.rank else None

    def check(self, *, phase: str = "step", step: int | None = None) -> None:
        """Fire every fault due at this phase and step (a no-op for an empty plan)."""
        for name, fault in self._faults:
            if fault.mtbf is not None:
                deadline = self._deadlines.get(name)
                if deadline is not None and time.monotonic() - self._started >= deadline:
                    self._deadlines[name] = None
                    self._fire(fault, f"random after {deadline:.1f}s", marker=None)
                continue
            if fault.phase != phase or fault.action in NUMERIC_ACTIONS:
                continue
            if fault.persist:
                if self._stretch == 0.0 and (fault.step is None or (step is not None and step >= fault.step)):
                    self._fire(fault, f"{phase} at step {step}", marker=f"{name}-rank{self.rank}")
                continue
            if fault.step is not None and (step is None or step < fault.step):
                continue
            if fault.phase == "step" and step != fault.step:
                continue
            self._fire(fault, f"{phase} at step {step}", marker=f"{name}-rank{self.rank}")

    def stretch(self) -> None:
        """Inside each step, before it ends: once a persistent ``slow`` fault fired, make the time since the
        previous call ``factor`` times as long (this process is a straggler from then on)."""
        if self._stretch > 0.0:
            time.sleep(self._stretch * (time.monotonic() - self._last_step))
        self._last_step = time.monotonic()

    def take(self, action: str, step: int, *, into: str | None = None) -> Fault | None:
        """The first numeric fault ``action`` due at ``step`` (and ``into``) that has not fired yet, marked as
        fired; None when there is none. The caller applies it."""
        for name, fault in self._faults:
            if fault.action != action or fault.step != step or (into is not None and fault.into != into):
                continue
            if self._mark(fault, f"step {step}", f"{name}-rank{self.rank}"):
                if self._on_fire is not None:
                    self._on_fire(fault, f"step at step {step}")
                return fault
        return None

    def _mark(self, fault: Fault, where: str, marker: str) -> bool:
        """Leave the marker that this fault fired; False when an earlier attempt left it already."""
        if self._marker_dir is None:
            return True
        os.makedirs(self._marker_dir, exist_ok=True)
        path = os.path.join(self._marker_dir, marker)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False  # fired in an earlier attempt
        os.write(fd, f"{fault.action} {where} attempt {self.attempt}\n".encode())
        os.fsync(fd)
        os.close(fd)
        return True

    def _fire(self, fault: Fault, where: str, *, marker: str | None) -> None:
        if marker is not None and not self._mark(fault, where, marker):
            return
        if fault.action == "nodeloss" and self._marker_dir is not None:
            # The next attempt empties this node's memory tier, as a new machine has none (goodput.run._nodeloss).
            os.makedirs(self._marker_dir, exist_ok=True)
            with open(lost_node_file(self._marker_dir, self.node), "w"):
                pass
        if self._on_fire is not None:
            self._on_fire(fault, where)
        if fault.action in ("kill", "nodeloss"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.action == "raise":
            raise InjectedFault(f"injected fault: {fault.action} {where} on rank {self.rank}")
        elif fault.action == "hang":
            # A real hang: this thread blocks forever and only the watchdog (or a kill) ends it.
            while True:
                time.sleep(3600)
        elif fault.action == "slow" and fault.persist:
            self._stretch = fault.factor - 1.0
        elif fault.action == "slow":
            time.sleep(fault.seconds)


def _named(faults: list[Fault]) -> list[tuple[str, Fault]]:
    """Each fault with its marker's name: its spec and its place among the plan's equal faults (a fault
    repeated in the plan fires once more)."""
    seen: dict[str, int] = {}
    named = []
    for fault in faults:
        spec = fault.spec()
        named.append((f"{spec}#{seen.get(spec, 0)}", fault))
        seen[spec] = seen.get(spec, 0) + 1
    return named


def lost_node_file(marker_dir: str, node: int) -> str:
    """The request a fired ``nodeloss`` leaves for the next attempt: empty node ``node``'s memory tier."""
    return os.path.join(marker_dir, f"lost-node-{node}")


# The plan that ``fault_point`` checks: installed by ``Run`` so that code deep inside the checkpoint engine
# and the cache can offer fault points without knowing about runs (like a failpoint library's registry).
_installed: FaultPlan | None = None


def install_faults(plan: FaultPlan | None) -> None:
    """Make ``plan`` the one ``fault_point`` checks (None: fault points do nothing)."""
    global _installed
    _installed = plan if plan else None


def fault_point(phase: str, step: int | None = None) -> None:
    """A place where an installed fault may fire (``checkpoint_write``, ``async_upload``, ...); else a no-op."""
    if _installed is not None:
        _installed.check(phase=phase, step=step)

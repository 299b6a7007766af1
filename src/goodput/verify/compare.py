"""Two runs' records compared: the first step and the first piece of final state that differ, and why.

Pure functions over what ``Run`` recorded (:mod:`goodput.verify.records`) in an uninterrupted run and in an
interrupted one. Each step is compared as it was last trained (the result that survived), rank by rank:
sample indices, loss, then the random generators (only the indices where a rank died inside a step its peers
completed: it recorded no loss); then the final state, piece by piece in the state's order.
Where the interrupted run trained the first differing step says a lot: before any restart, the training is
not deterministic at all; right after a resume, something the checkpoint does not hold changed.

Only the random generators a run draws from are compared: on each rank, those whose recorded state changed
between two steps of one attempt, in either run. A generator whose state never changes cannot have changed the
result, and its state differs between two runs whenever it is unseeded (Python's ``random`` in a script that
seeds only torch): :func:`idle_generators` names those, for a warning.
"""

from __future__ import annotations

import dataclasses
import itertools

from goodput.run.records import DIGEST_PREFIXES
from goodput.verify.records import RunRecords, StepRecord

__all__ = ["Difference", "compare_records", "drawn_generators", "idle_generators"]

_BEFORE_RESTART = (
    "unseeded randomness: seed random, numpy and torch at the start of the script (libraries draw from them "
    "even when your code does not)",
    "nondeterministic kernels: torch.use_deterministic_algorithms(True) (on CUDA also "
    "CUBLAS_WORKSPACE_CONFIG=:4096:8), and a fixed thread count",
)
_AFTER_RESTART = (
    "state the checkpoint does not hold: give every model, optimizer, scheduler and scaler to run.restore(), "
    "and keep random generators of your own (torch.Generator, np.random.default_rng) in run.restore(extras=) "
    "or derive them from the step",
    "a loader outside Run: pass it to run.restore(loader=...) and iterate run.batches(loader), so its "
    "position is checkpointed and restored (a plain torch DataLoader has no position: use goodput.ResumableLoader)",
)
_DDP_LAYOUT = (
    "DDP on 3 or more ranks with more parameters than its first gradient bucket (1 MiB): DDP's own bucket layout "
    "is kept there, and the first step after a resume sums some gradients in another order (last bits only; "
    "docs/launch.md)"
)
_RNG_NAMES = {"python": "random", "numpy": "np.random", "torch": "torch", "cuda": "torch.cuda"}


@dataclasses.dataclass(frozen=True)
class Difference:
    """Where two runs' records first differ, and the usual causes of such a difference.

    Attributes:
        where: ``"step 37"`` or ``"final state"``.
        what: what differs, e.g. ``"rank 1's sample indices differ"``.
        detail: context: the attempt, the step it resumed from, both values where short.
        causes: what to check, most likely first.
    """

    where: str
    what: str
    detail: str
    causes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" + (f" ({self.detail})" if self.detail else "")


def compare_records(reference: RunRecords, other: RunRecords) -> list[Difference]:
    """The first differing step and the first differing piece of final state (empty when identical).

    ``reference`` is the uninterrupted run, ``other`` the interrupted one; each step is compared as it was
    last trained (the result that survived), rank by rank: sample indices, loss, then random generators.
    """
    found = []
    drawn = _drawn_by_either(reference, other)
    step_difference = _first_step_difference(reference, other, drawn)
    if step_difference is not None:
        found.append(step_difference)
    final_difference = _first_final_difference(reference, other, drawn)
    if final_difference is not None:
        found.append(final_difference)
    return found


def drawn_generators(records: RunRecords) -> dict[int, set[str]]:
    """Rank -> the generators (``python``, ``numpy``, ``torch``, ``cuda``) whose recorded state changed
    between two consecutive records of one attempt: the ones that rank drew from while training."""
    drawn: dict[int, set[str]] = {}
    for rank, steps in records.steps.items():
        names = drawn.setdefault(rank, set())
        ordered = [steps[step] for step in sorted(steps)]
        for before, after in itertools.pairwise(r for r in ordered if not r.pending):
            if before.attempt == after.attempt:  # a restore in between sets the state: not a draw
                names |= {n for n in {*before.rng, *after.rng} if before.rng.get(n) != after.rng.get(n)}
    return drawn


def idle_generators(reference: RunRecords, other: RunRecords) -> list[str]:
    """The generators (as a script names them: ``random``, ``np.random``, ...) that no rank drew from in
    either run and whose recorded state still differs between the runs: not compared, worth a warning."""
    drawn = _drawn_by_either(reference, other)
    idle = set()
    for rank in sorted(set(reference.steps) | set(other.steps)):
        ref_steps, got_steps = reference.steps.get(rank, {}), other.steps.get(rank, {})
        for step in set(ref_steps) & set(got_steps):
            if ref_steps[step].pending or got_steps[step].pending:
                continue
            ref, got = ref_steps[step].rng, got_steps[step].rng
            idle |= {n for n in {*ref, *got} if n not in drawn.get(rank, ()) and ref.get(n) != got.get(n)}
    return sorted(_RNG_NAMES.get(name, name) for name in idle)


def _drawn_by_either(reference: RunRecords, other: RunRecords) -> dict[int, set[str]]:
    drawn = drawn_generators(reference)
    for rank, names in drawn_generators(other).items():
        drawn.setdefault(rank, set()).update(names)
    return drawn


def _first_step_difference(
    reference: RunRecords, other: RunRecords, drawn: dict[int, set[str]]
) -> Difference | None:
    ranks = sorted(set(reference.steps) | set(other.steps))
    steps = sorted({s for r in ranks for s in (*reference.steps.get(r, {}), *other.steps.get(r, {}))})
    for step in steps:
        for rank in ranks:
            ref = reference.steps.get(rank, {}).get(step)
            got = other.steps.get(rank, {}).get(step)
            if ref is None and got is None:  # neither run had this rank at this step (a job that shrank)
                continue
            if ref is None or got is None:
                missing = "uninterrupted" if ref is None else "interrupted"
                return Difference(
                    f"step {step}", f"rank {rank} did not train this step in the {missing} run", "",
                    ("a loop that does not run the same number of steps each time (total_steps, epochs)",),
                )  # fmt: skip
            difference = _step_difference(ref, got, drawn.get(rank, set()))
            if difference is not None:
                return difference
    return None


def _step_difference(ref: StepRecord, got: StepRecord, drawn: set[str]) -> Difference | None:
    where, rank = f"step {ref.step}", ref.rank
    context, resumed = _context(got)
    causes = _AFTER_RESTART if resumed else _BEFORE_RESTART
    if ref.samples != got.samples or ref.count != got.count:
        if ref.samples is None or got.samples is None:
            what = f"rank {rank}'s sample indices were recorded in one run only"
        else:
            what = f"rank {rank}'s sample indices differ"
        data_causes = (
            (_AFTER_RESTART[1], "a dataset that changed between the runs")
            if resumed
            else ("an unseeded sample order: pass seed= to ResumableLoader", "a dataset that changed")
        )
        return Difference(where, what, context, data_causes)
    if (
        ref.pending or got.pending
    ):  # a rank that died inside a step its peers completed recorded no loss or rng
        return None
    if ref.loss != got.loss:
        values = f"{_float(ref.loss)} uninterrupted, {_float(got.loss)} interrupted"
        loss_causes = (*causes, _DDP_LAYOUT) if resumed else causes
        return Difference(where, f"rank {rank}'s loss differs", f"{values}; {context}", loss_causes)
    for name in [*ref.rng, *(n for n in got.rng if n not in ref.rng)]:
        if name in drawn and ref.rng.get(name) != got.rng.get(name):
            generator = _RNG_NAMES.get(name, name)
            what = f"rank {rank}'s {generator} random generator state differs"
            if resumed:
                rng_causes = (
                    f"something draws from {generator}'s generator when a run resumes and not at the same "
                    "point of an uninterrupted run (a torch DataLoader iterated outside run.batches() draws a "
                    "seed from torch's generator each time it starts)",
                    *_AFTER_RESTART,
                )
            else:
                rng_causes = (f"{generator} is not seeded at the start of the script", *_BEFORE_RESTART)
            return Difference(where, what, context, rng_causes)
    return None


def _context(record: StepRecord) -> tuple[str, bool]:
    """Where the interrupted run trained this step, and whether it came after restoring a checkpoint."""
    if record.resumed == 0 and record.attempt == 0:
        return "in the first attempt, before any restart: the runs differ without a resume", False
    if record.resumed == 0:  # nothing restored: as good as a fresh run
        return f"attempt {record.attempt}, which restored nothing: the runs differ without a resume", False
    after = record.step - record.resumed
    when = "the first step" if after == 1 else f"{after} steps"
    return f"attempt {record.attempt}, {when} after resuming from step {record.resumed}", True


def _float(text: str | None) -> str:
    return "none" if text is None else repr(float.fromhex(text))


def _first_final_difference(
    reference: RunRecords, other: RunRecords, drawn: dict[int, set[str]]
) -> Difference | None:
    for rank in sorted(set(reference.final) | set(other.final)):
        if rank not in reference.final or rank not in other.final:
            run = "uninterrupted" if rank not in reference.final else "interrupted"
            return Difference(
                "final state", f"rank {rank} recorded none in the {run} run", "did the script call run.close()?",
                ("a script that exits before run.close()",),
            )  # fmt: skip
    pieces: dict[str, list[int]] = {}
    for rank in sorted(reference.final):
        ref, got = reference.final[rank]["state"], other.final[rank]["state"]
        idle = {f"rng.{n}" for n in _RNG_NAMES if n not in drawn.get(rank, set())}
        for name in [*ref, *(k for k in got if k not in ref)]:
            if name not in idle and ref.get(name) != got.get(name):
                pieces.setdefault(name, []).append(rank)
    if not pieces:
        return None
    order = list(reference.final[min(reference.final)]["state"])
    name = min(pieces, key=lambda n: order.index(n) if n in order else len(order))
    ranks = pieces[name]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    ref_value = reference.final[ranks[0]]["state"].get(name)
    got_value = other.final[ranks[0]]["state"].get(name)
    detail = f"on {who}"
    if not str(ref_value).startswith(DIGEST_PREFIXES) and not str(got_value).startswith(DIGEST_PREFIXES):
        detail += f": {ref_value} uninterrupted, {got_value} interrupted"
    more = len(pieces) - 1
    if more:
        detail += f"; {more} more piece{'s' if more > 1 else ''} differ"
    return Difference("final state", f"{name} differs", detail, (*_BEFORE_RESTART, *_AFTER_RESTART))

"""The drill's tests share one uninterrupted run of the built-in drill script, short (16 steps, 2 ranks), and build
each scenario's context around it (:func:`context`)."""

from __future__ import annotations

import os

from goodput.drill.drill import DEMO_SCRIPT, reference_run
from goodput.drill.scenario import DrillContext, Reference

# 16 steps, a save every 4: the first save at 4 leaves room for every scenario's step; a hang is declared after
# 5 s without a step (20 s inside a save)
SCRIPT = (DEMO_SCRIPT, "--steps", "16", "--every", "4", "--hang-timeout", "5")
NPROC = 2


def reference(work: str) -> Reference:
    """The uninterrupted run, in ``work``/uninterrupted."""
    found = reference_run(SCRIPT, nproc=NPROC, nnodes=1, seed=0, work=work, say=print)
    assert found is not None, "the uninterrupted run failed"
    return found


def context(work: str, ref: Reference, *, nnodes: int = 1, hang_timeout: float | None = None) -> DrillContext:
    """A scenario's context: the shared reference, a fresh folder ``work``; with ``nnodes`` 2 the reference's
    ``NPROC`` ranks are split over two nodes; ``hang_timeout`` replaces the script's (it changes no result)."""
    os.makedirs(work, exist_ok=True)
    script = SCRIPT if hang_timeout is None else (*SCRIPT[:-1], str(hang_timeout))
    return DrillContext(
        script=script, nproc=NPROC // nnodes, nnodes=nnodes, seed=0, work_dir=work, reference=ref, say=print
    )

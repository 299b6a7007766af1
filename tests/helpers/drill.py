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


def reference(work: str, script: tuple[str, ...] = SCRIPT) -> Reference:
    """The uninterrupted run of ``script``, in ``work``/uninterrupted."""
    found = reference_run(script, nproc=NPROC, nnodes=1, seed=0, work=work, say=print)
    assert found is not None, "the uninterrupted run failed"
    return found


def context(
    work: str,
    ref: Reference,
    *,
    nnodes: int = 1,
    hang_timeout: float | None = None,
    script: tuple[str, ...] = SCRIPT,
) -> DrillContext:
    """A scenario's context: the reference ``ref`` of ``script``, a fresh folder ``work``; with ``nnodes`` 2 the
    reference's ``NPROC`` ranks are split over two nodes; ``hang_timeout`` replaces the drill script's (it
    changes no result)."""
    os.makedirs(work, exist_ok=True)
    if hang_timeout is not None:
        assert script == SCRIPT, "--hang-timeout is the drill script's option"
        script = (*SCRIPT[:-1], str(hang_timeout))
    return DrillContext(
        script=script, nproc=NPROC // nnodes, nnodes=nnodes, seed=0, work_dir=work, reference=ref, say=print
    )

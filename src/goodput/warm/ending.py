"""The job's end while a restart is pending: the agent's verdict on a rank that exits 0 during one.

A rank that ends well (its run closed, exit 0) cannot join a generation that the agent has published and that
has not formed yet: that generation waits for every rank, so it would never form, and the agent would find out
only at the re-form timeout. Typical: a peer dies near the end of the run while a survivor completes its last
step and its ``close()``. Which outcome is right depends on what the finished rank left:

* it closed at the job's last step with that step's checkpoint committed (its ``Complete`` in the store,
  written by ``goodput.warm.worker``): the job is done and nothing is left to recover. The pending restart is
  dropped: its replacements, which hold no state, are stopped, and the generation is ended in the store, so a
  survivor already waiting in it leaves at once. The ranks still closing their run end on their own, and the
  agent ends the job with exit 0 once each rank of its node has ended, whatever its exit: a failure once the job
  is complete (a rank SIGKILLed in its own ``close()``) restarts nothing.
* otherwise (its loop ended before the last step, or nothing committed it): the pending generation cannot form,
  so the job restarts cold at once, from the newest checkpoint, instead of after the timeout.

A grow still pending as the ranks finish their last steps is no failure: the ranks that held state end on their
own (``Resizer.finished_before_grow``), so it is left to that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodput.warm.protocol import Complete

if TYPE_CHECKING:
    from goodput.warm.agent import WarmAgent

__all__ = ["JobEnd", "finished_while_pending"]


class JobEnd:
    """The agent's end of a complete job whose ranks failed or whose restart was pending (see the module)."""

    def __init__(self, agent: WarmAgent) -> None:
        self.agent = agent
        self.done: Complete | None = None  # once the job is seen complete with a failure or a restart pending
        self.gone: set[int] = set()  # ranks of this node that failed or were stopped since

    def check(self, failed: dict[int, int]) -> bool | None:
        """None: the job is not complete (or ends as it grows): go on as before. False: complete, ranks of this
        node still closing their run (nothing is restarted meanwhile). True: every rank of this node has ended,
        the agent ends with exit 0."""
        agent = self.agent
        if self.done is None:
            if (not failed and agent.pending is None) or agent.resize.newcomers:
                return None  # nothing to answer; or the job ends as it grows
            self.done = agent.store.complete()
            if self.done is None:
                return None
            self._drop_pending(failed)
        self.gone |= set(failed)
        return all(rank in agent.finished or rank in self.gone for rank in agent.workers)

    def _drop_pending(self, failed: dict[int, int]) -> None:
        agent, done = self.agent, self.done
        assert done is not None  # just read
        pending = agent.pending[0] if agent.pending is not None else None
        replacements: list[int] = []
        if pending is not None:
            info = agent.store.generation(pending)
            replacements = sorted(set(info.failed) & set(agent.workers)) if info.kind == "warm" else []
            agent.stop([agent.workers[rank] for rank in replacements])
            agent.store.end_generation(
                pending, agent.store.new_generation()
            )  # a survivor waiting in it leaves
            agent.pending = None
        self.gone |= set(replacements)
        agent.record(
            "job_complete", rank=done.rank, step=done.step, gen=done.gen, pending=pending, failed=sorted(failed),
            stopped=replacements,
        )  # fmt: skip
        dropped = f"; the restart of generation {pending} is dropped" if pending is not None else ""
        agent.notice(
            sorted(failed),
            f"the job is complete: rank {done.rank} committed step {done.step}, the last{dropped}",
        )


def finished_while_pending(agent: WarmAgent) -> str | None:
    """Why the pending restart must give way to a cold one now: a rank of this node ended well (exit 0) but the
    job is not complete, so the pending generation, which waits for that rank, cannot form. None: it can (or a
    pending grow ends as the ranks finish)."""
    if agent.pending is None or not agent.finished or agent.resize.newcomers:
        return None
    if agent.store.complete() is not None:
        return None  # JobEnd ends the job
    ranks = ", ".join(map(str, sorted(agent.finished)))
    return (
        f"rank(s) {ranks} ended (exit 0) before the job's last step was committed, while generation "
        f"{agent.pending[0]} was forming"
    )

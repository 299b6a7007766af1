"""This process's membership of the job: its process group, its place in it, and what the launcher and a
preemption signal need to reach it.

``Run`` joins when it is made and leaves when it ends; a warm restart leaves one generation's group and joins the
next one's in the same process. Joining: under ``goodput launch --restart warm`` a spare waits here for its rank
(imports done), then joins; else the group is torchrun's, or a one-process group the run makes itself
(``python train.py``), so DDP, FSDP2 and DCP work unchanged. Then the preemption watch installs its signal
handler, and only after that the pid is written where the launcher forwards signals, and the process ends with
its parent under ``goodput launch``. Last, the ranks agree on this round's attempt number (``_attempt``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from goodput.distributed import DistInfo, dist_info, init_distributed
from goodput.job.folder import register_pid
from goodput.job.signals import end_with_launcher
from goodput.run._attempt import agreed_attempt
from goodput.run.signals import PreemptionWatch
from goodput.warm.worker import WarmWorker, warm_enabled

__all__ = ["Membership", "single_process_group"]


class Membership:
    """The process group this run joined (or made), this rank's place in it, and the preemption watch.

    Args:
        run_dir: the run folder (its ledgers number the attempts).
        backend: process-group backend (None: nccl with CUDA, else gloo).
        step_of: the run's current step, which the warm worker reports to the agent.
        collective_timeout: the process group's timeout in seconds (a warm worker's comes from its launch).
    """

    def __init__(
        self, run_dir: str, backend: str | None, *, step_of: Callable[[], int], collective_timeout: float
    ) -> None:
        self.worker = WarmWorker() if warm_enabled() else None  # the warm side, under --restart warm
        if self.worker is not None:
            self.worker.step_of = step_of
            self.worker.join(backend)
            self.info = dist_info()
            self.owns_group = self.info.world_size > 1  # and so destroys it at the run's end
        else:
            self.info = init_distributed(backend, timeout=collective_timeout)
            self.owns_group = single_process_group(backend) or self.info.world_size > 1
        self.preempt = PreemptionWatch(rank=self.info.rank, world_size=self.info.world_size)
        register_pid(self.info.rank)
        end_with_launcher()  # this process ends with its parent under goodput launch (also when not booted by it)
        # One numbering for the job: every rank of this round records the same attempt, a spare handed a rank
        # the one its generation's survivors open (``rejoin``); a spare's attempt begins when it was handed it.
        self.run_dir = run_dir
        self.attempt = agreed_attempt(run_dir, self.preempt.group)
        self.began = self.worker.began if self.worker is not None else None

    def rejoin(self, leave: Callable[[], None]) -> DistInfo:
        """Leave this generation's group (``leave`` waits for the next one and joins it) and take the new place:
        a shrink or grow renumbers the ranks. A preemption request stays."""
        self.preempt.leave_group()  # its group belongs to the dead generation
        leave()
        self.info = dist_info()
        self.preempt.rank, self.preempt.world_size = self.info.rank, self.info.world_size
        # Every rank of the new generation makes the watch's group and agrees on its attempt at the same point
        # as a spare does on joining.
        self.preempt.join_group()
        self.attempt = agreed_attempt(self.run_dir, self.preempt.group)
        return self.info

    def close(self) -> None:
        """Give the preemption signal back and destroy the process group if the run owns it."""
        self.preempt.close()
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def single_process_group(backend: str | None) -> bool:
    """Make a one-rank process group when none exists and none is expected; True if one was made."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True

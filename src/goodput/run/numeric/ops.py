"""The numeric guard's operations on tensors, process groups and files, apart from its decisions
(``goodput.run.numeric``) and its pure rules (``goodput.run.numeric.rules``): the gradient check, the
all-gather of each rank's word, the skip list of the run folder, and the drill's corruptions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

from goodput.faults import Fault

__all__ = [
    "NO_REPLICAS",
    "SKIPS_FILE",
    "Episode",
    "announce",
    "apply_skips",
    "flip_bit",
    "gather_rows",
    "gradient_sum",
    "inject_faults",
    "json_number",
    "local_tensor",
    "parameter_sum",
    "poison",
    "read_skips",
    "refuse_unseen_bitflip",
    "replicated",
    "restore_finite",
    "skip_window",
    "write_skips",
]


@dataclasses.dataclass
class Episode:
    """One rollback of the numeric guard: the anomaly's step and kind, the step restored, whether its window
    was skipped."""

    step: int
    kind: str
    restored: int
    skipped: bool = False


SKIPS_FILE = os.path.join("numeric", "skips.json")


def gradient_sum(grads: list[Any]) -> float:
    """The sum of every element of the tensors: NaN or infinite when any element is (a NaN propagates, an Inf
    stays infinite or meets the opposite Inf as NaN). One pass and one host sync, the cheapest such pass on CPU
    (an infinity norm's reduction is several times slower there); a sum can overflow only past 3.4e38."""
    import torch

    return float(torch.stack([g.sum() for g in grads]).sum().item())


def parameter_sum(model: Any) -> float:
    """The sum of this rank's parameters of ``model`` (its shards of a DTensor): NaN or infinite when one is."""
    tensors = [local_tensor(p.detach()) for p in model.parameters()]
    tensors = [t for t in tensors if t.numel() > 0]
    return gradient_sum(tensors) if tensors else 0.0


def restore_finite(run: Any, model: Any, group: Any, ceiling: int, agreed: int) -> int | None:
    """Restore the newest checkpoint at or before ``ceiling`` whose parameters are finite on every rank (the
    step restored; None: none is). A gradient on a step the guard does not check (``grads_every``) reaches the
    parameters, so the checkpoints saved after it hold its NaN or Inf: each such one found is passed over, and
    the next tried is at or before ``agreed`` (the last check that found every parameter finite), then older.
    ``group``: the guard's own (None: one rank), on which the ranks agree whether any rank's are finite."""
    import torch
    import torch.distributed as dist

    restored = run.manager.restore_latest(at_most=ceiling)
    while restored is not None:
        bad = torch.tensor([0 if math.isfinite(parameter_sum(model)) else 1])
        if group is not None:
            dist.all_reduce(bad, group=group)
        if not int(bad.item()):
            break
        run.ledger.event("rollback_nonfinite", step=restored, ranks=int(bad.item()))
        restored = run.manager.restore_latest(at_most=min(agreed, restored - 1))
    return restored


def gather_rows(row: list[int], group: Any) -> list[list[int]]:
    """Every rank's ``row`` (int64s), by rank: one all-gather on ``group``."""
    import torch
    import torch.distributed as dist

    from goodput.run.numeric.exchange import all_gather_flat

    world = dist.get_world_size(group)
    out = torch.empty(world * len(row), dtype=torch.int64)
    all_gather_flat(out, torch.tensor(row, dtype=torch.int64), group=group)
    return out.view(world, len(row)).tolist()


def read_skips(run_dir: str) -> list[tuple[int, int, int]]:
    """The run's skipped data ranges ``(epoch, first position, end position)`` (``RUN_DIR/numeric/skips.json``)."""
    try:
        with open(os.path.join(run_dir, SKIPS_FILE)) as f:
            return [(int(e), int(lo), int(hi)) for e, lo, hi in json.load(f)]
    except FileNotFoundError:
        return []


def write_skips(run_dir: str, skips: list[tuple[int, int, int]]) -> None:
    path = os.path.join(run_dir, SKIPS_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump([list(s) for s in skips], f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def skip_window(run: Any, loader: Any, restored: int, steps: int) -> int | None:
    """Skip the data of the ``steps`` steps after ``restored`` from now on: in ``loader``'s sampler (so in every
    checkpoint), in ``RUN_DIR/numeric/skips.json`` (rank 0) and in the ledger. Returns the number of samples
    skipped; None: the loader cannot skip."""
    sampler = getattr(loader, "sampler", None)
    if not callable(getattr(sampler, "skip", None)):
        return None
    assert sampler is not None
    epoch, lo = int(sampler.epoch), int(sampler.consumed)
    hi = min(int(sampler.size), lo + steps * int(sampler.world_size) * int(sampler.batch_size))
    sampler.skip(epoch, lo, hi)
    if run.info.rank == 0:
        write_skips(run.run_dir, [*read_skips(run.run_dir), (epoch, lo, hi)])
    import numpy as np

    indices = sampler.order(epoch).at(np.arange(lo, hi)).tolist() if hi - lo <= 4096 else None
    run.ledger.event(
        "skip", first_step=restored + 1, last_step=restored + steps, epoch=epoch, first_position=lo,
        end_position=hi, samples=hi - lo, indices=indices,
    )  # fmt: skip
    return hi - lo


def announce(run: Any, line: str) -> None:
    """Show one numeric event's ``line`` once for the job (rank 0 speaks: every rank drew the same verdict): on
    the terminal of ``goodput launch`` (a notice), else on stderr. Its detail is in the ledger."""
    if run.info.rank != 0:
        return
    from goodput.job.folder import NUMERIC_NOTICES_FILE, launch_dir, write_notice

    if launch_dir() is not None:
        write_notice(line, name=NUMERIC_NOTICES_FILE)
    else:
        print(f"goodput: {line}", file=sys.stderr, flush=True)


def apply_skips(loader: Any, skips: list[tuple[int, int, int]]) -> None:
    skip = getattr(getattr(loader, "sampler", None), "skip", None)
    if callable(skip):
        for epoch, lo, hi in skips:
            skip(epoch, lo, hi)


def replicated(model: Any) -> bool:
    """Whether the ranks' parameters are bitwise-equal replicas, so fingerprints compare across ranks: a DDP
    model, or DTensors replicated on every mesh dimension. False for sharded parameters (FSDP2) and for a plain
    module, which each rank may train on its own."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return True
    placements = [getattr(p, "placements", None) for p in model.parameters()]
    return bool(placements) and all(pl is not None and all(x.is_replicate() for x in pl) for pl in placements)


NO_REPLICAS = "has no replicas to compare"


def refuse_unseen_bitflip(flips: bool, comparable: bool) -> None:
    """Refuse a ``bitflip`` fault on a model whose ranks hold no replicas (FSDP2 shards, a plain module): only
    the replica check finds a flipped bit, and it has nothing to compare, so the drill would corrupt the run
    unseen.

    Raises:
        ConfigError: the fault plan ``flips`` a bit and the model is not ``comparable``.
    """
    from goodput.errors import ConfigError

    if flips and not comparable:
        raise ConfigError(
            f"the fault plan flips a bit but the model {NO_REPLICAS} (FSDP2-sharded parameters or a plain "
            "module): the replica check finds a flipped bit only in a DDP model or replicated DTensors; drill "
            "bitflip on one of those"
        )


def local_tensor(tensor: Any) -> Any:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def poison(grad: Any, fault: Fault) -> None:
    grad.view(-1)[0] = math.nan if fault.value == "nan" else math.inf


def inject_faults(
    run: Any, model: Any, step: int, loss: float | None, *, alone: bool
) -> tuple[float | None, float | None]:
    """Apply ``run``'s drill faults due at ``step``: the loss a ``nan`` or ``spike`` makes of ``loss`` (returned
    with the spike's factor, None without one), and a ``bitflip`` in ``model``'s parameters; a job that shrank to
    one rank (``alone``) has no replica to compare against, so its flip is left out and the ledger says so."""
    fault = run.faults.take("nan", step, into="loss")
    if fault is not None and loss is not None:
        loss = math.nan if fault.value == "nan" else math.inf
    fault = run.faults.take("spike", step)
    factor = None
    if fault is not None and loss is not None:
        loss, factor = loss * fault.factor, float(fault.factor)
    fault = run.faults.take("bitflip", step)
    if fault is not None and alone:
        run.ledger.event(
            "fault_not_injected", fault=str(fault), step=step, why="one rank, no replica to compare"
        )
    elif fault is not None:
        flip_bit(model, fault.bit)
    return loss, factor


def flip_bit(model: Any, bit: int) -> None:
    """Flip bit ``bit`` of the first element of the first parameter, in place (a ``bitflip`` fault)."""
    import torch

    from goodput.run.numeric.rules import _INT_OF_SIZE

    param = next(iter(model.parameters()))
    with torch.no_grad():
        local = local_tensor(param.data)
        width = 8 * local.element_size()
        bit = min(bit, width - 1)
        ints = local.view(-1).view(_INT_OF_SIZE[local.element_size()])
        ints[0] ^= (1 << bit) if bit < width - 1 else -(1 << bit)  # the sign bit of a signed integer


def json_number(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else repr(value)

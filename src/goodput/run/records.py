"""What ``Run`` records so that two runs of a script can be compared: each step's samples and loss, the final state.

``goodput verify-resume`` sets ``GOODPUT_RECORDS=1`` in the workers' environment; ``Run`` then keeps, per rank:

- ``<run_dir>/records/attempt-<a>.rank-<r>.jsonl``: a header ``{"attempt", "rank", "resumed", "world"}`` (the
  step this attempt started after, and its world size: a warm job that shrinks or grows changes it between
  attempts) and one line per finished step ``{"step", "samples", "count", "ids", "loss", "rng"}``: a digest of
  the step's dataset indices (from a loader that knows them, such as ``ResumableLoader``), their number, the
  indices themselves (so that the steps of different world sizes can be checked for exactly-once), the loss
  given to ``step_done`` as an exact float (``float.hex``), and a digest of each random generator's state
  (python, numpy, torch, cuda). Before it, when the step's batch is handed to the loop, a line
  ``{"step", "pending": true, "samples", "count", "ids"}``: a rank killed after its gradients were summed into
  its peers' step, before ``step_done``, leaves that line for a step the job keeps (a warm restart adopts it).
  Two small appends per step, no fsync: the page cache keeps them when the process is killed.
- ``<run_dir>/records/final.rank-<r>.json``: written by ``close()``: a digest of every piece of the final
  training state (each model and optimizer tensor, the scheduler, scaler, step, extras, RNG states and data
  position), from the :class:`~goodput.checkpoint.TrainingState` the checkpoints are made of.

A step redone after a restart is recorded again; the reader (``goodput.verify.records``) keeps, for each step,
the last time it was trained: the one whose result survived (a pending line when the rank died inside a step
its peers completed: its samples are compared, its loss and random generators cannot be). Without the variable
nothing is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from goodput._env import RECORDS

__all__ = [
    "DIGEST_PREFIXES",
    "FINAL_FILE",
    "RECORDS_DIR",
    "RECORDS_ENV",
    "STEPS_FILE",
    "StepRecorder",
    "indices_digest",
    "rng_digests",
    "state_digests",
]

RECORDS_ENV = RECORDS.name
RECORDS_DIR = "records"
STEPS_FILE = re.compile(r"^attempt-(\d+)\.rank-(\d+)\.jsonl$")
FINAL_FILE = re.compile(r"^final\.rank-(\d+)\.json$")
_SHORT = 64  # non-tensor values up to this many characters are kept as they are, not as a digest
DIGEST_PREFIXES = ("tensor:", "json:")  # how a digest of a final-state piece starts (else: the value itself)


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def indices_digest(indices: Any) -> str:
    """A short digest of a batch's dataset indices, in order."""
    import numpy as np

    return _digest(np.asarray(indices, dtype="<i8").tobytes())


class StepRecorder:
    """Appends one rank's records of one attempt (see the module docstring).

    Args:
        run_dir: the run folder.
        rank: this process's rank.
        attempt: this attempt's number (the ledger's).
        world: this attempt's world size (None: not recorded).
    """

    def __init__(self, run_dir: str, *, rank: int, attempt: int, world: int | None = None) -> None:
        self.folder = os.path.join(run_dir, RECORDS_DIR)
        self.rank = rank
        self.attempt = attempt
        self.world = world
        self._fd: int | None = None

    @classmethod
    def from_env(
        cls, run_dir: str, *, rank: int, attempt: int, world: int | None = None
    ) -> StepRecorder | None:
        """A recorder when ``GOODPUT_RECORDS`` is set to a true value, else None."""
        if not RECORDS.on():
            return None
        return cls(run_dir, rank=rank, attempt=attempt, world=world)

    def batch(self, step: int, *, loaders: Iterable[Any]) -> None:
        """Record that the batch of ``step`` was handed to the loop: its indices, marked ``"pending"``.

        The step's own record (:meth:`step`) follows once it is done. A rank killed in between, after its
        gradients were summed into its peers' step, leaves this one: under warm restarts the peers complete the
        step and the job adopts it, so the samples were trained though the rank never recorded the step done.
        """
        self._open(step)
        self._write({"step": step, "pending": True, **_batch_fields(_last_indices(loaders))})

    def step(self, step: int, *, loaders: Iterable[Any], loss: float | None) -> None:
        """Record finished ``step``: the indices of the batch a loader delivered last, and the loss."""
        self._open(step)
        self._write(
            {
                "step": step,
                **_batch_fields(_last_indices(loaders)),
                "loss": None if loss is None else float(loss).hex(),
                "rng": rng_digests(),
            }
        )

    def _open(self, step: int) -> None:
        """Open the attempt's file at its first record (``step``), writing the header."""
        if self._fd is None:
            os.makedirs(self.folder, exist_ok=True)
            path = os.path.join(self.folder, f"attempt-{self.attempt}.rank-{self.rank}.jsonl")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            header = {"attempt": self.attempt, "rank": self.rank, "resumed": step - 1, "world": self.world}
            self._write(header)

    def final(self, state: Any, step: int) -> None:
        """Record the digests of the final training state (a ``TrainingState``) after ``step``."""
        os.makedirs(self.folder, exist_ok=True)
        record = {"attempt": self.attempt, "step": step, "world": self.world, "state": state_digests(state)}
        path = os.path.join(self.folder, f"final.rank-{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    def close(self) -> None:
        """Close the step file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self, record: dict[str, Any]) -> None:
        assert self._fd is not None
        os.write(self._fd, (json.dumps(record) + "\n").encode())


def rng_digests() -> dict[str, str]:
    """A short digest of each random generator's state (python, numpy, torch, and cuda when in use).

    The same generators :func:`goodput.checkpoint.rng.capture_rng` saves, hashed from their raw state (cheap
    enough for every step).
    """
    import random
    from array import array

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    digests = {
        "python": _digest(array("Q", internal).tobytes(), repr((version, gauss)).encode()),
        "numpy": _digest(np.asarray(key).tobytes(), repr((kind, pos, has_gauss, cached)).encode()),
        "torch": _digest(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        digests["cuda"] = _digest(*(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()))
    return digests


def _batch_fields(indices: Any) -> dict[str, Any]:
    """A record's fields for a batch's dataset indices (None each when no loader knows them)."""
    return {
        "samples": None if indices is None else indices_digest(indices),
        "count": None if indices is None else len(indices),
        "ids": None if indices is None else _ids(indices),
    }


def _ids(indices: Any) -> list[int]:
    import numpy as np

    return [int(i) for i in np.asarray(indices, dtype="<i8").reshape(-1)]


def _last_indices(loaders: Iterable[Any]) -> Any:
    """The delivered batch's indices from the first loader that knows them (None: none does)."""
    for loader in loaders:
        indices = getattr(loader, "last_indices", None)
        if indices is not None:
            return indices
    return None


# -- the final state ------------------------------------------------------------------------------------------


def state_digests(state: Any) -> dict[str, str]:
    """Piece name -> digest (or short value) of every leaf of a ``TrainingState``, in the state's order.

    Names read like the state: ``model.fc.weight``, ``optimizer.state.fc.weight.exp_avg``,
    ``scheduler.last_epoch``, ``step``, ``rng.torch``, ``loader.consumed``. Sharded tensors contribute this
    rank's shard, so every rank records what it holds.
    """
    pieces: dict[str, str] = {}
    for key, value in state.state_dict().items():
        if key == "meta":
            meta = json.loads(value)
            pieces["step"] = str(meta.pop("step"))
            _flatten(meta, "", pieces)
        elif re.fullmatch(r"rank\d+", key):
            _flatten(json.loads(value), "", pieces)  # rng.* and loader.*: this rank's own entry
        else:
            _flatten(value, "optimizer" if key == "optim" else key, pieces)
    return pieces


def _flatten(value: Any, name: str, out: dict[str, str]) -> None:
    import torch

    prefix = f"{name}." if name else ""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}{key}", out)
    elif isinstance(value, list | tuple) and any(isinstance(v, Mapping | torch.Tensor) for v in value):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}{i}", out)
    elif isinstance(value, torch.Tensor):
        out[name] = _tensor_digest(value)
    else:
        text = json.dumps(value, sort_keys=True, default=lambda v: f"<{type(v).__name__}>")
        out[name] = text if len(text) <= _SHORT else "json:" + _digest(text.encode())


def _tensor_digest(tensor: Any) -> str:
    import torch

    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor: this rank's shard
    t = local.detach().cpu().contiguous()
    header = f"{t.dtype}:{tuple(t.shape)}".encode()
    return "tensor:" + _digest(header, t.reshape(-1).view(torch.uint8).numpy().tobytes())

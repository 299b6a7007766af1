"""The ``torch_save`` strategy: rank 0 gathers the full state and writes one file with ``torch.save``.

The baseline every figure is compared to, and the single-file export. The other ranks wait while rank 0
writes. Reading uses ``torch.load(weights_only=True)``: no code from the file runs.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

from goodput.checkpoint.durable.manifest import new_hasher
from goodput.checkpoint.durable.strategy import Completion, SaveContext
from goodput.checkpoint.state import TrainingState, check_shapes, tensor_shapes
from goodput.errors import CheckpointCorrupt

__all__ = ["TorchSaveStrategy"]

STATE_FILE = "state.pt"


class _WriteErrors(io.RawIOBase):
    """A pass-through file that remembers the OSError of a failed write (torch.save replaces it with an
    opaque "unexpected pos" RuntimeError, hiding e.g. "No space left on device")."""

    def __init__(self, raw: Any, algorithm: str | None = None) -> None:
        super().__init__()
        self.raw = raw
        self.error: OSError | None = None
        self.hasher = new_hasher(algorithm) if algorithm else None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.hasher is not None:
            view = memoryview(data)
            self.hasher.update(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
        try:
            return int(self.raw.write(data))
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.raw.flush()


def _save_reporting_os_errors(obj: Any, raw: Any, algorithm: str | None = None) -> str | None:
    """torch.save ``obj`` into ``raw``; returns ``"<algorithm>:<hex>"`` of the bytes written (None: no algorithm)."""
    sink = _WriteErrors(raw, algorithm)
    try:
        torch.save(obj, sink)  # type: ignore[arg-type]  # a RawIOBase is a binary file
        sink.flush()
    except RuntimeError:
        if sink.error is not None:
            raise sink.error from None
        raise
    return f"{algorithm}:{sink.hasher.hexdigest()}" if sink.hasher is not None else None


class TorchSaveStrategy:
    """Full state on rank 0, one ``torch.save`` file."""

    name = "torch_save"
    is_async = False

    def save(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        full = state.full_state_dict(group=ctx.group)
        if ctx.rank != 0:
            return list
        path = ctx.layout.path_in(folder, STATE_FILE)
        opener = open(path, "wb") if ctx.layout.local else ctx.layout.fs.open(path, "wb")  # noqa: SIM115
        with opener as f:
            digest = _save_reporting_os_errors(full, f, ctx.options.get("checksum"))
            if ctx.layout.local:
                f.flush()
                os.fsync(f.fileno())
        return lambda: {STATE_FILE: digest}

    def load(self, state: TrainingState, folder: str, ctx: SaveContext) -> None:
        path = ctx.layout.path_in(folder, STATE_FILE)
        try:
            if ctx.layout.local:
                full = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            else:
                with ctx.layout.fs.open(path, "rb") as f:
                    full = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
            raise CheckpointCorrupt(
                f"{path}: unreadable or refused by weights_only loading ({err})"
            ) from None
        if not isinstance(full, dict):
            raise CheckpointCorrupt(f"{path}: holds a {type(full).__name__}, not a goodput state")
        expected = {
            k: v for k, v in tensor_shapes(state.state_dict()).items() if k.startswith(("model.", "optim."))
        }
        saved = {k: v for k, v in tensor_shapes(full).items() if k.startswith(("model.", "optim."))}
        check_shapes(expected, saved)
        state.load_full_state_dict(full)

    def close(self) -> None:
        pass

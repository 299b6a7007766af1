"""``Stager``: copy a state dict into buffers that live across saves, at the speed of a plain copy.

An asynchronous save must snapshot the state before training changes it again; that copy is the only part of
the save that blocks training. ``Stager.stage(state_dict)`` walks the (nested) state dict and copies every
tensor into a buffer it allocated on the first save and reuses on every later one (pinned host memory when
CUDA is up, so device-to-host copies run at full speed and without an extra bounce; plain host memory on
CPU). Sharded tensors (``DTensor``) are staged as DTensors over the staged local shard, with the same mesh and
placements, so DCP writes them exactly as it would the originals. Non-tensor values are deep-copied (they are
small: counters, JSON strings, RNG states).

Buffers are keyed by the value's path in the dict and reallocated only when its shape, stride, dtype or
sharding changes. The staged dict stays valid until the next ``stage`` call (which overwrites the buffers):
the caller must finish using it (the background write) first. The RAM checkpoint tier can keep the staged
dict as its in-memory copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Stager"]


@dataclass
class _Slot:
    """One reused buffer and (for a DTensor) the staged DTensor that wraps it."""

    key: tuple[Any, ...]  # what the buffer was made for: shape, stride, dtype, sharding
    buffer: torch.Tensor
    staged: torch.Tensor


def _dtensor_class() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


class Stager:
    """Copies state dicts into reused host buffers.

    Args:
        pin_memory: allocate pinned buffers (None: when CUDA is available). Pinned memory needs an accelerator.
    """

    def __init__(self, *, pin_memory: bool | None = None) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._slots: dict[str, _Slot] = {}
        self._dtensor = _dtensor_class()
        self._cuda_copies = False
        self._pending: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # host copies of one stage()

    @property
    def nbytes(self) -> int:
        """Bytes held in staging buffers."""
        return sum(s.buffer.numel() * s.buffer.element_size() for s in self._slots.values())

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` whose tensors live in this stager's buffers (valid until the next call)."""
        self._cuda_copies = False
        self._pending = ([], [])
        seen: set[str] = set()
        staged = self._copy(state_dict, "", seen)
        for stale in set(self._slots) - seen:  # keys that left the state dict free their buffers
            del self._slots[stale]
        targets, sources = self._pending
        if targets:  # the host tensors' copies in one batched call (~5 us of dispatch per tensor saved)
            with torch.no_grad():
                torch._foreach_copy_(targets, sources)
        self._pending = ([], [])
        if self._cuda_copies:
            torch.cuda.synchronize()  # non-blocking device-to-host copies must land before the write reads them
        return staged

    def close(self) -> None:
        """Release every buffer."""
        self._slots.clear()

    # ---- walking --------------------------------------------------------------------------------------------
    def _copy(self, value: Any, path: str, seen: set[str]) -> Any:
        if isinstance(value, torch.Tensor):
            seen.add(path)
            return self._stage_tensor(value, path)
        if isinstance(value, dict):
            return {k: self._copy(v, f"{path}/{k}", seen) for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(value)]
            return items if isinstance(value, list) else type(value)(items)
        if isinstance(value, str | int | float | bool | bytes) or value is None:
            return value  # immutable
        return copy.deepcopy(value)

    def _stage_tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        dtensor = self._dtensor is not None and isinstance(tensor, self._dtensor)
        local = tensor.to_local() if dtensor else tensor  # type: ignore[attr-defined]
        sharding: tuple[Any, ...] = (
            (tensor.device_mesh, tuple(tensor.placements), tuple(tensor.shape), tuple(tensor.stride()))  # type: ignore[attr-defined]
            if dtensor
            else ()
        )
        key = (tuple(local.shape), tuple(local.stride()), local.dtype, sharding)
        slot = self._slots.get(path)
        if slot is None or slot.key != key:
            slot = self._allocate(tensor, local, key, dtensor)
            self._slots[path] = slot
        if local.device.type == "cpu" and local.numel():
            self._pending[0].append(slot.buffer)
            self._pending[1].append(local)
            return slot.staged
        non_blocking = local.device.type == "cuda" and self.pin_memory
        self._cuda_copies = self._cuda_copies or local.device.type == "cuda"
        slot.buffer.copy_(local.detach(), non_blocking=non_blocking)
        return slot.staged

    def _allocate(
        self, tensor: torch.Tensor, local: torch.Tensor, key: tuple[Any, ...], dtensor: bool
    ) -> _Slot:
        if local.is_contiguous() or _dense(local):
            buffer = torch.empty_strided(
                local.shape, local.stride(), dtype=local.dtype, device="cpu", pin_memory=self.pin_memory
            )
        else:
            buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=self.pin_memory)
        if not dtensor:
            return _Slot(key, buffer, buffer)
        assert self._dtensor is not None
        staged = self._dtensor.from_local(  # type: ignore[attr-defined]
            buffer,
            tensor.device_mesh,  # type: ignore[attr-defined]
            tensor.placements,  # type: ignore[attr-defined]
            run_check=False,
            shape=tensor.shape,
            stride=tensor.stride(),
        )
        return _Slot(key, buffer, staged)


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s strides describe a dense, non-overlapping layout (so a buffer can copy them)."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True

"""DCP's sharded state dict of an unsharded model, without DCP's per-call walk over the module tree.

``torch.distributed.checkpoint.state_dict.get_state_dict`` works out every parameter's fully qualified name on
each call (and checks its options): most of a memory-tier save's blocking time for a small model, once per
save. For a model whose parameters are plain
tensors (a module or DDP, not FSDP), its answer is ``model.state_dict()`` with the wrapper's prefix dropped,
and ``optimizer.state_dict()`` with parameter numbers replaced by those names. So the first call asks DCP,
learns from its answer which ``model.state_dict()`` key and which parameter number each of its keys is, and
checks that the cheap form gives the same answer: the same keys in the same order, the same tensors (the same
memory), equal plain values. Later calls build the cheap form while the model's keys and the optimizer's
numbering stay as they were, and ask DCP again (learning anew) when they change: an optimizer that creates its
state at the first step, a parameter group added. Anything the cheap form cannot reproduce (a sharded or
DTensor parameter, keys DCP renames another way) keeps DCP's answer on every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StateDictCache", "has_dtensor_params"]


@dataclass
class _Plan:
    model_keys: list[str]  # model.state_dict()'s keys, in order
    renamed: list[tuple[str, str]]  # (DCP's key, model.state_dict()'s key), in DCP's order
    numbers: list[list[int]]  # per parameter group: the optimizer's parameter numbers
    names: dict[int, str]  # parameter number -> DCP's name
    state_order: list[int]  # parameter numbers in the order of DCP's optimizer "state"


class StateDictCache:
    """``get_state_dict(model, optimizer)`` (sharded form) for one model and optimizer, cheap after the first."""

    def __init__(self) -> None:
        self._plan: _Plan | None = None
        self._unusable = False
        self._misses = 0  # plans that could not be learned: after a few, DCP answers every call

    def get(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if not self._unusable and self._plan is not None:
            cheap = _cheap(self._plan, model.state_dict(), optimizer.state_dict())
            if cheap is not None:
                return cheap
        return self._learn(model, optimizer)

    def _learn(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        reference = get_state_dict(model, optimizer, options=StateDictOptions())
        self._plan = None
        if not self._unusable:
            sharded = _sharded(model)
            if not sharded:
                self._plan = _learn_plan(reference, model.state_dict(), optimizer.state_dict())
            self._misses += self._plan is None
            self._unusable = sharded or self._misses >= 3
        return reference


def has_dtensor_params(model: torch.nn.Module | None) -> bool:
    """Whether any parameter is a DTensor (FSDP2/TP): no rank holds the whole state."""
    if model is None:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _sharded(model: torch.nn.Module) -> bool:
    if has_dtensor_params(model):
        return True
    return any(
        "FullyShardedDataParallel" in type(m).__name__ or hasattr(m, "_fsdp_state") for m in model.modules()
    )


def _learn_plan(
    reference: tuple[dict[str, Any], dict[str, Any]], raw_model: dict[str, Any], raw_optim: dict[str, Any]
) -> _Plan | None:
    """How DCP's answer maps onto the plain state dicts, or None when the cheap form would differ."""
    ref_model, ref_optim = reference
    by_storage = {_identity(t): k for k, t in raw_model.items() if isinstance(t, torch.Tensor)}
    renamed = []
    for key, value in ref_model.items():
        raw_key = by_storage.get(_identity(value)) if isinstance(value, torch.Tensor) else None
        if raw_key is None:
            return None
        renamed.append((key, raw_key))
    groups, ref_groups = raw_optim.get("param_groups", []), ref_optim.get("param_groups", [])
    if len(groups) != len(ref_groups):
        return None
    names: dict[int, str] = {}
    for group, ref_group in zip(groups, ref_groups, strict=True):
        if len(group["params"]) != len(ref_group["params"]):
            return None
        names.update(zip(group["params"], ref_group["params"], strict=True))
    numbers_of = {name: number for number, name in names.items()}
    try:
        state_order = [numbers_of[name] for name in ref_optim.get("state", {})]
    except KeyError:
        return None
    plan = _Plan(
        model_keys=list(raw_model),
        renamed=renamed,
        numbers=[list(g["params"]) for g in groups],
        names=names,
        state_order=state_order,
    )
    cheap = _cheap(plan, raw_model, raw_optim)
    return plan if cheap is not None and _same(cheap, reference) else None


def _cheap(
    plan: _Plan, raw_model: dict[str, Any], raw_optim: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The cheap form, or None when the model's keys or the optimizer's numbering changed since the plan."""
    if list(raw_model) != plan.model_keys:
        return None
    groups = raw_optim.get("param_groups", [])
    if [list(g["params"]) for g in groups] != plan.numbers:
        return None
    state = raw_optim.get("state", {})
    if len(state) != len(plan.state_order) or any(n not in state for n in plan.state_order):
        return None
    model_sd = {key: raw_model[raw_key] for key, raw_key in plan.renamed}
    optim_sd = {
        "state": {plan.names[n]: state[n] for n in plan.state_order},
        "param_groups": [{**g, "params": [plan.names[n] for n in g["params"]]} for g in groups],
    }
    return model_sd, optim_sd


def _identity(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.device)


def _same(a: Any, b: Any) -> bool:
    """The same structure, keys in the same order, the same tensors (same memory) and equal plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _identity(a) == _identity(b)
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or list(a) != list(b):
            return False
        return all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)

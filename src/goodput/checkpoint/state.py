"""The complete training state as one DCP ``Stateful``: everything a resumed run needs to be the same run.

Layout of the state dict (constant keys):

- ``model``, ``optim``: from ``torch.distributed.checkpoint.state_dict`` (plain, DDP and FSDP2 models alike);
- ``scheduler``, ``scaler``: their own ``state_dict()`` (absent when not given);
- ``meta``: a JSON string with step, samples/tokens seen and the user's extras (the same on every rank);
- ``rank<r>``: a JSON string with rank r's RNG states and data-loader position. DCP hands a non-tensor value
  saved under one key by every rank back as ONE rank's value, so per-rank values live under per-rank keys.

Restoring on another world size: the model and optimizer are resharded (DCP) or loaded whole on every rank
(``torch_save``); scheduler, step and extras are shared. A rank that exists in both runs gets its own RNG states
back. A rank the saving run did not have takes the data position from ``rank0`` (positions are global, the same
on every rank) and seeds its RNGs by :func:`~goodput.checkpoint.rng.rank_seed` ``(seed, rank, step)``, where
``seed`` is ``TrainingState(seed=...)``, else the ``seed`` of the saved data position, else 0. Entries of ranks
this run does not have are not read.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from goodput.checkpoint._state_cache import StateDictCache
from goodput.checkpoint.rng import capture_rng, restore_rng, seed_new_rank
from goodput.errors import ConfigError, StateMismatch

__all__ = ["LoaderState", "TrainingState", "check_shapes", "tensor_shapes"]


class LoaderState(Protocol):
    """Anything whose position can be saved: ``state_dict()`` returns a JSON-able dict."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class TrainingState(Stateful):
    """Model, optimizer, scheduler, scaler, progress counters, data position, RNG and user extras.

    Args:
        model: the module being trained (plain, DDP or FSDP2).
        optimizer: its optimizer, if any.
        scheduler: an LR scheduler, if any.
        scaler: a ``torch.amp.GradScaler``, if any.
        loader: any object with ``state_dict()``/``load_state_dict()`` over JSON-able dicts (per rank).
        extras: user values (JSON-able), restored into ``extras``.
        seed: the run's seed, for the RNGs of ranks added on resume (None: the data position's seed, else 0).
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        loader: LoaderState | None = None,
        extras: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        _check_loader(loader)
        self.model = model
        self.seed = seed
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.loader = loader
        self.extras: dict[str, Any] = dict(extras or {})
        self._sharded_form = (
            StateDictCache()
        )  # model and optimizer, DCP's sharded form, cheap after the first
        self.step = 0
        self.samples_seen = 0
        self.tokens_seen = 0

    # ---- Stateful (the sharded form DCP saves) ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The sharded state dict: each rank holds its own shards plus its own ``rank<r>`` entry."""
        sd = self._shared(full=False)
        sd[f"rank{_rank()}"] = self.rank_state()
        return sd

    def load_target(self, saved_keys: Collection[str]) -> dict[str, Any]:
        """The state dict for DCP to fill from a checkpoint whose top-level keys are ``saved_keys``.

        It asks for this rank's own entry when the saving run had this rank, else for rank 0's (a rank added
        on resume: only its data position is used).
        """
        sd = self.state_dict()
        mine = f"rank{_rank()}"
        if mine not in saved_keys and "rank0" in saved_keys:
            sd["rank0"] = sd.pop(mine)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict produced by :meth:`state_dict` or :meth:`load_target` (after DCP filled it)."""
        self.load_shared(state_dict, full=False)
        self.load_rank_entry(state_dict)

    # ---- the full form (torch_save) ----------------------------------------------------------------------
    def full_state_dict(self, group: Any = None) -> dict[str, Any]:
        """The complete state gathered for rank 0 (model/optimizer unsharded on CPU, every rank's entry).

        A collective over ``group``: every rank must call it. Only rank 0's return value is complete.
        """
        sd = self._shared(full=True)
        mine = self.rank_state()
        if _world() > 1:
            gathered: list[Any] = [None] * _world() if _rank() == 0 else []
            dist.gather_object(mine, gathered if _rank() == 0 else None, dst=0, group=group)
            for r, entry in enumerate(gathered):
                sd[f"rank{r}"] = entry
        else:
            sd["rank0"] = mine
        return sd

    def load_full_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a complete state (every rank holds the whole dict, e.g. from ``torch.load``)."""
        self.load_shared(dict(state_dict), full=True)
        self.load_rank_entry(state_dict)

    def load_rank_entry(self, state_dict: Mapping[str, Any]) -> None:
        """This rank's own entry; for a rank the saving run did not have, rank 0's position and seeded RNGs."""
        key = f"rank{_rank()}"
        if key in state_dict:
            self.load_rank_state(state_dict[key])
            return
        if "rank0" not in state_dict:
            raise StateMismatch(f"the checkpoint holds no per-rank state (no {key}, no rank0)")
        self.load_rank_state(state_dict["rank0"], rng=False)
        seed_new_rank(self.new_rank_seed(json.loads(state_dict["rank0"]).get("loader")), _rank(), self.step)

    # ---- parts --------------------------------------------------------------------------------------------
    def rank_state(self) -> str:
        """This rank's RNG states and data position, as a JSON string."""
        loader = self.loader.state_dict() if self.loader is not None else None
        try:
            return json.dumps({"rng": capture_rng(), "loader": loader})
        except TypeError as err:
            raise TypeError(f"loader.state_dict() must return JSON-able values: {err}") from None

    def load_rank_state(self, text: str, *, rng: bool = True) -> None:
        """Restore an entry made by :meth:`rank_state` (``rng=False``: only the data position)."""
        entry = json.loads(text)
        if rng:
            restore_rng(entry["rng"])
        if self.loader is not None:
            if entry["loader"] is None:
                raise StateMismatch("the checkpoint holds no data-loader position, but a loader was given")
            self.loader.load_state_dict(entry["loader"])

    def new_rank_seed(self, loader: Any) -> int:
        """The seed for the RNGs of a rank the saving run did not have: ours, else the seed of the saved data
        position ``loader`` (its ``state_dict()``), else 0. A warm grow seeds its newcomers with it too."""
        if self.seed is not None:
            return int(self.seed)
        seed = loader.get("seed") if isinstance(loader, dict) else None
        return seed if isinstance(seed, int) and seed >= 0 else 0

    def _shared(self, *, full: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        sd: dict[str, Any] = {}
        options = StateDictOptions(full_state_dict=full, cpu_offload=full)
        if self.model is not None and self.optimizer is not None and not full:
            sd["model"], sd["optim"] = self._sharded_form.get(self.model, self.optimizer)
        elif self.model is not None and self.optimizer is not None:
            sd["model"], sd["optim"] = get_state_dict(self.model, self.optimizer, options=options)
        elif self.model is not None:
            sd["model"] = get_model_state_dict(self.model, options=options)
        if self.scheduler is not None:
            sd["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        sd["meta"] = self._meta()
        return sd

    def _meta(self) -> str:
        meta = {
            "step": self.step,
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "extras": self.extras,
        }
        try:
            return json.dumps(meta)
        except TypeError as err:
            raise TypeError(f"TrainingState.extras must be JSON-able: {err}") from None

    def _load_meta(self, text: str) -> None:
        meta = json.loads(text)
        self.step = int(meta["step"])
        self.samples_seen = int(meta["samples_seen"])
        self.tokens_seen = int(meta["tokens_seen"])
        self.extras = dict(meta["extras"])

    def load_shared(self, sd: dict[str, Any], *, full: bool) -> None:
        """Load the parts every rank shares (model, optimizer, scheduler, scaler, extras) from ``sd``;
        ``full``: ``sd`` holds full (unsharded) tensors, as a ``torch_save`` checkpoint does."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # A whole (not sharded) model's full state dict is its local one. Loaded as full, torch's optimizer
        # load asserts it can find a device among the optimizer's tensors; an optimizer that keeps none (SGD
        # without momentum) has the same text in both forms, so it loads as local.
        whole = self.model is None or self.holds_full_replica()
        options = StateDictOptions(full_state_dict=full and not whole, strict=True)
        if self.model is not None and self.optimizer is not None:  # before the model, as set_state_dict does
            optim_full = options.full_state_dict and _holds_tensors(sd["optim"])
            optim_options = StateDictOptions(full_state_dict=optim_full, strict=True)
            set_optimizer_state_dict(self.model, self.optimizer, sd["optim"], options=optim_options)
        if self.model is not None:
            set_model_state_dict(self.model, sd["model"], options=options)
        for name in ("scheduler", "scaler"):
            part = getattr(self, name)
            if part is not None:
                if name not in sd:
                    raise StateMismatch(f"the checkpoint holds no {name} state, but a {name} was given")
                part.load_state_dict(sd[name])
        self._load_meta(sd["meta"])

    # ---- the live form (warm restarts) -----------------------------------------------------------------------
    def live_state_dict(self, loader: Any = None) -> dict[str, Any]:
        """This process's replica as the parts' own state dicts, with no collective: what a survivor hands a
        new generation after a peer died (its group is gone). ``loader``: the data position to hand on (the
        one of its last completed step), as JSON text under ``loader``; the RNG travels apart (per rank)."""
        sd = {
            name: _bare(part).state_dict()
            for name in _LIVE_PARTS
            if (part := getattr(self, name)) is not None
        }
        sd["meta"] = self._meta()
        sd["loader"] = json.dumps(loader)
        return sd

    def holds_full_replica(self) -> bool:
        """Whether this rank's model is whole (not FSDP/DTensor shards), so :meth:`live_state_dict` is a replica
        another rank can load."""
        from goodput.checkpoint._state_cache import has_dtensor_params

        return not has_dtensor_params(self.model)

    def load_live_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Load what :meth:`live_state_dict` gave on another rank (tensors on the CPU: copied into place)."""
        for name in _LIVE_PARTS:
            part = getattr(self, name)
            if part is not None and name in sd:
                _bare(part).load_state_dict(sd[name])
        if "meta" in sd:
            self._load_meta(sd["meta"])
        loader = json.loads(sd.get("loader") or "null")
        if self.loader is not None and loader is not None:
            self.loader.load_state_dict(loader)


_LIVE_PARTS = ("model", "optimizer", "scheduler", "scaler")


def _holds_tensors(sd: Any) -> bool:
    """Whether a state dict holds a tensor of one or more dimensions (what torch's full-form load needs)."""
    import torch
    from torch.utils._pytree import tree_flatten

    return any(torch.is_tensor(leaf) and leaf.dim() > 0 for leaf in tree_flatten(sd)[0])


def _bare(part: Any) -> Any:
    """The module inside a DDP wrapper (else ``part``): a replica's keys are then the same whether or not the
    rank that loads it wraps its model, as after a shrink to one rank."""
    return part.module if isinstance(part, torch.nn.parallel.DistributedDataParallel) else part


def tensor_shapes(sd: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Every tensor in a nested state dict by its dotted key (DCP's flattening), with its global shape."""
    out: dict[str, tuple[int, ...]] = {}
    for key, value in sd.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            out[name] = tuple(value.shape)
        elif isinstance(value, Mapping):
            out.update(tensor_shapes(value, f"{name}."))
    return out


def check_shapes(expected: Mapping[str, tuple[int, ...]], saved: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a checkpoint that does not fit: a missing, unexpected or differently shaped model/optimizer tensor.

    Raises:
        StateMismatch: naming the first differing key and both shapes.
    """
    for key, shape in sorted(expected.items()):
        if key not in saved:
            raise StateMismatch(f"{key}: the checkpoint has no such tensor (this run's shape {list(shape)})")
        if tuple(saved[key]) != tuple(shape):
            raise StateMismatch(
                f"{key}: the checkpoint has shape {list(saved[key])}, this run has {list(shape)}"
            )
    for key, shape in sorted(saved.items()):
        if key.startswith("model.") and key not in expected:
            raise StateMismatch(f"{key}: in the checkpoint (shape {list(shape)}) but not in this run's model")


def _check_loader(loader: Any) -> None:
    """Refuse a loader whose position a checkpoint cannot hold, now rather than at the first save."""
    if loader is None:
        return
    missing = [
        name for name in ("state_dict", "load_state_dict") if not callable(getattr(loader, name, None))
    ]
    if missing:
        raise ConfigError(
            f"the loader ({type(loader).__name__}) has no {'/'.join(m + '()' for m in missing)}, so a checkpoint "
            "cannot hold its position: use goodput.ResumableLoader (exactly once across restarts) or a loader "
            "with state_dict()/load_state_dict(), or leave it out of restore(loader=...) (a resume then starts "
            "its epoch over)"
        )

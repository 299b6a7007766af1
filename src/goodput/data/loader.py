"""ResumableLoader: torch's DataLoader with an exactly-once, resumable position and ``fetch_seconds``.

A drop-in iterable for a training loop over a map-style dataset. The batches come from a real
:class:`torch.utils.data.DataLoader` (workers, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``)
driven by goodput's :class:`~goodput.data.sampler.ResumableSampler`. A sample counts as consumed when the loop
receives its batch, so ``state_dict()`` taken at a step boundary and restored into a fresh loader (any number
of workers, any world size) continues with exactly the samples not yet seen. Ranks are assumed to step in
lockstep (data parallelism), so the state is the same on every rank: save it once or under a shared key.

Epochs: a finished iteration moves the position to the start of the next epoch, so iterating the loader again
runs the next epoch; ``set_epoch(e)`` jumps to the start of epoch ``e`` and is a no-op when the position is
already in ``e`` (the usual ``for e in range(...): loader.set_epoch(e)`` loop keeps a restored position).

Batch sizes and world-size changes: ``batch_size`` is per rank; one step of ``W`` ranks consumes the next
``W * batch_size`` samples of the epoch's order. Resuming on a different ``W`` continues from the same global
position, so the global batch becomes ``W' * batch_size``; to keep a global batch ``G`` (e.g. for the
learning-rate schedule) pass ``batch_size=G // W'``, which needs ``G`` divisible by every world size you resume
on, or pass ``global_batch_size=G``, which refuses (ConfigError, before any work) a world size that does not
divide ``G``. Exactly-once needs nothing more: positions are counted in samples, not steps. No constraint ties the batch size to the dataset size: the
epoch's last, partial step is dropped with ``drop_last=True`` (at most ``W * batch_size - 1`` samples, as many
as the world size at the end of the epoch decides) or, with ``drop_last=False`` (every sample exactly once),
split over the ranks as evenly as possible. When fewer samples than ranks are left for that last step, the
higher ranks get none and finish the epoch one step early: with DDP use ``drop_last=True`` or a dataset size
whose last step has at least ``W`` samples.

Dataset hooks (all optional):

* ``get_seeded(index, seed)``: called instead of ``dataset[index]`` with
  :func:`~goodput.data.order.sample_seed` ``(seed, epoch, index)``, for augmentations that must not depend on
  workers, ranks or restarts (``torch.Generator().manual_seed(seed)`` is
  :func:`~goodput.data.randomness.sample_rng` ``(index, epoch, seed)``).

Randomness: the loader never draws from torch's global generator. Its DataLoader has a generator of its own,
reseeded at the start of every iteration from :func:`~goodput.data.randomness.loader_seed` ``(seed, epoch,
rank)``, so the workers' seeds are a pure function of those three and a resumed run's training-loop random
stream (dropout, ``torch.rand``) is exactly the uninterrupted run's.
* ``prefetch(indices)``: called from the main process with this rank's upcoming sample indices in exact order;
  the first call covers ``lookahead`` batches and each delivered batch adds the next one, so the calls
  concatenated are the rank's order from the resume point on.
* ``shard_sizes``: samples per shard (contiguous in index order); with ``shard_window=k`` the order shuffles
  the shards and then samples within windows of ``k`` shards, so reads stay local.
* ``fingerprint`` (a str): the dataset's identity in the saved position (else the class name).
* ``close()``: called by :meth:`ResumableLoader.close` to let go of open files and stop background prefetching;
  the dataset must stay readable afterwards (goodput's formats reopen what they need).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from goodput.data._global_batch import per_rank_batch
from goodput.data._workers import EndWithParent
from goodput.data.fetch_times import FetchTimes
from goodput.data.randomness import loader_seed
from goodput.data.sampler import BatchPlan, ResumableSampler
from goodput.errors import ConfigError, DataError

__all__ = ["FetchTimes", "LoaderConfig", "ResumableLoader"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How a :class:`ResumableLoader` batches, orders and loads (validated on construction).

    Args:
        batch_size: samples per batch on each rank.
        seed: seed of the sample order and the per-sample seeds.
        shuffle: shuffle the order each epoch (False: dataset order).
        drop_last: drop the epoch's last, partial step instead of splitting it over the ranks.
        num_workers: DataLoader worker processes (0: load in the main process).
        pin_memory: DataLoader pins batches for fast copies to the GPU.
        prefetch_factor: batches each worker loads ahead (DataLoader's; needs workers).
        persistent_workers: keep workers between epochs (needs workers).
        shard_window: with a dataset that has ``shard_sizes``, shuffle shards and then samples within windows
            of this many shards (None: global shuffle).
        lookahead: batches of upcoming indices given to ``dataset.prefetch`` (None: the DataLoader's depth + 2).
        allow_fingerprint_mismatch: warn instead of raising when restoring a position saved for other data.
    """

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    shard_window: int | None = None
    lookahead: int | None = None
    allow_fingerprint_mismatch: bool = False

    def __post_init__(self) -> None:
        _positive_int("batch_size", self.batch_size)
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be a non-negative integer, got {self.num_workers!r}")
        if self.prefetch_factor is not None:
            _positive_int("prefetch_factor", self.prefetch_factor)
            if self.num_workers == 0:
                raise ConfigError(
                    "prefetch_factor needs num_workers > 0 (the main process does not prefetch)"
                )
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError("persistent_workers=True needs num_workers > 0")
        if self.shard_window is not None:
            _positive_int("shard_window", self.shard_window)
            if not self.shuffle:
                raise ConfigError("shard_window has no effect with shuffle=False; drop one of them")
        if self.lookahead is not None:
            _positive_int("lookahead", self.lookahead)

    def default_lookahead(self) -> int:
        """Batches given to ``dataset.prefetch`` ahead: deeper than the DataLoader's own prefetch."""
        if self.lookahead is not None:
            return self.lookahead
        in_flight = (self.prefetch_factor or 2) * self.num_workers
        return max(in_flight, 1) + 2


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


class _SeededView:
    """What the DataLoader fetches from when the dataset takes per-sample seeds: keys are (index, seed)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.dataset.get_seeded(*key)


class _Iteration:
    """One iteration: the plan, the DataLoader iterator, and the bookkeeping of delivered batches.

    ``pull`` may run on a prefetching thread; ``deliver`` and ``finish`` run on the training loop's thread.
    """

    def __init__(self, loader: ResumableLoader) -> None:
        self._sampler = loader.sampler
        self._times = loader.fetch_seconds
        hook = getattr(loader.dataset, "prefetch", None)
        self._prefetch: Callable[[Sequence[int]], None] | None = hook if callable(hook) else None
        self._lookahead = loader.config.default_lookahead()
        self.plan: BatchPlan = self._sampler.begin()
        self._step = 0
        if self._prefetch is not None:
            ahead = [self.plan.indices(s) for s in range(min(self._lookahead, self.plan.count))]
            if ahead:
                self._prefetch(np.concatenate(ahead).tolist())
        # The DataLoader draws its workers' base seed from this generator, never from torch's global one.
        loader.generator.manual_seed(
            loader_seed(self._sampler.seed, self.plan.order.epoch, self._sampler.rank)
        )
        loader._worker_init.starting()
        self._batches: Iterator[Any] = iter(loader.dataloader)

    def pull(self) -> Any:
        """The next batch from the DataLoader (raises StopIteration at the end); does not move the position."""
        return next(self._batches)

    def deliver(self, wait_seconds: float) -> None:
        """The training loop received the next batch after waiting ``wait_seconds``."""
        self._sampler.delivered(self.plan, self._step)
        self._times.record(wait_seconds)
        ahead = self._step + self._lookahead
        if self._prefetch is not None and ahead < self.plan.count:
            self._prefetch(self.plan.indices(ahead).tolist())
        self._step += 1

    def finish(self) -> None:
        """The DataLoader is exhausted: the position moves to the next epoch."""
        self._sampler.finished(self.plan)

    def close(self) -> None:
        """Shut the DataLoader's worker processes down now, not whenever the iterator is collected."""
        batches, self._batches = self._batches, _closed()
        shutdown = getattr(batches, "_shutdown_workers", None)  # what torch's iterator runs when deleted
        if callable(shutdown):
            shutdown()


def _closed() -> Iterator[Any]:
    """What a closed iteration pulls from: an error, not an end (which would move the position to the next epoch)."""
    raise DataError("the loader was closed during this iteration: iterate it again to go on")
    yield


class ResumableLoader:
    """A resumable, exactly-once iterable of batches over torch's DataLoader (see the module docstring).

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``), optionally with the hooks above.
        batch_size: samples per batch on each rank (or give ``global_batch_size``).
        global_batch_size: samples per step over all ranks, kept on any world size: each rank takes
            ``global_batch_size // world_size``; a world size that does not divide it is refused.
        seed, shuffle, drop_last, num_workers, pin_memory, prefetch_factor, persistent_workers,
        shard_window, lookahead, allow_fingerprint_mismatch: see :class:`LoaderConfig`.
        collate_fn: DataLoader's collate function (None: torch's default).
        rank: this process's rank (None: from torch.distributed when initialised, else 0).
        world_size: the number of ranks (None: from torch.distributed when initialised, else 1).
        fingerprint: the dataset's identity saved with the position (None: ``dataset.fingerprint`` or its
            class name).
        worker_init_fn: run in each worker process, after it is tied to this rank (the kernel ends it with
            the rank, see ``goodput.data._workers``).
        multiprocessing_context, timeout: passed to the DataLoader.

    Raises:
        ConfigError: a bad argument or an empty dataset.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None = None,
        global_batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        fingerprint: str | None = None,
        allow_fingerprint_mismatch: bool = False,
        shard_window: int | None = None,
        lookahead: int | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        timeout: float = 0.0,
    ) -> None:
        from torch.utils.data import DataLoader

        rank, world_size = _rank_and_world(rank, world_size)
        batch_size = per_rank_batch(batch_size, global_batch_size, world_size)
        self.global_batch_size = global_batch_size  # a step's samples over all ranks (None: per rank)
        self.config = LoaderConfig(
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            shard_window=shard_window,
            lookahead=lookahead,
            allow_fingerprint_mismatch=allow_fingerprint_mismatch,
        )
        self.dataset = dataset
        size = _dataset_size(dataset)
        seeded = callable(getattr(dataset, "get_seeded", None))
        self.sampler = ResumableSampler(
            size,
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            identity=_identity(dataset, fingerprint),
            shard_sizes=_shard_sizes(dataset, size) if shard_window is not None else None,
            shard_window=shard_window or 1,
            seeded=seeded,
            allow_fingerprint_mismatch=allow_fingerprint_mismatch,
        )
        self.fetch_seconds = FetchTimes()
        self._iteration: _Iteration | None = None  # the latest, for ``close``
        self.generator = torch.Generator()  # reseeded from (seed, epoch, rank) by every iteration
        source: Any = _SeededView(dataset) if seeded else dataset
        self._worker_init = EndWithParent(worker_init_fn)  # workers end with this rank, even a SIGKILLed one
        self.dataloader = DataLoader(
            source,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            worker_init_fn=self._worker_init,
            multiprocessing_context=multiprocessing_context,
            timeout=timeout,
            generator=self.generator,
        )

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(self.begin())

    def _iterate(self, iteration: _Iteration) -> Iterator[Any]:
        while True:
            start = time.perf_counter()
            try:
                batch = iteration.pull()
            except StopIteration:
                iteration.finish()
                return
            iteration.deliver(time.perf_counter() - start)
            yield batch

    def begin(self) -> _Iteration:
        """Start an iteration whose pulling and delivering are separate (for :class:`DevicePrefetcher`)."""
        self._iteration = _Iteration(self)
        return self._iteration

    def close(self) -> None:
        """Let go of what iterating started: the DataLoader's worker processes (persistent ones too) and, through
        the dataset's ``close()``, its open files and its prefetch plan, whose window stays pinned in the cache
        until read. A warm restart closes the loaders of the generation that failed: nothing reads them again,
        and a plan left running holds cache budget the next generation needs. The loader can be iterated again.
        """
        iteration, self._iteration = self._iteration, None
        if iteration is not None:
            iteration.close()
        self.dataloader._iterator = None  # a persistent workers' iterator, shut down above: iterate anew
        close = getattr(self.dataset, "close", None)
        if callable(close):
            close()

    def __len__(self) -> int:
        """This rank's batches in a whole epoch at the current world size."""
        return self.sampler.batches_per_epoch()

    @property
    def keeps_global_batch(self) -> bool:
        """Whether a step keeps ``global_batch_size`` on any world size (the per-rank batch follows it)."""
        return self.global_batch_size is not None

    @property
    def epoch(self) -> int:
        """The epoch of the current position."""
        return self.sampler.epoch

    @property
    def consumed(self) -> int:
        """Samples of the current epoch received by the training loops of all ranks."""
        return self.sampler.consumed

    @property
    def last_indices(self) -> np.ndarray | None:
        """Dataset indices of the batch the training loop received last (None before the first)."""
        return self.sampler.last_indices()

    @property
    def last_fetch_seconds(self) -> float:
        """How long the training loop waited for the latest batch."""
        return self.fetch_seconds.last

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, unless the position is already in it."""
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The data position: a small JSON-serialisable dict, identical on every rank."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (before iterating); see :meth:`ResumableSampler.load_state_dict`."""
        self.sampler.load_state_dict(state)
        saved = state.get("world_size")
        if self.global_batch_size is None and saved != self.sampler.world_size:
            batch = self.sampler.batch_size
            log.warning(
                "resuming a data position saved by %s ranks on %d: a step now takes %d x %d = %d samples "
                "(pass global_batch_size= to keep the global batch fixed)",
                saved, self.sampler.world_size, self.sampler.world_size, batch, self.sampler.world_size * batch,
            )  # fmt: skip


_ITERABLE_HELP = (
    ", an IterableDataset: a stream has no index, so no position a restart could return to; load it map-style"
    " (Hugging Face: without streaming=True), or write its samples as shards (goodput data write) and read"
    " them with gp.ShardedDataset"
)


def _dataset_size(dataset: Any) -> int:
    try:
        size = len(dataset)
    except TypeError:
        raise ConfigError(
            f"ResumableLoader needs a map-style dataset with __len__; got {type(dataset).__name__}"
            + (_ITERABLE_HELP if isinstance(dataset, torch.utils.data.IterableDataset) else "")
        ) from None
    if size <= 0:
        raise ConfigError(f"the dataset is empty ({type(dataset).__name__} has 0 samples): nothing to load")
    return int(size)


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    _positive_int("world_size", world_size)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}) for world_size {world_size}, got {rank!r}")
    return rank, world_size


def _identity(dataset: Any, fingerprint: str | None) -> str:
    if fingerprint is not None:
        return str(fingerprint)
    own = getattr(dataset, "fingerprint", None)
    if isinstance(own, str):
        return own
    cls = type(dataset)
    return f"{cls.__module__}.{cls.__qualname__}"


def _shard_sizes(dataset: Any, size: int) -> list[int]:
    sizes = getattr(dataset, "shard_sizes", None)
    if sizes is None:
        raise ConfigError(f"shard_window needs a dataset with shard_sizes; {type(dataset).__name__} has none")
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) <= 0 or sum(sizes) != size:
        raise ConfigError(
            f"dataset shard_sizes must be positive and sum to len(dataset)={size}; got {len(sizes)} shards "
            f"summing to {sum(sizes)}"
        )
    return sizes

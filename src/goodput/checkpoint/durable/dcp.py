"""The ``dcp`` strategy: ``torch.distributed.checkpoint.save``; every rank writes its shard, ``.metadata`` last.

Reading is hardened: torch 2.13's DCP readers unpickle ``.metadata`` with plain ``pickle.load`` and its default
load planner reads non-tensor values with ``torch.load(weights_only=False)``; either would run code planted in a
checkpoint. goodput's reader unpickles ``.metadata`` through an allow-list of DCP's own metadata classes, and
its planner loads every non-tensor value with ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from goodput.checkpoint._saving import FAILURES, quiet_single_process
from goodput.checkpoint.durable._direct_read import DirectReadMixin, join_agreement
from goodput.checkpoint.durable.hashing import HashingFileSystem, VerifyingFileSystem
from goodput.checkpoint.durable.objectstore import ConcurrentObjectFileSystem
from goodput.checkpoint.durable.strategy import Completion, SaveContext
from goodput.checkpoint.state import TrainingState, check_shapes, tensor_shapes
from goodput.errors import CheckpointCorrupt

__all__ = ["DcpStrategy", "SafeLoadPlanner", "safe_unpickle_metadata"]

METADATA_NAME = ".metadata"

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED: set[tuple[str, str]] = {
    (_METADATA_MODULE, "Metadata"),
    (_METADATA_MODULE, "MetadataIndex"),
    (_METADATA_MODULE, "ChunkStorageMetadata"),
    (_METADATA_MODULE, "TensorStorageMetadata"),
    (_METADATA_MODULE, "BytesStorageMetadata"),
    (_METADATA_MODULE, "TensorProperties"),
    (_METADATA_MODULE, "StorageMeta"),
    (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only DCP's metadata classes, torch dtypes and a few plain containers."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


def safe_unpickle_metadata(data: bytes) -> Metadata:
    """Unpickle a DCP ``.metadata`` file without running anything but DCP's own metadata constructors.

    Raises:
        CheckpointCorrupt: when the file names anything else (a planted callable) or is not DCP metadata.
    """
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as err:
        raise CheckpointCorrupt(f"{METADATA_NAME}: refused or unreadable ({err})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointCorrupt(f"{METADATA_NAME}: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class _SafeMetadataMixin:
    fs: Any
    path: Any
    load_id: Any

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata, read once per reader (``load_dcp`` reads it before ``dcp.load`` does)."""
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        cache: dict[str, Metadata] = self.__dict__.setdefault("_goodput_metadata", {})
        if name not in cache:
            with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
                metadata = safe_unpickle_metadata(f.read())
            storage_meta = metadata.storage_meta or StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            cache[name] = metadata
        return cache[name]


class _SafeFileSystemReader(DirectReadMixin, _SafeMetadataMixin, FileSystemReader):
    pass


def _fsspec_classes() -> tuple[type, type]:
    # Not exported by torch.distributed.checkpoint in 2.13; the private module is the only place they live.
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return FsspecReader, FsspecWriter


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values are read with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointCorrupt(
                f"{read_item.dest_index.fqn}: refused by weights_only loading ({err})"
            ) from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def single_process() -> bool:
    """True when no process group is up (DCP then saves/loads for this process alone)."""
    return not (dist.is_available() and dist.is_initialized())


def make_reader(folder: str, ctx: SaveContext) -> Any:
    """A DCP storage reader for ``folder`` whose ``.metadata`` is read through the restricted unpickler.

    When ``ctx.options["expected"]`` holds the manifest's entries, every file is checked against its checksum as
    it is read (``VerifyingFileSystem``): one pass over the bytes verifies and loads them. Tensors are copied from
    those bytes straight into the state's own tensors (``DirectReadMixin``), with no tensor allocated per item.
    """
    if ctx.layout.local:
        reader: Any = _SafeFileSystemReader(folder)
    else:
        fsspec_reader, _ = _fsspec_classes()
        safe = type("_SafeFsspecReader", (DirectReadMixin, _SafeMetadataMixin, fsspec_reader), {})
        reader = safe(folder, **ctx.layout.storage_options)
    # every file is served from bytes held whole (mapped or fetched), so tensors are copied straight into the
    # live state (DirectReadMixin); the files named in ``expected`` are checked first, each by one rank
    distributed = not single_process()
    reader.fs = VerifyingFileSystem(
        reader.fs,
        ctx.options.get("expected") or {},
        local=ctx.layout.local,
        rank=dist.get_rank(ctx.group) if distributed else 0,  # as DCP numbers the ranks of its group
        world_size=dist.get_world_size(ctx.group) if distributed else 1,
        group=ctx.group,
    )
    return reader


def make_writer(folder: str, ctx: SaveContext, *, in_process: bool = True) -> Any:
    """A DCP storage writer: fsync'ed local files, or fsspec objects (closing each one uploads it).

    With ``ctx.options["checksum"]`` set, every file's checksum is computed while it is written
    (``writer.fs.digests``), so the manifest needs no read-back. ``in_process=False``: the writer is pickled
    to DCP's helper process, so it gets neither wrapper (the manager then reads the checksums back).
    """
    if ctx.layout.local:
        writer: Any = FileSystemWriter(folder, sync_files=True, overwrite=False)
    else:
        _, fsspec_writer = _fsspec_classes()
        # sync_files would make DCP call a machine-wide os.sync() for every object; durability on an object
        # store comes from closing each object (which uploads it) and the manager's size check before the
        # commit marker.
        writer = fsspec_writer(folder, sync_files=False, overwrite=False, **ctx.layout.storage_options)
        if in_process:  # each file goes up as one concurrent multipart upload when it is closed
            writer.fs = ConcurrentObjectFileSystem(writer.fs)
    algorithm = ctx.options.get("checksum")
    if algorithm and in_process:
        writer.fs = HashingFileSystem(writer.fs, algorithm)
    return writer


def written_files(writer: Any, metadata: Metadata, rank: int) -> dict[str, str | None]:
    """This rank's files of a finished DCP save, each with the checksum computed while writing it (or None)."""
    digests: dict[str, str] = getattr(writer.fs, "digests", {})
    return {name: digests.get(name) for name in files_of_rank(metadata, rank)}


def files_of_rank(metadata: Metadata, rank: int) -> list[str]:
    """The files a rank wrote in a DCP save (from the save's global metadata), plus ``.metadata`` on rank 0."""
    names = {
        str(info.relative_path)
        for info in (metadata.storage_data or {}).values()
        if str(info.relative_path).startswith(f"__{rank}_")
    }
    if rank == 0:
        names.add(METADATA_NAME)
    return sorted(names)


def _planned_target(state: TrainingState, reader: Any) -> dict[str, Any]:
    """The state dict to load into, for the checkpoint's keys; StateMismatch when its tensors do not fit."""
    metadata = reader.read_metadata()
    target = state.load_target(metadata.state_dict_metadata.keys())  # any world size: see TrainingState
    saved = {
        key: tuple(md.size)
        for key, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and key.startswith(("model.", "optim."))
    }
    expected = {k: v for k, v in tensor_shapes(target).items() if k.startswith(("model.", "optim."))}
    check_shapes(expected, saved)
    return target


def load_dcp(state: TrainingState, folder: str, ctx: SaveContext) -> dict[str, float]:
    """Read a DCP checkpoint into ``state``, refusing one whose tensors do not fit (StateMismatch).

    Each rank plans its reads alone (``dcp.load(no_dist=True)``): DCP's default load planning is local, and its
    global step returns the plans unchanged, so the gather and scatter of every rank's plan (and the all-gather
    closing the read step) only cost time. The one
    collective left is the read step's agreement that every rank's checks passed (``_direct_read._agree``); a
    rank that fails before it still joins it with its error, so no rank waits for ever, and the manager then
    gathers every rank's outcome.

    Returns the seconds of the restore's parts on this rank: ``read`` (reading and checking the bytes),
    ``load`` (DCP planning, deserialising and copying into the live state) and ``position`` (RNG and data-loader
    position).
    """
    start = time.perf_counter()
    reader = make_reader(folder, ctx)
    quiet_single_process()  # no_dist=True makes DCP warn that it loads "in a single process"
    try:
        target = _planned_target(state, reader)
        dcp.load(
            target, storage_reader=reader, planner=SafeLoadPlanner(), process_group=ctx.group, no_dist=True
        )
    except FAILURES as err:  # DCP raises a CheckpointException (a BaseException) even with no_dist
        join_agreement(reader.fs, err)  # raises: err, or the failure another rank reported first
        raise
    read = float(getattr(reader.fs, "read_seconds", 0.0))
    rank_key = next((k for k in target if k.startswith("rank") and k[4:].isdigit()), None)
    if rank_key is None:
        state.load_state_dict(target)
        loaded = end = time.perf_counter()
    else:  # the same as state.load_state_dict(target), with the RNG/loader position timed on its own
        rank_entry = {rank_key: target.pop(rank_key)}  # rank0's for a rank the saving run did not have
        state.load_shared(target, full=False)
        loaded = time.perf_counter()
        state.load_rank_entry(rank_entry)  # a new rank takes rank 0's position and seeds its RNGs by rule
        end = time.perf_counter()
    return {"read": read, "load": loaded - start - read, "position": end - loaded}


class DcpStrategy:
    """Synchronous DCP: training waits until every rank's shard and ``.metadata`` are written."""

    name = "dcp"
    is_async = False
    verifies_on_read = True

    def __init__(self) -> None:
        self.last_load_seconds: dict[str, float] = {}

    def save(self, state: TrainingState, folder: str, ctx: SaveContext) -> Completion:
        writer = make_writer(folder, ctx)
        metadata = dcp.save(state.state_dict(), storage_writer=writer, process_group=ctx.group)
        names = written_files(writer, metadata, ctx.rank)
        return lambda: names

    def load(self, state: TrainingState, folder: str, ctx: SaveContext) -> None:
        self.last_load_seconds = load_dcp(state, folder, ctx)

    def close(self) -> None:
        pass

"""DCP's read path without a fresh tensor per item: each tensor's bytes are copied straight into the live tensor.

torch 2.13's ``FileSystemReader.read_data`` deserialises every tensor item with ``torch.load(..., map_location=
"cpu")``: a new tensor per item, whose first-touch page faults cost about as much as reading the bytes, and
then copies it into the target. DCP's planner already hands out the destination (``planner.resolve_tensor``: the state dict's own
tensors, i.e. the model's and optimizer's storage), so the fresh tensor is pure overhead.

``DirectReadMixin.read_data`` serves a file from the verified bytes ``VerifyingFileSystem`` holds (an ``mmap`` of
a local file, or an object fetched whole): for each tensor item it reads only the item's zip directory (torch's
own reader) and its small pickle, through an unpickler that resolves nothing but the names of a plain saved
tensor and builds only its layout (dtype, shape, strides, storage offset; no tensor, no data read); the bytes of
the storage record are viewed in place and copied into the destination tensor. Items it cannot serve that way (DCP
stream transforms, a byte-swapped or unusual record) go through torch's own path for that item, unchanged.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import pickle
import sys
import warnings
from typing import IO, Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from goodput._buffer import BufferFile
from goodput.checkpoint._saving import describe
from goodput.errors import CheckpointCorrupt

__all__ = ["DirectReadMixin", "join_agreement"]


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The part of a saved chunk that one read request asks for."""
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, start, length)
    return tensor


class _Storage(NamedTuple):
    """A ``torch.save`` storage record, as its pickle names it: element type, record key, elements."""

    dtype: torch.dtype
    key: str
    numel: int


class _Layout(NamedTuple):
    """How a saved tensor lies over its storage record (what ``_rebuild_tensor_v2`` would be called with)."""

    storage: _Storage
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _layout_of(storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any) -> _Layout:
    if not isinstance(storage, _Storage) or (rest[1:2] and rest[1]):  # backward hooks: not a plain tensor
        raise pickle.UnpicklingError("not a plain saved tensor")
    return _Layout(storage, int(storage_offset), tuple(map(int, size)), tuple(map(int, stride)))


class _StorageType(NamedTuple):
    dtype: torch.dtype


@functools.lru_cache(maxsize=64)
def _storage_dtype(name: str) -> torch.dtype | None:
    """The element type of torch's typed storage class ``name`` (``FloatStorage``: float32), else None."""
    legacy = getattr(torch, name, None) if name.endswith("Storage") else None
    with warnings.catch_warnings():  # reading a legacy class's dtype warns that typed storages are deprecated
        warnings.simplefilter("ignore", UserWarning)
        dtype = getattr(legacy, "dtype", None) if isinstance(legacy, type) else None
    return dtype if isinstance(dtype, torch.dtype) else None


class _TensorPickle(pickle.Unpickler):
    """Reads the pickle ``torch.save`` writes for one plain tensor, constructing nothing but the ``_Layout``.

    Only three globals resolve (the tensor rebuild function, typed storage classes, ``OrderedDict`` for the
    empty hooks); anything else is refused, and the item then goes through torch's own ``weights_only`` load.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _layout_of
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        dtype = _storage_dtype(name) if module == "torch" else None
        if dtype is not None:
            return _StorageType(dtype)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain saved tensor")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("not a storage record")
        kind, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or not isinstance(numel, int):
            raise pickle.UnpicklingError("not a typed storage record")
        return _Storage(kind.dtype, key, numel)


def _item_layout(item: memoryview) -> tuple[_Layout, int] | None:
    """The layout of the tensor saved in ``item`` (one ``torch.save`` archive) and the offset of its storage's
    bytes inside ``item``; None when the item is not a plain little-endian tensor record.

    Reads the archive's directory with torch's own zip reader and the small pickle with ``_TensorPickle``: about
    a fifth of the time of ``torch.load(map_location="meta")`` per item, and like it, no data is read.
    """
    with BufferFile(item) as raw:
        try:
            archive: Any = torch._C.PyTorchFileReader(cast(IO[bytes], raw))  # stubs lack its record offsets
            if not archive.has_record("byteorder") or bytes(archive.get_record("byteorder")) != b"little":
                return None
            layout = _TensorPickle(io.BytesIO(archive.get_record("data.pkl"))).load()
            if not isinstance(layout, _Layout):
                return None
            offset = int(archive.get_record_offset(f"data/{layout.storage.key}"))
        except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError, EOFError):
            return None
    return layout, offset


def _view_item(item: memoryview) -> torch.Tensor | None:
    """The tensor saved in ``item`` (one ``torch.save`` archive), viewing the bytes in place; None when the item
    is not a plain storage record that can be viewed."""
    if sys.byteorder != "little":
        return None
    found = _item_layout(item)
    if found is None:
        return None
    layout, start = found
    dtype = layout.storage.dtype
    itemsize = dtype.itemsize
    nbytes = layout.storage.numel * itemsize
    if start + nbytes > len(item):
        return None
    if nbytes == 0:
        return torch.empty(layout.size, dtype=dtype)
    with warnings.catch_warnings():  # a read-only buffer (mmap): the view is only ever read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(item, dtype=torch.uint8, count=nbytes, offset=start)
    return raw.view(dtype).as_strided(layout.size, layout.stride, layout.storage_offset)


class _Spans:
    """Byte ranges of one file, as ``(start, buffer)`` pairs, serving the items that lie inside them."""

    def __init__(self, ranges: list[tuple[int, Any]]) -> None:
        self._ranges = [(start, memoryview(buffer)) for start, buffer in ranges]

    def item(self, offset: int, length: int) -> memoryview:
        for start, view in self._ranges:
            if start <= offset and offset + length <= start + len(view):
                return view[offset - start : offset - start + length]
        raise CheckpointCorrupt(f"bytes {offset}-{offset + length} were not read")  # a planning bug, not data


def _agree(fs: Any, error: BaseException | None) -> None:
    """Every rank learns whether every rank's checks passed; raises this rank's error or names another's.

    Called by every rank inside DCP's read step (DCP runs ``read_data`` on every rank), so that no rank uses
    bytes it read without checking them before the rank that checks their file has passed it; or by
    ``join_agreement`` when a rank failed before its read step.
    """
    fs.agreed = True
    world = int(getattr(fs, "world_size", 1))
    if world > 1 and getattr(fs, "checks", False) and dist.is_available() and dist.is_initialized():
        outcomes: list[Any] = [None] * world
        mine = None if error is None else describe(error)
        dist.all_gather_object(outcomes, mine, group=getattr(fs, "group", None))
        if error is None:
            failed = [(rank, detail) for rank, detail in enumerate(outcomes) if detail]
            if failed:
                raise CheckpointCorrupt(f"rank {failed[0][0]} found the checkpoint bad: {failed[0][1]}")
    if error is not None:
        raise error


def join_agreement(fs: Any, error: BaseException) -> None:
    """Reach the read step's agreement with ``error`` if this rank failed before it (while planning its reads),
    so that the other ranks, which wait there, learn of the failure instead of waiting for ever."""
    if not getattr(fs, "agreed", False):
        _agree(fs, error)


class DirectReadMixin:
    """For a DCP ``FileSystemReader`` (local or fsspec) whose ``fs`` serves verified bytes (``stream.view``).

    A file this rank needs much of (or checks) is read whole and checked, and its items are copied into the
    state at once; from a file another rank checks, a rank needing little reads only its items' bytes
    (``fs.read_spans``) and copies them after every rank's checks have passed (``_agree``).

    Attributes:
        direct_items: items copied straight from the file's bytes into their destination.
        torch_items: items read through torch's own per-item path instead.
        part_files: files this rank read only in part.
    """

    direct_items = 0
    torch_items = 0
    part_files = 0
    fs: Any
    path: Any
    storage_data: dict[Any, Any]
    transforms: Any

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for read_item in plan.items:
            per_file.setdefault(self.storage_data[read_item.storage_index].relative_path, []).append(
                read_item
            )
        sizes: dict[str, int] = {}
        for info in self.storage_data.values():
            sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
        reads_whole = getattr(self.fs, "reads_whole", None)
        with contextlib.ExitStack() as stack:
            later: list[tuple[_Spans, list[ReadItem]]] = []
            try:
                error: BaseException | None = None
                try:
                    for relative_path, reqs in per_file.items():
                        infos = [self.storage_data[req.storage_index] for req in reqs]
                        needed = sum(info.length for info in infos)
                        if reads_whole is None or reads_whole(relative_path, needed, sizes[relative_path]):
                            self._read_file(relative_path, reqs, planner)
                            continue
                        path = self.fs.concat_path(self.path, relative_path)
                        wanted = [(info.offset, info.length) for info in infos]
                        later.append((_Spans(self.fs.read_spans(path, wanted, stack)), reqs))
                        self.part_files += 1
                    for name in getattr(self.fs, "unread_to_check", lambda _: [])(set(per_file)):
                        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb"):
                            pass  # read whole and checked: another rank may have read part of it
                except Exception as err:  # every rank must reach the agreement, or the others would wait
                    error = err
                _agree(self.fs, error)
                self._serve_parts(later, planner)
            finally:
                later.clear()  # no view into a mapped file may outlive it
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _serve_parts(self, later: list[tuple[_Spans, list[ReadItem]]], planner: LoadPlanner) -> None:
        """The items read in part, once every rank's checks have passed."""
        for spans, reqs in later:
            self._serve(lambda info, spans=spans: spans.item(info.offset, info.length), reqs, planner)

    def _read_file(self, relative_path: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """One file read whole (and checked when the manifest names its checksum), its items served from it."""
        with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
            view = getattr(stream, "view", None)
            if view is None:  # a file system that does not hold the bytes: torch's own path
                self.torch_items += len(reqs)
                self._read_through_torch(stream, reqs, planner)
                return
            self._serve(lambda info: view[info.offset : info.offset + info.length], reqs, planner)

    def _serve(self, item_of: Any, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """Copy each requested item from its bytes (``item_of(storage info)``) into its destination."""
        rest = []
        for req in reqs:
            info = self.storage_data[req.storage_index]
            if not self._read_direct(item_of(info), info, req, planner):
                rest.append(req)
        self.direct_items += len(reqs) - len(rest)
        self.torch_items += len(rest)
        for req in rest:  # each through torch's path, over its own bytes
            info = self.storage_data[req.storage_index]
            with BufferFile(item_of(info)) as item:
                self._read_through_torch(item, [req], planner, at=dataclasses.replace(info, offset=0))

    def _read_direct(self, item: memoryview, info: Any, req: ReadItem, planner: LoadPlanner) -> bool:
        if info.transform_descriptors:
            return False
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(bytes(item)))
            return True
        source = _view_item(item)
        if source is None:
            return False
        source = _narrow(source, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != source.size():
            raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {source.size()}")
        target.copy_(source)
        planner.commit_tensor(req, target)
        return True

    def _read_through_torch(
        self, stream: Any, reqs: list[ReadItem], planner: LoadPlanner, at: Any = None
    ) -> None:
        """torch's own per-item path (fresh tensor, then a copy) for the items the direct path does not serve
        (``at``: the storage info to use instead of the item's own, for a stream holding only that item)."""
        for req in reqs:
            info = at if at is not None else self.storage_data[req.storage_index]
            piece = self.transforms.transform_load_stream(
                req, info.transform_descriptors or (), self._slice(stream, info)
            )
            data = io.BytesIO(piece.read(-1))
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, data)
                continue
            loaded = torch.load(data, map_location="cpu", weights_only=True)
            source = _narrow(loaded, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != source.size():
                raise AssertionError(
                    f"req {req.storage_index} mismatch sizes {target.size()} vs {source.size()}"
                )
            target.copy_(source)
            planner.commit_tensor(req, target)

    def _slice(self, stream: Any, info: Any) -> Any:
        return self._slice_file(stream, info)  # type: ignore[attr-defined]  # FileSystemReader's

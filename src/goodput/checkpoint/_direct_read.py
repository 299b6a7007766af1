"""DCP's read path without a fresh tensor per item: each tensor's bytes are copied straight into the live tensor.

torch 2.13's ``FileSystemReader.read_data`` deserialises every tensor item with ``torch.load(..., map_location=
"cpu")``: a new tensor per item, whose first-touch page faults cost about as much as reading the bytes (measured
~1 s/GiB into a fresh buffer vs ~0.1 s/GiB into a reused one on the benchmark machine), and then copies it into
the target. DCP's planner already hands out the destination (``planner.resolve_tensor``: the state dict's own
tensors, i.e. the model's and optimizer's storage), so the fresh tensor is pure overhead.

``DirectReadMixin.read_data`` serves a file from the verified bytes ``VerifyingFileSystem`` holds (an ``mmap`` of
a local file, or an object fetched whole): for each tensor item it reads only the item's small pickle, with
``torch.load(map_location="meta", weights_only=True)`` (no data is read, nothing but tensor metadata is
unpickled), which gives the dtype, shape, strides and the offset of the raw storage record inside the item; the
bytes there are viewed in place and copied into the destination tensor. Items it cannot serve that way (DCP
stream transforms, a byte-swapped or unusual record) go through torch's own path for that item, unchanged.
"""

from __future__ import annotations

import io
import warnings
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from goodput.checkpoint.hashing import _BufferReader

__all__ = ["DirectReadMixin"]


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The part of a saved chunk that one read request asks for."""
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, start, length)
    return tensor


def _view_item(view: memoryview, offset: int, length: int) -> torch.Tensor | None:
    """The tensor saved in ``view[offset:offset + length]`` (one ``torch.save`` archive), viewing the bytes in
    place; None when the item is not a plain storage record that can be viewed."""
    item = view[offset : offset + length]
    with _BufferReader(item) as pickled:  # no copy: torch reads only the zip directory and the pickle
        meta = torch.load(cast(IO[bytes], pickled), map_location="meta", weights_only=True)
    if not isinstance(meta, torch.Tensor) or meta.device.type != "meta" or meta.is_quantized:
        return None
    storage = meta.untyped_storage()
    start = getattr(storage, "_checkpoint_offset", None)
    nbytes = storage.nbytes()
    if start is None or start + nbytes > length or nbytes % meta.element_size():
        return None
    if nbytes == 0:
        return torch.empty(meta.size(), dtype=meta.dtype)
    with warnings.catch_warnings():  # a read-only buffer (mmap): the view is only ever read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(item, dtype=torch.uint8, count=nbytes, offset=start)
    typed = raw.view(meta.dtype)
    return typed.as_strided(meta.size(), meta.stride(), meta.storage_offset())


class DirectReadMixin:
    """For a DCP ``FileSystemReader`` (local or fsspec) whose ``fs`` serves verified bytes (``stream.view``).

    Attributes:
        direct_items: items copied straight from the file's bytes into their destination.
        torch_items: items read through torch's own per-item path instead.
    """

    direct_items = 0
    torch_items = 0
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
        for relative_path, reqs in per_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                view = getattr(stream, "view", None)
                rest = [req for req in reqs if view is None or not self._read_direct(view, req, planner)]
                self.direct_items += len(reqs) - len(rest)
                if rest:
                    self.torch_items += len(rest)
                    self._read_through_torch(stream, rest, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_direct(self, view: memoryview, req: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[req.storage_index]
        if info.transform_descriptors:
            return False
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(bytes(view[info.offset : info.offset + info.length])))
            return True
        source = _view_item(view, info.offset, info.length)
        if source is None:
            return False
        source = _narrow(source, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != source.size():
            raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {source.size()}")
        target.copy_(source)
        planner.commit_tensor(req, target)
        return True

    def _read_through_torch(self, stream: Any, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """torch's own per-item path (fresh tensor, then a copy) for the items the direct path does not serve."""
        for req in reqs:
            info = self.storage_data[req.storage_index]
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

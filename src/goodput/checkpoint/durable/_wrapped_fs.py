"""The base of goodput's DCP ``FileSystem`` wrappers (checksums on write and on read, concurrent uploads): each
handles the streams of one direction and leaves everything else to the file system it wraps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["WrappedFileSystem"]


class WrappedFileSystem:
    """A DCP ``FileSystem`` over ``inner``: a member it does not define is ``inner``'s, and ``create_stream``
    gives the streams whose mode holds ``handles`` (``"w"``: writes, ``"r"``: reads) to ``_stream``, the others
    to ``inner`` unchanged."""

    handles = "w"

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        opened = self._stream(path, mode) if self.handles in mode else self._inner.create_stream(path, mode)
        with opened as stream:
            yield stream

    def _stream(self, path: Any, mode: str) -> contextlib.AbstractContextManager[Any]:
        """The stream of ``path`` in ``mode`` (a mode this wrapper handles)."""
        raise NotImplementedError

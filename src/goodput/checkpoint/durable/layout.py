"""Where checkpoints live and when one counts: ``step-N`` folders, the manifest, commit, listing, purge.

A checkpoint is the folder ``<root>/step-<N>/``. It counts (is *committed*) only when goodput's manifest
``goodput-manifest.json`` is present, and it is *valid* only when that manifest verifies: every file it names
exists with its recorded size (always checked) and checksum (when asked). The manifest is written last:

- local folders: every file is written and fsynced under ``<root>/step-<N>.partial-<token>/``; the manifest is
  fsynced, then the folder is renamed to ``step-<N>`` and the parent folder is fsynced;
- object stores (any other fsspec URL): every object is written under ``step-<N>/``, each one is checked to be
  visible with its full size, and only then is the manifest written (the marker-last protocol).

A folder that has no manifest is *partial*; one whose manifest does not verify is *corrupt*. Each save in flight
holds a lease file naming its host and process, so that start-up cleaning never removes a save in flight.

goodput deletes only what it can prove it wrote: a folder named as only goodput names them
(``step-<N>.partial-<token>``, ``step-<N>.trash-<id>``), or a ``step-<N>`` folder holding goodput's manifest or
lease. A ``step-<N>`` folder with neither (made by hand, or by another tool) is listed as partial and left alone;
a save of that step fails with a message naming it rather than replace it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from goodput._client_random import isolate_store_clients
from goodput._lifetime import pid_running
from goodput.checkpoint.durable.manifest import (
    CheckpointInfo,
    FileEntry,
    Manifest,
    check_digest,
    new_hasher,
)
from goodput.errors import CheckpointCorrupt

__all__ = ["MANIFEST_NAME", "CheckpointLayout", "list_checkpoints"]

MANIFEST_NAME = "goodput-manifest.json"
_LEASE_NAME = "goodput-lease.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_PARTIAL_DIR = re.compile(r"^step-(\d+)\.partial-([0-9a-f]+)$")
_TRASH_DIR = re.compile(r"^step-(\d+)\.trash-([0-9a-f]+)$")
_CHUNK = 8 << 20
_IN_FLIGHT: set[str] = set()  # folders this process is writing (a lease naming this pid may be in flight)

log = logging.getLogger(__name__)


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


class CheckpointLayout:
    """The folders under one checkpoint root, local or behind any fsspec URL.

    Args:
        root: a local path or an fsspec URL (``s3://bucket/run``, ``memory://run``).
        storage_options: passed to fsspec for remote roots (credentials, endpoint); never logged.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.local = _is_local(root)
        self.root = os.path.abspath(root.removeprefix("file://")) if self.local else root.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        if not self.local:
            isolate_store_clients(self.root)  # before the first request: no retry may draw the user's random

    # ---- storage primitives -------------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The fsspec filesystem of the root (created on first use)."""
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, _ = url_to_fs(self.root, **self.storage_options)
        return self._fs

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts) if self.local else "/".join([self.root, *parts])

    def _names(self, folder: str) -> list[str]:
        if self.local:
            try:
                return sorted(os.listdir(folder))
            except FileNotFoundError:
                return []
        return sorted(self._sizes(folder))

    def _sizes(self, folder: str) -> dict[str, int]:
        """Each entry of ``folder`` and its size (a folder 0, a file gone since the listing -1); remote, one request."""
        if self.local:
            return {name: _size_or_gone(os.path.join(folder, name)) for name in self._names(folder)}
        self.fs.invalidate_cache(folder)
        try:
            entries = self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            return {}
        # some stores keep an emptied folder as a marker object ``folder/`` (SeaweedFS after a removal), which
        # s3fs lists inside the folder itself: not one of its files
        own = str(self.fs._strip_protocol(folder)).rstrip("/")
        named = ((str(e["name"]).rstrip("/"), e) for e in entries)
        return {n.rsplit("/", 1)[-1]: int(e.get("size") or 0) for n, e in named if n != own}

    def _size(self, path: str) -> int:
        if self.local:
            return os.stat(path).st_size
        self.fs.invalidate_cache(path)
        return int(self.fs.info(path)["size"])

    def read_text(self, path: str) -> str:
        """The text of the file at ``path`` (a remote one read afresh, not from fsspec's listing cache)."""
        if self.local:
            with open(path, encoding="utf-8") as f:
                return f.read()
        self.fs.invalidate_cache(path)
        return str(self.fs.cat_file(path).decode("utf-8"))

    def write_text(self, path: str, text: str, *, durable: bool = True) -> None:
        """Write ``text`` to ``path``; ``durable``: fsync a local file before returning."""
        if self.local:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        else:
            with self.fs.open(path, "wb") as f:
                f.write(text.encode("utf-8"))

    def _remove_tree(self, path: str) -> None:
        if self.local:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=True)
            self.fs.invalidate_cache(path)

    def free_bytes(self) -> int | None:
        """Bytes free for writing under a local root (None for remote roots)."""
        if not self.local:
            return None
        try:
            st = os.statvfs(self.root)
        except OSError:
            return None
        return int(st.f_bavail * st.f_frsize)

    def hash_file(self, path: str, algorithm: str) -> str:
        """The hex digest of one stored file (reads every byte)."""
        h = new_hasher(algorithm)
        opener = open(path, "rb") if self.local else self.fs.open(path, "rb")  # noqa: SIM115
        with opener as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def digest(self, path: str, *, checksum: bool | str, known: str | None = None) -> FileEntry:
        """Size and checksum of one written file.

        ``checksum``: False (size only), True (sha256, read back) or an algorithm name. ``known``: the
        ``"<algorithm>:<hex>"`` computed while the file was written; then nothing is read back.
        """
        size = self._size(path)
        if not checksum:
            return FileEntry(size)
        if known is not None:
            return FileEntry(size, checksum=known)
        algorithm = "sha256" if checksum is True else str(checksum)
        digest = self.hash_file(path, algorithm)
        return (
            FileEntry(size, digest)
            if algorithm == "sha256"
            else FileEntry(size, checksum=f"{algorithm}:{digest}")
        )

    # ---- saving ----------------------------------------------------------------------------------------
    def final_dir(self, step: int) -> str:
        return self.join(f"step-{step}")

    def folder_for(self, step: int, token: str) -> str:
        """The folder ``begin(step, token)`` creates (known ahead, without any I/O)."""
        return self.join(f"step-{step}.partial-{token}") if self.local else self.final_dir(step)

    def begin(self, step: int, token: str) -> str:
        """Create the folder a save of ``step`` writes into (with a lease); returns its path or URL.

        Never reuses a folder: a leftover local partial of the same token is removed first; on object stores a
        leftover uncommitted ``step-N/`` is removed (DCP would otherwise mix new shards with old ones).
        """
        folder = self.folder_for(step, token)
        self._remove_tree(folder)
        if self.local:
            os.makedirs(folder)
        else:
            folder = self.final_dir(step)
            self._refuse_foreign(folder)
            self._remove_tree(folder)
            self.fs.makedirs(folder, exist_ok=True)
        _IN_FLIGHT.add(folder)
        lease = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self.write_text(self.path_in(folder, _LEASE_NAME), json.dumps(lease), durable=False)
        return folder

    def is_committed(self, step: int) -> bool:
        """Whether ``step-<step>`` is committed and its files have their recorded sizes."""
        folder = self.final_dir(step)
        if MANIFEST_NAME not in self._names(folder):
            return False
        try:
            self.verify(folder, checksums=False)
        except CheckpointCorrupt:
            return False
        return True

    def path_in(self, folder: str, name: str) -> str:
        return os.path.join(folder, name) if self.local else f"{folder}/{name}"

    def rank_files(
        self, folder: str, names: Iterable[str] | Mapping[str, str | None], *, checksum: bool | str
    ) -> dict[str, FileEntry]:
        """Sizes/checksums of the named files in ``folder`` (each rank describes the files it wrote).

        ``names`` may map each name to the ``"<algorithm>:<hex>"`` computed while writing it (no read-back).
        """
        known = dict(names) if isinstance(names, Mapping) else dict.fromkeys(names)
        return {
            name: self.digest(self.path_in(folder, name), checksum=checksum, known=digest)
            for name, digest in known.items()
        }

    def list_files(self, folder: str) -> list[str]:
        return self._names(folder)

    def commit(self, folder: str, manifest: Manifest) -> str:
        """Make the save in ``folder`` the committed checkpoint of its step; returns the final path or URL.

        Every file the manifest names must already be written by its rank; each is checked to be present with
        its recorded size before the manifest (the marker) is written.
        """
        sizes = self._sizes(folder)
        for name, entry in manifest.files.items():
            size = sizes.get(name)
            if size != entry.size:
                raise OSError(f"{name} in {folder} holds {size} bytes, {entry.size} were written")
        self.write_text(self.path_in(folder, MANIFEST_NAME), manifest.to_json())
        _IN_FLIGHT.discard(folder)
        if not self.local:
            if self._size(self.path_in(folder, MANIFEST_NAME)) <= 0:
                raise OSError(f"the manifest of {folder} is not visible after writing it")
            return folder
        _fsync_dir(folder)
        final = self.final_dir(manifest.step)
        if os.path.exists(final):  # an older corrupt or partial leftover of the same step: move it aside
            self._refuse_foreign(final)
            trash = self.join(f"step-{manifest.step}.trash-{uuid.uuid4().hex[:8]}")
            os.rename(final, trash)
            self._remove_tree(trash)
        os.rename(folder, final)
        _fsync_dir(self.root)
        return final

    def _refuse_foreign(self, folder: str) -> None:
        """Raise OSError when ``folder`` exists with content that goodput cannot prove it wrote."""
        names = self._names(folder)
        if names and not _written_by_goodput(os.path.basename(folder.rstrip("/")), names):
            raise OSError(
                f"{folder} exists and was not written by goodput (no {MANIFEST_NAME} nor {_LEASE_NAME}); "
                "move it out of the checkpoint folder"
            )

    def abort(self, folder: str) -> None:
        """Remove the folder of a failed save (best effort: it is uncommitted either way)."""
        _IN_FLIGHT.discard(folder)
        try:
            self._remove_tree(folder)
        except OSError as err:
            log.warning("could not remove the failed save's folder %s: %s", folder, err)

    # ---- reading -----------------------------------------------------------------------------------------
    def read_manifest(self, folder: str) -> Manifest:
        """The manifest of a committed folder. Raises CheckpointCorrupt when unreadable or missing."""
        path = self.path_in(folder, MANIFEST_NAME)
        try:
            return Manifest.from_json(self.read_text(path))
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{path}: missing (the save never committed)") from None
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointCorrupt(f"{path}: unreadable manifest ({err})") from None

    def verify(
        self, folder: str, *, checksums: bool, read: tuple[Manifest, dict[str, int]] | None = None
    ) -> Manifest:
        """Check a folder against its manifest (``read``: it and the sizes, just read); CheckpointCorrupt names why."""
        manifest, sizes = read or (self.read_manifest(folder), self._sizes(folder))
        for name, entry in sorted(manifest.files.items()):
            path = self.path_in(folder, name)
            if name not in sizes:
                raise CheckpointCorrupt(f"{path}: missing")
            size = sizes[name]
            if size != entry.size:
                raise CheckpointCorrupt(f"{path}: {size} bytes, the manifest says {entry.size}")
            expected = entry.expected() if checksums else None
            if expected is not None:
                check_digest(path, expected, self.hash_file(path, expected[0]))
        return manifest

    def scan(self, *, checksums: bool = False) -> list[CheckpointInfo]:
        """Every step folder and partial folder under the root, newest step first."""
        rows: list[CheckpointInfo] = []
        for name in self._names(self.root):
            folder = self.join(name)
            if match := _STEP_DIR.match(name):
                row = self._inspect(int(match.group(1)), folder, checksums=checksums)
                if row is not None:
                    rows.append(row)
            elif match := _PARTIAL_DIR.match(name):
                rows.append(CheckpointInfo(int(match.group(1)), folder, "partial", "save did not commit"))
        rows.sort(key=lambda r: (r.step, r.status == "committed"), reverse=True)
        return rows

    def _inspect(self, step: int, folder: str, *, checksums: bool) -> CheckpointInfo | None:
        """The row of a ``step-<N>`` folder; None for no checkpoint: an emptied folder on an object store (a marker
        SeaweedFS keeps), or one removed while read (retention, a rollback's discard: a removal renames a local
        folder away, then deletes its files, maybe as they are listed; on a store it deletes the manifest first)."""
        sizes = self._sizes(folder)
        if not os.path.isdir(folder) if self.local else not sizes:
            return None
        if MANIFEST_NAME not in sizes:
            return CheckpointInfo(step, folder, "partial", "no manifest: save did not commit")
        row = CheckpointInfo(step, folder, "corrupt", "")
        try:
            m = self.read_manifest(folder)
            row = CheckpointInfo(
                step, folder, "committed", "", m.strategy, m.world_size, m.wall_time, m.total_bytes
            )
            self.verify(folder, checksums=checksums, read=(m, sizes))
        except (CheckpointCorrupt, FileNotFoundError) as err:
            if MANIFEST_NAME not in self._names(folder):
                return None  # it had a manifest when listed: removed since
            if isinstance(err, FileNotFoundError):
                raise
            return dataclasses.replace(row, status="corrupt", reason=str(err))
        if m.step != step:
            return dataclasses.replace(row, status="corrupt", reason=f"the manifest says step {m.step}")
        return row

    # ---- cleaning ----------------------------------------------------------------------------------------
    def clean_partials(self, *, stale_after: float) -> list[str]:
        """Remove folders of crashed saves (only those goodput provably wrote); returns what was removed.

        A partial folder is left alone while its lease names a live process on this host, or (for a lease from
        another host, or none readable) while it is younger than ``stale_after`` seconds.
        """
        removed = []
        for name in self._names(self.root):
            folder = self.join(name)
            if _TRASH_DIR.match(name):
                self._remove_tree(folder)
                removed.append(folder)
                continue
            if not (_PARTIAL_DIR.match(name) or _STEP_DIR.match(name)):
                continue
            names = self._names(folder)
            if MANIFEST_NAME in names or self._in_flight(folder, names, stale_after):
                continue
            if not names and not self.local:  # an emptied prefix some stores still list (SeaweedFS): no data
                continue
            if not _written_by_goodput(name, names):
                log.warning(
                    "leaving %s alone: it has no goodput lease or manifest, so goodput did not write it",
                    folder,
                )
                continue
            log.warning("removing %s: a save that never committed", folder)
            self._remove_tree(folder)
            removed.append(folder)
        return removed

    def _in_flight(self, folder: str, names: list[str], stale_after: float) -> bool:
        try:
            lease = (
                json.loads(self.read_text(self.path_in(folder, _LEASE_NAME))) if _LEASE_NAME in names else {}
            )
        except (OSError, ValueError):
            lease = {}
        if lease.get("host") == socket.gethostname() and isinstance(lease.get("pid"), int):
            if lease["pid"] == os.getpid():
                return folder in _IN_FLIGHT
            return pid_running(lease["pid"])
        started = float(lease.get("started", 0.0))
        return time.time() - started < stale_after

    def remove(self, info: CheckpointInfo) -> None:
        """Delete one checkpoint folder (retention decides which)."""
        log.info("purging %s", info.url)
        if self.local:  # rename first so that a crash mid-delete never leaves a half step-N that looks real
            trash = self.join(f"step-{info.step}.trash-{uuid.uuid4().hex[:8]}")
            os.rename(info.url, trash)
            self._remove_tree(trash)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.path_in(info.url, MANIFEST_NAME))  # un-commit first
            self._remove_tree(info.url)


def list_checkpoints(
    root: str, *, storage_options: dict[str, Any] | None = None, checksums: bool = False
) -> list[CheckpointInfo]:
    """Every checkpoint folder under ``root`` with its status, newest first.

    Args:
        root: a local folder or an fsspec URL.
        storage_options: fsspec options (credentials, endpoint) for remote roots.
        checksums: also verify every file's checksum (reads every byte).
    """
    return CheckpointLayout(root, storage_options).scan(checksums=checksums)


def _written_by_goodput(name: str, names: list[str]) -> bool:
    """Whether folder ``name`` holding ``names`` is provably goodput's (a name it gives, its manifest or lease)."""
    if _PARTIAL_DIR.match(name) or _TRASH_DIR.match(name):
        return True
    return MANIFEST_NAME in names or _LEASE_NAME in names


def _size_or_gone(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""What a committed checkpoint records about itself: the manifest and its file entries, the checksums it may
use, and a listing's row.

Kept apart from ``layout.py`` (where folders live and how one is committed) because the data-integrity
modules (``hashing.py``, ``torch_save.py``) need only these types and the hashers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from goodput.errors import CheckpointCorrupt

__all__ = ["CHECKSUM_ALGORITHMS", "CheckpointInfo", "FileEntry", "Manifest", "check_digest", "new_hasher"]

_FORMAT_VERSION = 1


# Checksums a manifest may record. xxh3_128 (xxHash) runs at memory speed and is what saves record by default;
# sha256 stays available (and old manifests that carry only ``sha256`` still verify).
CHECKSUM_ALGORITHMS = ("xxh3_128", "sha256")


class _Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str) -> _Hasher:
    """A fresh incremental hasher for ``algorithm`` (one of :data:`CHECKSUM_ALGORITHMS`)."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(
        f"unknown checksum algorithm {algorithm!r}; choose one of {', '.join(CHECKSUM_ALGORITHMS)}"
    )


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as the manifest records it.

    ``checksum`` is ``"<algorithm>:<hex>"`` (computed while the file was written); ``sha256`` is the field older
    manifests carry (and what ``algorithm="sha256"`` reads back).
    """

    size: int
    sha256: str | None = None
    checksum: str | None = None

    def expected(self) -> tuple[str, str] | None:
        """(algorithm, hex digest) to verify this file against, or None when the manifest records none."""
        if self.checksum is not None:
            algorithm, _, digest = self.checksum.partition(":")
            return algorithm, digest
        return ("sha256", self.sha256) if self.sha256 is not None else None


@dataclass(frozen=True)
class Manifest:
    """goodput's record of a committed checkpoint (written last; its presence is the commit)."""

    step: int
    strategy: str
    world_size: int
    wall_time: float
    files: dict[str, FileEntry]
    goodput_version: str
    format_version: int = _FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("format_version") != _FORMAT_VERSION:
            raise ValueError(
                f"unknown manifest format {raw.get('format_version') if isinstance(raw, dict) else raw!r}"
            )
        files = {
            str(name): FileEntry(int(e["size"]), e.get("sha256"), e.get("checksum"))
            for name, e in raw["files"].items()
        }
        return cls(
            step=int(raw["step"]),
            strategy=str(raw["strategy"]),
            world_size=int(raw["world_size"]),
            wall_time=float(raw["wall_time"]),
            files=files,
            goodput_version=str(raw["goodput_version"]),
            extra=dict(raw.get("extra", {})),
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """One row of a listing: a step folder and what state it is in."""

    step: int
    url: str
    status: str  # "committed", "partial" or "corrupt"
    reason: str = ""
    strategy: str | None = None
    world_size: int | None = None
    wall_time: float | None = None
    size_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_digest(path: str, expected: tuple[str, str], actual: str) -> None:
    """Raise CheckpointCorrupt naming ``path`` when ``actual`` is not the manifest's digest."""
    algorithm, digest = expected
    if actual != digest:
        raise CheckpointCorrupt(f"{path}: {algorithm} {actual} differs from the manifest's {digest}")

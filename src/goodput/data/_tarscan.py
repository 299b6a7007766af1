"""The regular members of a tar file, read straight from its 512-byte headers (WebDataset's index).

``tarfile`` builds a ``TarInfo`` per member through several layers of Python; indexing a shard needs only each
member's name, data offset and size, so this reads them from the headers directly, as ``tarfile`` reads them,
for the members WebDataset writers produce: ustar and old-GNU regular files, directories and links, GNU long
names and POSIX pax ``path``/``size`` records. Anything else (a bad checksum, a global pax header, sparse
files, a member or header cut short, bytes after the end marker) returns None, and the caller reads the shard
with ``tarfile``, which either understands it or says what is wrong.
"""

from __future__ import annotations

import re
import tarfile

from goodput.data._source import Buffer

__all__ = ["regular_members"]

_BLOCK = 512
_EMPTY = bytes(_BLOCK)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_NO_DATA = (
    tarfile.LNKTYPE,
    tarfile.SYMTYPE,
    tarfile.DIRTYPE,
    tarfile.FIFOTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
)
_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_PAX_KEPT = {"path", "size"}
_PAX_IGNORED = {"mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "linkpath", "comment", "mode"}
_ENCODING, _ERRORS = tarfile.ENCODING, "surrogateescape"  # tarfile's defaults for names


def regular_members(data: Buffer) -> list[tuple[str, int, int]] | None:
    """``(name, data offset, size)`` of every regular member of the tar in ``data`` (bytes or a mapped file),
    in tar order, as ``tarfile`` reports them; None when the file holds anything this reader leaves to
    ``tarfile`` (see the module docstring)."""
    total = len(data)
    members: list[tuple[str, int, int]] = []
    pos, pending = 0, dict[str, str]()
    while True:
        header = bytes(data[pos : pos + _BLOCK])
        if len(header) < _BLOCK or header == _EMPTY:
            return members if not bytes(data[pos:]).strip(b"\0") else None
        try:
            if not _checksum_ok(header):
                return None
            size = _number(header[124:136])
        except ValueError:
            return None
        kind, start = header[156:157], pos + _BLOCK
        end = start + size
        if end > total:
            return None
        pos = start + -(-size // _BLOCK) * _BLOCK
        if kind in _LONG:
            pending["long" + kind.decode()] = _text(bytes(data[start:end]))
            continue
        if kind in _PAX:
            records = _pax(bytes(data[start:end]))
            if records is None:
                return None
            pending.update(records)
            continue
        if kind in _REGULAR:
            name = _name(header, pending)
            if kind == tarfile.AREGTYPE and name.endswith("/"):
                pos = start  # an old-style directory: no data follows
            else:
                if "size" in pending:
                    size = int(pending["size"])
                    if start + size > total:
                        return None
                    pos = start + -(-size // _BLOCK) * _BLOCK
                members.append((name, start, size))
        elif kind in _NO_DATA:
            pos = start  # tarfile skips no data blocks for these
        else:
            return None
        pending = {}


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or big-endian base-256 after a 0x80 byte (GNU, for large sizes);
    ValueError for anything else (then tarfile decides)."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _checksum_ok(header: bytes) -> bool:
    """The header's checksum field against the sum of its bytes with the field counted as spaces, unsigned
    (POSIX) or signed (some old writers)."""
    stored, unsigned = _number(header[148:156]), sum(header) - sum(header[148:156]) + 256
    if stored == unsigned:
        return True
    high = sum(1 for b in header[:148] + header[156:] if b > 127)
    return stored == unsigned - 256 * high


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode(_ENCODING, _ERRORS)


def _name(header: bytes, pending: dict[str, str]) -> str:
    if "path" in pending:
        return pending["path"]
    if "longL" in pending:
        return pending["longL"]
    name, prefix = _text(header[0:100]), _text(header[345:500])
    return prefix + "/" + name if prefix else name


def _pax(data: bytes) -> dict[str, str] | None:
    """The ``path`` and ``size`` records of a pax header; None for records this reader does not apply."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:].strip(b"\0"):
        match = _PAX_RECORD.match(data, pos)
        if match is None:
            return None
        length, key = int(match.group(1)), match.group(2).decode("utf-8", _ERRORS)
        value = data[match.end() : pos + length - 1]
        if length < 5 or data[pos + length - 1 : pos + length] != b"\n":
            return None
        if key in _PAX_KEPT:
            found[key] = value.decode("utf-8", _ERRORS)
        elif key not in _PAX_IGNORED:
            return None
        pos += length
    if "size" in found and not found["size"].isdigit():
        return None
    return found

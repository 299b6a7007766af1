"""Memory-tier part files: held in 2 MiB pages on tmpfs (read back exactly, a flipped byte still found), and big
tensors lie in the file at their own address modulo 64 (the alignment the restore's kernel copy is fastest at)."""

from __future__ import annotations

import ctypes
import mmap
import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.memory.format import Staging, decode_part, load_part, write_part
from goodput.checkpoint.memory.huge_pages import _libc
from goodput.checkpoint.memory.read import read_part_into
from goodput.errors import CheckpointCorrupt

_HUGE = 2 << 20


def _why_no_huge_pages() -> str | None:
    if sys.platform != "linux" or not Path("/dev/shm").is_dir():
        return "needs Linux with a /dev/shm tmpfs"
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text()
    except OSError:
        return "a kernel without transparent huge pages"
    if "[deny]" in mode:
        return "shmem huge pages are denied on this machine"
    major, minor = (int(x) for x in platform.release().split("-")[0].split(".")[:2])
    return "MADV_COLLAPSE needs Linux 6.1+" if (major, minor) < (6, 1) else None


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    reason = _why_no_huge_pages()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="goodput-test-pages-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _pmd_mapped_bytes(path: Path, length: int) -> int:
    """Bytes of the first ``length`` of ``path`` the kernel maps with 2 MiB entries (from /proc/self/smaps)."""
    libc = _libc()  # the module's own mmap/munmap bindings
    with open(path, "rb") as f:
        reserved = libc.mmap(None, length + _HUGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        aligned = (reserved + _HUGE - 1) // _HUGE * _HUGE
        try:
            addr = libc.mmap(aligned, length, mmap.PROT_READ, mmap.MAP_SHARED | 0x10, f.fileno(), 0)
            assert addr == aligned, ctypes.get_errno()
            view = (ctypes.c_char * length).from_address(addr)
            for offset in range(0, length, 4096):
                view[offset]  # fault every page in
            lines = Path("/proc/self/smaps").read_text().splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith(f"{addr:x}-"))
            for line in lines[start + 1 :]:
                if line.startswith("ShmemPmdMapped:"):
                    return int(line.split()[1]) * 1024
            raise AssertionError("no ShmemPmdMapped line for the mapping")
        finally:
            libc.munmap(reserved, length + _HUGE)


def _state() -> dict[str, object]:
    torch.manual_seed(0)
    big = torch.randn(1024, 1027)  # ~4 MiB: two whole 2 MiB pages and a tail
    shifted = torch.randn(70_000)[3:]  # 12 bytes past a 64-byte boundary
    return {"w": big, "v": shifted, "b": torch.randn(5), "meta": "x"}


def test_a_part_on_tmpfs_is_held_in_huge_pages_and_reads_back_exactly(shm_dir: Path) -> None:
    saved = _state()
    staging = Staging()
    header = staging.stage(saved, run="r", step=1, rank=0, world=1)
    path = shm_dir / "rank-0.part"
    size, digest = write_part(str(path), header, staging.buffer)
    huge = size // _HUGE * _HUGE
    assert huge >= 2 * _HUGE
    assert _pmd_mapped_bytes(path, huge) == huge
    current = {"w": torch.zeros(1024, 1027), "v": torch.zeros(69_997), "b": torch.zeros(5), "meta": ""}
    loaded = read_part_into(str(path), size=size, digest=digest, current=current, expect=("r", 1, 0))
    for key in ("w", "v", "b"):
        assert torch.equal(current[key], saved[key])  # type: ignore[arg-type]
    assert loaded["meta"] == "x"
    # Written again (a recycled part): still huge pages; a byte flipped inside them is still found.
    size, digest = write_part(str(path), header, staging.buffer)
    assert _pmd_mapped_bytes(path, huge) == huge
    with open(path, "r+b") as f:
        f.seek(_HUGE + 12345)
        byte = f.read(1)
        f.seek(_HUGE + 12345)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        read_part_into(str(path), size=size, digest=digest, current=current, expect=("r", 1, 0))


def test_big_tensors_lie_in_the_file_at_their_own_address_modulo_64(tmp_path: Path) -> None:
    saved = _state()
    staging = Staging()
    header = staging.stage(saved, run="r", step=1, rank=0, world=1)
    path = tmp_path / "rank-0.part"  # not tmpfs here: no huge pages, the same bytes
    size, digest = write_part(str(path), header, staging.buffer)
    blob = path.read_bytes()
    parsed, data = decode_part(memoryview(blob), size=size, digest=digest)
    start = size - parsed.data_bytes
    by_index = {"w": 0, "v": 1}  # the skeleton's order: the state dict's order
    for key, index in by_index.items():
        tensor = saved[key]
        assert isinstance(tensor, torch.Tensor)
        offset = parsed.tensors[index][2]
        assert (start + offset) % 64 == tensor.data_ptr() % 64, key
    current = {"w": torch.zeros(1024, 1027), "v": torch.zeros(69_997), "b": torch.zeros(5), "meta": ""}
    load_part(parsed, data, current)
    assert all(torch.equal(current[k], saved[k]) for k in ("w", "v", "b"))  # type: ignore[arg-type]

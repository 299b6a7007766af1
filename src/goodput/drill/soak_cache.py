"""The soak's check of the job's data cache: where it is (the ``cache_config`` events of the job's ledger), the
bytes it holds on disk, and the rule that those stay within its budget.

The bytes are those the budget counts (``goodput.data.cache``): complete files under ``files/`` and downloads in
flight under ``tmp/``; the private copies under ``uncached/`` are outside the budget by design. They are read
from the disk, not from the cache's own index, so a file the index lost track of counts too. Downloads are read
before files and each file once (a finished download keeps its inode when it is renamed into ``files/``), so
no reading counts one file twice. A download whose owner is dead (a rank SIGKILLed mid-download: its part file
is named ``<key>.<pid>-<start time>.part``) is left out, as the cache's index leaves it out: the cache removes
it when it next starts, and a soak that kills ranks would otherwise call that moment's debris a violation.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

from goodput.data._cacheindex import owner_alive, part_owner
from goodput.ledger.files import LEDGER_DIR
from goodput.ledger.index import INDEX_SUFFIX

__all__ = ["CacheSample", "LedgerCaches", "held_bytes", "over_budget"]

_COUNTED = ("tmp", "files")  # in this order: a download renamed between the two listings is seen once


@dataclasses.dataclass(frozen=True)
class CacheSample:
    """One reading of one cache folder: the bytes it held on disk against its budget."""

    seconds: float
    folder: str
    held: int
    budget: int


def over_budget(sample: CacheSample) -> str:
    """Why ``sample`` is a violation (empty: within the budget)."""
    if sample.held <= sample.budget:
        return ""
    return (
        f"the data cache {sample.folder} held {sample.held} bytes at {sample.seconds:.1f}s, over its budget of "
        f"{sample.budget} bytes"
    )


def held_bytes(folder: str) -> int:
    """The bytes the budget counts in the cache ``folder`` now (0: no such folder)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for sub in _COUNTED:
        try:
            entries = list(os.scandir(os.path.join(folder, sub)))
        except OSError:
            continue
        for entry in entries:
            if sub == "tmp" and not _writer_alive(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # evicted, or renamed into files/ since the listing
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _writer_alive(name: str) -> bool:
    """Whether the process downloading into the part file ``name`` (``<key>.<pid>-<start>.part``) still runs."""
    owner = part_owner(name)
    return owner is None or owner_alive(owner)  # a name the cache does not write: counted


class LedgerCaches:
    """The cache folders the job in ``run_dir`` declared in its ledger and their budgets, as the attempts'
    indexes grow (each read from where the last look stopped).

    A folder declared with several budgets (processes configured apart) is held to the largest: each of them
    evicts only down to its own.
    """

    def __init__(self, run_dir: str) -> None:
        self._pattern = os.path.join(run_dir, LEDGER_DIR, f"attempt-*{INDEX_SUFFIX}")
        self._read: dict[str, int] = {}  # index file -> bytes read of it (whole lines)
        self.budgets: dict[str, int] = {}

    def look(self) -> dict[str, int]:
        """Folder -> budget in bytes, with what the ledger gained since the last look."""
        for path in sorted(glob.glob(self._pattern)):
            start = self._read.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read()
            except OSError:
                continue
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being appended is read next time
            self._read[path] = start + len(whole)
            for line in whole.splitlines():
                if b"cache_config" in line:
                    self._declared(line)
        return self.budgets

    def _declared(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            if event.get("event") != "cache_config":
                return
            folder, budget = str(event["folder"]), int(event["budget_bytes"])
        except (ValueError, KeyError, TypeError):
            return  # a line another rank's append overwrote: the next attempt declares the cache again
        self.budgets[folder] = max(budget, self.budgets.get(folder, 0))

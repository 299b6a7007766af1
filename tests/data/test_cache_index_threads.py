"""The cache index under the load of a node's readers: several processes, each with a reader thread and a
prefetch thread sharing the process's SQLite connection, reserving (with evictions), committing, pinning and
hitting the same small set of files. No operation may fail: SQLite's busy wait covers a writer that waits for
another, and none may fail at once with "database is locked" (a statement left open past a transaction keeps
the connection in a read transaction, where SQLite returns busy without waiting)."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
from pathlib import Path
from typing import Any

from goodput.data._cacheindex import CacheIndex

PROCESSES = 4
THREADS = 2
OPERATIONS = 3000  # per thread


def _hammer(path: str, seed: int, queue: Any) -> None:
    index = CacheIndex(path)
    owner = str(os.getpid())
    errors: list[str] = []

    def thread(n: int) -> None:
        rng = random.Random(seed * THREADS + n)
        for _ in range(OPERATIONS):
            key = f"file-{rng.randrange(100)}"
            try:
                op = rng.randrange(4)
                if op == 0:  # a budget of ~40 files' bytes for 100 files: most reservations evict
                    reserved, _, _ = index.reserve(key, rng.randrange(1, 1000), owner, 20_000, lambda k: None)
                    if reserved:
                        index.commit(key, 500, {"misses": 1})
                elif op == 1:
                    index.pin_and_hit(key, owner, 1.0)
                elif op == 2:
                    index.unpin(key, owner, "use")
                else:
                    index.mark_hit(key, 2.0, {"hits": 1})
            except Exception as err:  # every failure is the finding
                errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=thread, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(errors)


def test_readers_threads_and_processes_share_the_index_without_a_failed_operation(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    path = str(tmp_path / "index.sqlite")
    CacheIndex(path)  # created once, as the first reader of a node does
    processes = [context.Process(target=_hammer, args=(path, seed, queue)) for seed in range(PROCESSES)]
    for p in processes:
        p.start()
    try:
        errors = [e for _ in processes for e in queue.get(timeout=240)]
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert errors == [], f"{len(errors)} failed operations, first: {errors[:3]}"
    assert CacheIndex(path).usage() <= 20_000 + 1000  # the budget held (one reservation may be the last)

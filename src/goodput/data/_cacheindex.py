"""The cache folder's shared index: which files are ready, reserved or pinned, by which process, and how big.

One SQLite database in the cache folder is the single source of truth for every process on the node
(DataLoader workers, ranks, the prefetcher), so the byte budget is counted once, whatever the number of
readers. A process that dies leaves rows behind that name it; the next writer finds the owner gone
(``/proc/<pid>`` start time differs) and drops them, so a crash never leaks budget or pins.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries(
    key TEXT PRIMARY KEY, size INTEGER NOT NULL, state TEXT NOT NULL, owner TEXT NOT NULL,
    last_used REAL NOT NULL, ready_at REAL, last_hit REAL);
CREATE TABLE IF NOT EXISTS pins(
    key TEXT NOT NULL, owner TEXT NOT NULL, kind TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY(key, owner, kind));
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value REAL NOT NULL);
"""
# Held around every use of this process's SQLite connections, and by fork(): a forked child (a DataLoader
# worker) must never inherit an open SQLite connection, whose lock state would make the child's own
# connections wait forever. Connections stay open between operations (opening one costs more than most operations) and are
# closed just before a fork; both sides reopen them lazily.
_PROCESS_LOCK = threading.RLock()
_CONNECTIONS: dict[str, sqlite3.Connection] = {}


def close_connections() -> None:
    """Close this process's index connections (they reopen on next use)."""
    with _PROCESS_LOCK:
        for db in _CONNECTIONS.values():
            db.close()
        _CONNECTIONS.clear()


def _before_fork() -> None:
    _PROCESS_LOCK.acquire()
    close_connections()


def _after_fork_in_parent() -> None:
    _PROCESS_LOCK.release()


def _after_fork_in_child() -> None:
    global _PROCESS_LOCK
    _PROCESS_LOCK = threading.RLock()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
READY = "ready"
LOADING = "loading"


def owner_token(pid: int | None = None) -> str:
    """``pid:start-time``: names a process uniquely even when pids are reused after a restart."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def part_name(key: str, owner: str) -> str:
    """The name of ``owner``'s download of ``key`` under the cache's ``tmp/`` folder."""
    return f"{key}.{owner.replace(':', '-')}.part"


def part_owner(name: str) -> str | None:
    """The owner token of the download named ``name`` (:func:`part_name`); None for another name."""
    parts = name.split(".")
    if len(parts) != 3 or parts[2] != "part":
        return None
    return parts[1].replace("-", ":", 1)


def owner_alive(token: str) -> bool:
    """Whether the process named by ``token`` still runs."""
    pid_text, _, start = token.partition(":")
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return start == "?" or _start_time(int(pid_text)) == start


@dataclass(frozen=True)
class Entry:
    """One row of the index."""

    key: str
    size: int
    state: str
    owner: str
    ready_at: float | None
    last_hit: float | None


class CacheIndex:
    """Transactions over the shared index.

    Each operation opens its own SQLite connection and closes it, under a process-wide lock that ``fork`` also
    takes: a forked child (a DataLoader worker) must never inherit an open SQLite connection, whose lock state
    would make the child's own connections wait forever.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # Ranks and workers of a node open a fresh index at the same moment: create it one at a time, or a
        # creator that finds the file mid-creation ("database is locked") would take it for damaged.
        with open(path + ".init-lock", "a+") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            try:
                self._create()
            finally:
                fcntl.lockf(lock, fcntl.LOCK_UN)

    def _create(self) -> None:
        path = self.path
        try:
            with self._tx() as tx:
                tx.executescript(_SCHEMA)
                tx.execute("SELECT COUNT(*) FROM entries").fetchone()
        except sqlite3.OperationalError:
            raise  # busy or locked: a live index, never to be discarded
        except sqlite3.DatabaseError:
            with _PROCESS_LOCK:
                stale = _CONNECTIONS.pop(path, None)
                if stale is not None:
                    stale.close()
            # Only an OS crash can leave the index damaged (writes skip fsync). A cache can always be rebuilt:
            # start an empty index; the cache then drops the files it no longer knows.
            for suffix in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)
            with self._tx() as tx:
                tx.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with _PROCESS_LOCK:
            db = _CONNECTIONS.get(self.path)
            if db is None:
                db = sqlite3.connect(self.path, timeout=120.0, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                # No fsync per transaction (it costs milliseconds here): a process crash loses nothing, and
                # an OS crash at worst damages the index, which is then rebuilt (see __init__).
                db.execute("PRAGMA synchronous=OFF")
                _CONNECTIONS[self.path] = db
            yield db

    @contextlib.contextmanager
    def _tx(self) -> Iterator[_Transaction]:
        with self._db() as db, _Transaction(db) as tx:
            yield tx

    # ---- reads -------------------------------------------------------------------------------------
    def entry(self, key: str) -> Entry | None:
        with self._db() as db:
            return _entry(db, key)

    def hit_since(self, keys: Iterable[str], since: float) -> set[str]:
        """The keys among ``keys`` that a reader used at or after ``since``."""
        keys = list(keys)
        found: set[str] = set()
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            with self._db() as db:
                rows = db.execute(
                    f"SELECT key FROM entries WHERE key IN ({marks}) AND last_hit >= ?", (*part, since)
                ).fetchall()
            found.update(r[0] for r in rows)
        return found

    def usage(self) -> int:
        """Bytes counted against the budget: ready files plus reservations of downloads in flight."""
        with self._db() as db:
            return int(db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0])

    def counters(self) -> dict[str, float]:
        with self._db() as db:
            return dict(db.execute("SELECT name, value FROM counters").fetchall())

    # ---- writes ------------------------------------------------------------------------------------
    def pin_and_get(self, key: str, owner: str, kind: str) -> Entry | None:
        """Pin ``key`` for ``owner`` (so it cannot be evicted) and return its entry, in one transaction."""
        with self._tx() as db:
            _add_pin(db, key, owner, kind, +1)
            return _entry(db, key)

    def pin_and_hit(self, key: str, owner: str, now: float) -> tuple[Entry | None, float | None]:
        """Pin ``key`` for a reader and, when it is ready, record the hit; returns (entry, prefetch lead)."""
        with self._tx() as db:
            _add_pin(db, key, owner, "use", +1)
            entry = _entry(db, key)
            if entry is None or entry.state != READY:
                return entry, None
            lead = None
            if entry.ready_at is not None and (entry.last_hit is None or entry.last_hit < entry.ready_at):
                lead = now - entry.ready_at
            db.execute("UPDATE entries SET last_used=?, last_hit=? WHERE key=?", (now, now, key))
            _bump(db, {"hits": 1})
            return entry, lead

    def unpin(self, key: str, owner: str, kind: str) -> None:
        with self._tx() as db:
            _add_pin(db, key, owner, kind, -1)

    def mark_hit(self, key: str, now: float, counters: dict[str, float]) -> float | None:
        """Record a reader's use of a ready file; returns the prefetch lead when this is its first use."""
        with self._tx() as db:
            row = db.execute("SELECT ready_at, last_hit FROM entries WHERE key=?", (key,)).fetchone()
            lead = None
            if row is not None and row[0] is not None and (row[1] is None or row[1] < row[0]):
                lead = now - row[0]
            db.execute("UPDATE entries SET last_used=?, last_hit=? WHERE key=?", (now, now, key))
            _bump(db, counters)
            return lead

    def reserve(
        self,
        key: str,
        size: int,
        owner: str,
        budget: int,
        evict: Callable[[str], None],
        *,
        break_windows: bool = False,
    ) -> tuple[bool, int, int]:
        """Count ``size`` bytes for a download of ``key``, evicting least-recently-used unpinned files.

        With ``break_windows`` (a read that needs the file now) files pinned only by prefetch windows may go
        too, after every unpinned one: a window is a lease on a file nobody reads yet, and its reader will
        download it again if it comes to need it. Returns (reserved, evictions, bytes of files in use).
        Nothing changes when the budget cannot be met.
        """
        with self._tx() as db:
            self._drop_dead_owners(db)
            db.execute("DELETE FROM entries WHERE key=?", (key,))
            used = int(db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0])
            victims: list[tuple[str, int]] = []
            if used + size > budget:
                held = "SELECT key FROM pins" + (" WHERE kind='use'" if break_windows else "")
                # read to the end here: a statement left open past the transaction (this loop stops early)
                # would keep the connection in a read transaction after the lock is released, and the next
                # thread's BEGIN IMMEDIATE would fail at once with "database is locked" (no busy wait)
                rows = db.execute(
                    f"SELECT key, size FROM entries WHERE state=? AND key NOT IN ({held})"
                    " ORDER BY key IN (SELECT key FROM pins), last_used",
                    (READY,),
                ).fetchall()
                for victim, victim_size in rows:
                    if used + size <= budget:
                        break
                    victims.append((victim, victim_size))
                    used -= victim_size
            if used + size > budget:
                pinned = int(
                    db.execute(
                        "SELECT COALESCE(SUM(size), 0) FROM entries WHERE key IN "
                        "(SELECT key FROM pins WHERE kind='use')"
                    ).fetchone()[0]
                )
                db.rollback_requested = True
                return False, 0, pinned
            for victim, _ in victims:
                db.execute("DELETE FROM entries WHERE key=?", (victim,))
                evict(victim)
            db.execute(
                "INSERT INTO entries(key, size, state, owner, last_used) VALUES (?, ?, ?, ?, ?)",
                (key, size, LOADING, owner, time.time()),
            )
            if victims:
                _bump(db, {"evictions": len(victims)})
            return True, len(victims), 0

    def commit(self, key: str, size: int, counters: dict[str, float]) -> None:
        """The download of ``key`` is complete, verified and renamed into place."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "UPDATE entries SET state=?, size=?, last_used=?, ready_at=?, last_hit=NULL WHERE key=?",
                (READY, size, now, now, key),
            )
            _bump(db, counters)

    def abort(self, key: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM entries WHERE key=? AND state=?", (key, LOADING))

    def forget(self, key: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM entries WHERE key=?", (key,))

    def bump(self, counters: dict[str, float]) -> None:
        with self._tx() as db:
            _bump(db, counters)

    def drop_dead_owners(self) -> None:
        with self._tx() as db:
            self._drop_dead_owners(db)

    def ready_keys(self) -> set[str]:
        with self._db() as db:
            return {r[0] for r in db.execute("SELECT key FROM entries WHERE state=?", (READY,))}

    @staticmethod
    def _drop_dead_owners(db: _Transaction) -> None:
        owners = {
            r[0]
            for r in db.execute(
                "SELECT owner FROM pins UNION SELECT owner FROM entries WHERE state=?", (LOADING,)
            )
        }
        for owner in owners:
            if not owner_alive(owner):
                db.execute("DELETE FROM pins WHERE owner=?", (owner,))
                db.execute("DELETE FROM entries WHERE owner=? AND state=?", (owner, LOADING))


def _entry(db: sqlite3.Connection | _Transaction, key: str) -> Entry | None:
    row = db.execute(
        "SELECT key, size, state, owner, ready_at, last_hit FROM entries WHERE key=?", (key,)
    ).fetchone()
    return None if row is None else Entry(*row)


def _add_pin(db: _Transaction, key: str, owner: str, kind: str, delta: int) -> None:
    db.execute(
        "INSERT INTO pins(key, owner, kind, count) VALUES (?, ?, ?, ?)"
        " ON CONFLICT(key, owner, kind) DO UPDATE SET count = count + excluded.count",
        (key, owner, kind, delta),
    )
    db.execute("DELETE FROM pins WHERE key=? AND owner=? AND kind=? AND count <= 0", (key, owner, kind))


def _bump(db: _Transaction, counters: dict[str, float]) -> None:
    for name, value in counters.items():
        if value:
            db.execute(
                "INSERT INTO counters(name, value) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, value),
            )


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK`` on error or on request) around a block."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.rollback_requested = False

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, params)

    def executescript(self, sql: str) -> None:
        for statement in sql.split(";"):
            if statement.strip():
                self._db.execute(statement)

    def __enter__(self) -> _Transaction:
        self._db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None or self.rollback_requested else "COMMIT")

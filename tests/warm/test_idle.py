"""Hot spares wait under SCHED_IDLE; a spare handed a rank has every thread put back under the normal policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from goodput.warm.idle import can_return, make_idle, make_normal

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    print("ready", flush=True)
    sys.stdin.readline()                         # made idle by the parent by now
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)  # started while idle: it inherits the policy
    thread.start()
    print(json.dumps(sorted(os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task"))), flush=True)
    sys.stdin.readline()                         # put back by the parent by now
    print(json.dumps(sorted(os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task"))), flush=True)
    stop.set()
    thread.join()
    """
)


def test_a_spare_waits_idle_and_every_thread_is_put_back() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        idle = can_return() and make_idle(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        before = json.loads(child.stdout.readline())
        make_normal(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        after = json.loads(child.stdout.readline())
    finally:
        child.wait(timeout=30)
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    assert before == [policy, policy]  # the main thread and the thread it started while idle
    assert after == [os.SCHED_OTHER, os.SCHED_OTHER]
    assert child.returncode == 0

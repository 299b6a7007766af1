"""The spare template: one process per node imports what a hot spare imports, once, and forks the spares.

``python -u -m goodput.warm.template REQUESTS REPLIES AGENT SCRIPT ARGS...`` is started by the warm agent
(``goodput.warm.forked``) when its first spares are due, with a spare's environment. It holds the collector back
(``goodput.warm.boot``), imports torch, goodput's worker side and the script's own top-level imports, and then
waits on the pipe ``REQUESTS`` (file descriptor numbers). For each request (one JSON line: the spare's
environment and where its stdout and stderr go) it forks a spare and writes the spare's pid to ``REPLIES``.

A spare made so costs a fork instead of the seconds of CPU its imports took: it runs the script as ``__main__``
as a spawned spare does, finds every module already imported, and waits in ``Run`` for a rank.

What a fork shares is kept safe: the template starts no thread (it refuses to fork if a Python thread runs: a
fork copies only the thread that calls it; native pools such as numpy's BLAS threads stop and restart
around a fork through their own ``pthread_atfork`` handlers), does no tensor operation (torch's intra-op pool starts on the first one, in
each spare for itself) and starts no process group. Python reseeds ``random`` in every fork; numpy's global
generator is reseeded from the OS, as its import would; torch's default generator still holds its import-time
seed (every rank sets its own later).

Each spare is forked twice and its middle process exits at once, so the spare is adopted by the agent (a child
subreaper): the agent reaps it, reads its exit status and is the parent whose death ends it
(``PR_SET_PDEATHSIG``), exactly as for a spawned spare; a dying template takes no spare with it. The spare leads
its own session, as a spawned one does, so the agent can end it with its data-loader processes.
"""

from __future__ import annotations

import ast
import gc
import importlib
import json
import os
import sys
import threading
import time
from typing import Any

from goodput._lifetime import end_with_parent
from goodput.warm import boot

__all__ = ["PRELOAD", "READY", "main", "script_imports"]

READY = "ready"  # the template's first line on REPLIES once it can fork; any other first line says why not
# Imported by every spare before it waits: torch, what Run needs, and torch._dynamo (imported by every
# torch.optim optimizer when it is built, so a spare handed a rank builds its optimizer without it).
PRELOAD = ("torch", "torch.distributed", "goodput", "goodput.run", "goodput.warm.worker", "torch._dynamo")
_ADOPTION_SECONDS = 10.0  # how long a spare waits to be adopted by the agent before it gives up
_middle: int | None = None  # in a spare: the pid of the middle process it was forked from


def script_imports(source: str) -> list[str]:
    """The absolute modules a script's top level imports (``import a.b``, ``from a.b import c``), in order."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return list(dict.fromkeys(names))


def _preload(script: str) -> list[str]:
    """Import ``PRELOAD`` and the script's top-level imports; returns those that failed (the spare will meet
    the same error when it runs the script, where the user sees it)."""
    with open(script) as f:
        names = [*PRELOAD, *script_imports(f.read())]
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
    return failed


def _fork_spare() -> int:
    """Fork a spare through a middle process that exits at once; the spare's pid here (0 in the spare)."""
    global _middle
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        _middle = os.getpid()
        try:
            spare = os.fork()
        except OSError:
            os._exit(1)
        if spare == 0:
            os.close(write)
            return 0
        os.write(write, str(spare).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    os.waitpid(middle, 0)  # once the middle process is reaped, its child has been adopted
    return int(answer) if answer else -1


def _serve(requests: int, replies: int) -> dict[str, Any] | None:
    """Fork a spare per request until the agent closes the pipe; returns the request in a spare, else None."""
    with os.fdopen(requests) as lines:
        for line in lines:
            pid = _fork_spare()
            if pid == 0:
                os.close(replies)
                return dict(json.loads(line))
            os.write(replies, f"{pid}\n".encode())
    return None


def _become_spare(request: dict[str, Any], agent: int) -> None:
    """Take the agent for parent and the spare's session, streams and environment."""
    deadline = time.monotonic() + _ADOPTION_SECONDS
    while (parent := os.getppid()) != agent:  # adoption by the subreaper happens as the middle process exits
        # adopted by another process: the agent ended while this spare was forked, and so must the spare, now
        if (_middle is not None and parent != _middle) or time.monotonic() > deadline:
            os._exit(1)
        time.sleep(0.001)
    end_with_parent(agent)
    os.setsid()
    with open(os.devnull) as null:
        os.dup2(null.fileno(), 0)
    for fd, path in ((1, request.get("stdout")), (2, request.get("stderr"))):
        if path:  # else the agent's stream, inherited, as a spawned spare's with --verbose
            with open(path, "w") as f:
                os.dup2(f.fileno(), fd)
    os.environ.clear()
    os.environ.update(request["env"])
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def main(argv: list[str]) -> None:
    """Import, then fork spares on request (see the module docstring); a spare goes on to run the script."""
    requests, replies, agent = (int(arg) for arg in argv[:3])
    script = argv[3:]
    boot.hold()
    end_with_parent(agent)
    sys.path[0] = os.path.dirname(os.path.abspath(script[0]))
    failed = _preload(script[0])
    gc.freeze()  # imported objects to the permanent generation: no collection dirties their pages in a fork
    if threading.active_count() != 1:
        names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        os.write(replies, f"threads running after the imports: {', '.join(names)}\n".encode())
        return
    os.write(replies, f"{READY} {json.dumps({'failed_imports': failed})}\n".encode())
    request = _serve(requests, replies)
    if request is None:
        return
    _become_spare(request, agent)
    boot.main(script)


if __name__ == "__main__":
    # Run as ``python -m``, this module is ``__main__``: boot's hold and release must act on the module Run imports.
    from goodput.warm.template import main as _main

    _main(sys.argv[1:])

"""Keep goodput's storage I/O off the user's global random generators.

A training script that seeds Python's ``random`` expects its stream to depend on its own draws only: goodput
captures that generator in every checkpoint and puts it back on restore, so a resumed run draws what the
uninterrupted one drew. The object-store clients under fsspec draw from that same global generator: botocore
jitters every retry's backoff with ``random.random()`` (``retryhandler.delay_exponential`` in the legacy retry
mode; ``retries.standard.ExponentialBackoff``, whose ``random`` argument defaults to the global generator's
bound method, in the standard and adaptive modes), and aiohttp's connection pool shuffles its waiting hosts with
``random.shuffle``. Those draws happen on fsspec's I/O thread, in the middle of the user's steps when a save is
asynchronous, and only when the store retried or the pool was full: one 503 or reset connection during a save
moved the user's stream, and a run with checkpoints on S3 no longer resumed to the bits of the same run on disk.

Saving and restoring the global state around goodput's calls cannot fix this: the draws come from another
thread while the user's thread draws too, so any restore would also undo the user's own draws. Instead,
:func:`isolate_store_clients` gives those library modules a generator of their own: their module name
``random`` becomes a copy of the ``random`` module whose functions are bound to a private ``random.Random``
(everything else, ``Random`` and ``SystemRandom`` included, is the real module's), and defaults bound to the
global generator are rebound to the private one. The jitter keeps its distribution and stays unpredictable
(the private generator is seeded from the OS, so ranks still back off at different times); only which
generator it consumes changes, for every client of the process, the user's own included. Nothing else of
those libraries changes, and no generator is ever set back, so it is safe with any number of threads.

goodput's own jitter (the data cache's retries and lock backoff) draws from :data:`OWN_RANDOM`.
"""

from __future__ import annotations

import importlib
import os
import random
import threading
import types
from typing import Any

__all__ = ["OWN_RANDOM", "isolate_store_clients"]

OWN_RANDOM = random.Random()  # seeded from the OS: goodput's jitter, never the user's stream
os.register_at_fork(after_in_child=OWN_RANDOM.seed)  # as the global one: forked ranks must not jitter alike

# The modules that call the global generator's functions through their name ``random``.
_MODULES = ("botocore.retryhandler", "botocore.utils", "aiohttp.connector")
# Functions whose defaults hold the global generator's bound methods (taken when the module was imported).
_DEFAULTS = (("botocore.retries.standard", "ExponentialBackoff"),)

_LOCAL = frozenset({"file", "local"})
_GLOBAL = vars(random)["_inst"]  # the generator behind random.random(), random.seed(), ...
_lock = threading.Lock()
_done = False


def _own_module(generator: random.Random) -> types.ModuleType:
    """A copy of the ``random`` module whose generator functions draw from ``generator``."""
    module = types.ModuleType("random", random.__doc__)
    module.__dict__.update({k: v for k, v in vars(random).items() if not k.startswith("__")})
    for name, value in vars(random).items():
        if getattr(value, "__self__", None) is _GLOBAL:
            setattr(module, name, getattr(generator, name))
    module._inst = generator  # type: ignore[attr-defined]
    return module


def _rebind_defaults(function: Any, generator: random.Random) -> None:
    defaults = getattr(function, "__defaults__", None)
    if not defaults:
        return
    function.__defaults__ = tuple(
        getattr(generator, d.__name__) if getattr(d, "__self__", None) is _GLOBAL else d for d in defaults
    )


def _imported(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # that client is not installed: nothing of it can draw
        return None


def isolate_store_clients(url: str) -> None:
    """Give the object-store client libraries (botocore, aiohttp) a generator of their own; idempotent.

    Called by goodput before it opens the checkpoint root or dataset at ``url``, so its first request is
    covered; a local path needs no client, and its callers pay no import.
    """
    global _done
    if _done:
        return
    from fsspec.utils import get_protocol

    if get_protocol(url) in _LOCAL:
        return
    with _lock:
        if _done:
            return
        generator = random.Random()
        os.register_at_fork(after_in_child=generator.seed)
        own = _own_module(generator)
        for name in _MODULES:
            module = _imported(name)
            if module is not None and getattr(module, "random", None) is random:
                module.random = own  # type: ignore[attr-defined]
        for name, cls in _DEFAULTS:
            module = _imported(name)
            if module is not None and hasattr(module, cls):
                _rebind_defaults(getattr(module, cls).__init__, generator)
        _done = True

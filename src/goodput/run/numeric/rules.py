"""The numeric guard's pure parts: each rank's word for a step, the fingerprint of a replica, the spike rule and
the verdict every rank draws from every rank's word (no clock, no files, no collectives).

Every rank contributes one row of four int64 per step (:func:`encode_row`); after one all-gather each rank holds
every row and calls :func:`verdict` on the same matrix, so every rank reaches the same decision without a second
round: no rank acts alone.
"""

from __future__ import annotations

import bisect
import math
import statistics
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "FLAG_FINGERPRINT",
    "FLAG_GRAD_BAD",
    "FLAG_LOSS",
    "FLAG_LOSS_BAD",
    "FLAG_PARAMS_BAD",
    "FLAG_SELF_DIFFERS",
    "RECENT",
    "ROW_WORDS",
    "Verdict",
    "decode_row",
    "encode_row",
    "fingerprint",
    "spike_rise",
    "spike_threshold",
    "verdict",
]

FLAG_LOSS = 1  # a loss was given to step_done
FLAG_LOSS_BAD = 2  # ... and it is NaN or infinite
FLAG_GRAD_BAD = 4  # a gradient was NaN or infinite before the optimizer step (the step was not applied)
FLAG_FINGERPRINT = 8  # the row carries the parameters' fingerprint (a check step)
FLAG_SELF_DIFFERS = 16  # this rank fingerprinted this step before (a redo) and got another value then
FLAG_PARAMS_BAD = 32  # ... and its parameters' sum is NaN or infinite (a gradient no check saw reached them)

_LOG_MAX = math.log(sys.float_info.max)
RECENT = 10  # the last steps whose median is the loss's current level for the spike rule
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


ROW_WORDS = 4  # int64s in a row of encode_row


def encode_row(flags: int, loss: float, fp: int, grad_value: float) -> list[int]:
    """One rank's word (:data:`ROW_WORDS` int64s): flags, the loss and the bad gradient's norm as float64 bits,
    the fingerprint."""
    return [flags, _bits(loss), fp, _bits(grad_value)]


def decode_row(row: Sequence[int]) -> tuple[int, float, int, float]:
    """(flags, loss, fingerprint, gradient value) of a row made by :func:`encode_row`."""
    return int(row[0]), _float(int(row[1])), int(row[2]), _float(int(row[3]))


def fingerprint(tensors: Iterable[torch.Tensor]) -> int:
    """A fingerprint of the tensors' bytes: the sum, in int64, of their elements read as integers of their size.

    Exact and order-independent (integer addition), so bitwise-equal replicas agree on any device, and any one
    flipped bit changes it: the element changes by plus or minus 2**k, which no wrap-around modulo 2**64 can
    cancel. Several flips cancel only when their changes sum to zero modulo 2**64. One pass over the bytes, on
    the tensors' own device; one host synchronisation for the result.
    """
    total: torch.Tensor | None = None
    for tensor in tensors:
        local = tensor.detach()
        to_local = getattr(local, "to_local", None)
        if callable(to_local):  # a DTensor: this rank's shard or replica
            local = to_local()
        if local.numel() == 0:
            continue
        flat = local.contiguous().reshape(-1).view(_INT_OF_SIZE[local.element_size()])
        part = flat.sum(dtype=torch.int64)
        total = part if total is None else total + part
    return 0 if total is None else int(total.item())


def spike_threshold(history: Sequence[float], *, k: float, min_rise: float) -> float:
    """The loss above which a step is a spike: a rise above the loss's current level (the median of its last
    ``RECENT`` steps) by more than ``k`` x the spread of the window's own rises and by at least ``min_rise`` x the
    level.

    Measured on the logarithm of the losses when they are all positive (every loss of a likelihood, a cross
    entropy or a squared error is), else on the losses themselves. A small batch's loss is skewed to the
    right (a few samples with large errors dominate a mean of squares): on its own scale, its ordinary steps
    reach many MADs above the median, while their logarithm is nearly symmetric, so a spike is a jump by a
    factor that the recent steps' own rises do not explain. Each rise of the window is a step's value less the
    median of the ``RECENT`` steps before it, the very statistic a new step is judged on, so its spread holds the
    noise of the level too, and not the fall of a loss that is still falling (the level follows it). The spread
    is their standard deviation, not a MAD: a small batch's loss has a tail heavier than a normal's even in
    factors, and a MAD, which leaves the tail out, would call its ordinary tail steps spikes. The
    floor keeps a flat loss (no noise) from calling every small rise a spike.
    """
    logs = min(history) > 0
    values = [math.log(x) for x in history] if logs else list(history)
    level = statistics.median(values[-RECENT:])
    rises = _rises(values)
    noise = _spread(rises) if len(rises) > 1 else 0.0
    if not logs:
        return level + max(k * noise, min_rise * abs(level))
    exponent = level + max(k * noise, math.log1p(min_rise))
    return math.exp(exponent) if exponent < _LOG_MAX else math.inf


def _rises(values: Sequence[float]) -> list[float]:
    """Each value after the first less the median of the (up to) ``RECENT`` values before it (a sorted sliding
    window: the guard judges every step, so this runs once per step over the whole window)."""
    window: list[float] = []
    rises = []
    for i in range(1, len(values)):
        bisect.insort(window, values[i - 1])
        if i > RECENT:
            del window[bisect.bisect_left(window, values[i - 1 - RECENT])]
        middle = len(window) // 2
        median = window[middle] if len(window) % 2 else (window[middle - 1] + window[middle]) / 2
        rises.append(values[i] - median)
    return rises


def _spread(values: Sequence[float]) -> float:
    """The population standard deviation of ``values`` (in floats: ``statistics.pstdev`` is exact and slow)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in values) / len(values))


def spike_rise(history: Sequence[float], *, k: float, min_rise: float) -> float | None:
    """The smallest rise, as a factor of the loss's current level, that :func:`spike_threshold` calls a spike
    after ``history`` (None where the losses are not all positive: the rule then measures differences)."""
    if not history or min(history) <= 0:
        return None
    level = math.exp(statistics.median(math.log(x) for x in history[-RECENT:]))
    return spike_threshold(history, k=k, min_rise=min_rise) / level


@dataclass(frozen=True)
class Verdict:
    """What every rank concluded about one step.

    ``kind``: None (nothing wrong), ``"nonfinite"``, ``"spike"`` or ``"sdc"`` (replicas' parameters differ).
    ``rank``: the rank that saw it or is named (None when none can be named); ``value``: what was seen (the
    loss, the gradient norm, or the odd fingerprint). ``agreed``: the fingerprints of this check step agreed.
    ``named``: a rank whose redo of this step fingerprinted differently from its first run (the self-check), when
    exactly one rank did. ``mean_loss``: the finite losses' mean (for the spike rule's window).
    """

    kind: str | None
    rank: int | None
    value: float | None
    detail: str
    agreed: bool
    named: int | None
    mean_loss: float | None


def verdict(
    rows: Sequence[Sequence[int]], *, history: Sequence[float], warmup: int, k: float, min_rise: float,
    spikes: bool, comparable: bool,
) -> Verdict:  # fmt: skip
    """Every rank's conclusion from every rank's row (see the module docstring)."""
    words = [decode_row(r) for r in rows]
    self_differs = [r for r, w in enumerate(words) if w[0] & FLAG_SELF_DIFFERS]
    named = self_differs[0] if len(self_differs) == 1 else None
    losses = [w[1] for w in words if w[0] & FLAG_LOSS and not w[0] & FLAG_LOSS_BAD]
    mean = math.fsum(losses) / len(losses) if losses else None
    agreed, odd, detail = _compare(words, comparable)
    agreed = agreed and not any(w[0] & FLAG_PARAMS_BAD for w in words)  # a check agrees on finite parameters
    if len(words) > 1 and all(
        w[0] & FLAG_GRAD_BAD for w in words
    ):  # DDP's reduced gradients: the same everywhere
        return Verdict("nonfinite", None, words[0][3], "the reduced gradients", agreed, named, mean)
    for r, (flags, loss, _, grad) in enumerate(words):
        if flags & FLAG_GRAD_BAD:
            return Verdict("nonfinite", r, grad, "a gradient", agreed, named, mean)
        if flags & FLAG_LOSS_BAD:
            return Verdict("nonfinite", r, loss, "the loss", agreed, named, mean)
        if flags & FLAG_PARAMS_BAD:
            return Verdict("nonfinite", r, grad, "the parameters", agreed, named, mean)
    if odd is not None:
        rank = odd if odd >= 0 else named
        value = float(words[rank][2]) if rank is not None else None
        return Verdict("sdc", rank, value, detail, agreed, named, mean)
    if spikes and mean is not None and len(history) >= warmup:
        limit = spike_threshold(history, k=k, min_rise=min_rise)
        if mean > limit:
            return Verdict("spike", None, mean, f"above {limit:.4g}", agreed, named, mean)
    return Verdict(None, None, None, "", agreed, named, mean)


def _compare(
    words: Sequence[tuple[int, float, int, float]], comparable: bool
) -> tuple[bool, int | None, str]:
    """(whether the replicas' fingerprints agree, the odd rank (-1: differ but none can be named by majority;
    None: no difference), a description)."""
    prints = [w[2] for w in words if w[0] & FLAG_FINGERPRINT]
    if not comparable or len(prints) != len(words) or len(words) < 2:
        return bool(prints), None, ""
    counts: dict[int, list[int]] = {}
    for r, w in enumerate(words):
        counts.setdefault(w[2], []).append(r)
    if len(counts) == 1:
        return True, None, ""
    majority = max(counts.values(), key=len)
    if len(majority) * 2 > len(words):
        odd = [r for r in range(len(words)) if r not in majority]
        return False, odd[0], f"ranks {odd} differ from the majority {majority}"
    return False, -1, "the replicas' fingerprints differ and no majority names one"

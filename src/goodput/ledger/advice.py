"""The report's advice: one rule per situation, each with the goodput gain it predicts (internal).

Gains come from the planner (Daly's model with the measured figures) where the change is one the model
covers (interval, stall, restart time), scaled by the share of job time the model covers; elsewhere they are
the upper bound the category allows (all of data_wait, for instance) and say so. Shares are of the job time
(the wall time minus the time between launches). Advice never asks for what the run already does: a run on
``every="auto"`` is not told to let auto tune it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from goodput.ledger.stragglers import straggler_advice
from goodput.units import format_duration as fd

if TYPE_CHECKING:
    from goodput.ledger.accounting import Accounting
    from goodput.ledger.report import Advice, MeasuredModel, Prediction

# Thresholds (shares of wall time, ratios) above which advice is given.
DATA_WAIT_SHARE = 0.03
OTHER_SHARE = 0.10
STALL_SHARE = 0.01
INTERVAL_RATIO = 2.0
COLD_HIT_RATE = 0.5
# An async save blocks only for its staging copy: 5-10% of a synchronous save in shared/NOTES-torch.md.
ASYNC_STALL_FRACTION = 0.1
BLOCKING_STRATEGIES = ("torch_save", "dcp", "sync")
HF_TRAINER = (
    "hf_trainer"  # the checkpoint_config strategy of GoodputTrainerCallback: save_steps sets the interval
)


def _points(better: float | None, worse: float | None, share: float) -> float | None:
    if better is None or worse is None:
        return None
    return 100.0 * (better - worse) * share


def _advice(kind: str, text: str, gain: float | None, *, bound: bool = False) -> Advice:
    from goodput.ledger.report import Advice

    return Advice(kind=kind, text=text, gain_points=gain, upper_bound=bound)


def advise(acc: Accounting, model: MeasuredModel, pred: Prediction) -> list[Advice]:
    """Every rule that applies, largest predicted gain first (correctness advice last)."""
    rules = (_interval, _no_checkpoint, _blocking, _data_wait, _cold_cache, _restarts, _other)
    found = [a for rule in rules if (a := rule(acc, model, pred)) is not None]
    found += [_advice("straggler", text, points) for text, points in straggler_advice(acc)]
    found.sort(key=lambda a: -(a.gain_points or 0.0))
    return found + _state(acc)


def _interval(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    tau, best = model.interval, pred.optimal_interval_seconds
    if tau is None or not best or model.mtbf is None:
        return None
    ratio = tau / best
    if 1.0 / INTERVAL_RATIO <= ratio <= INTERVAL_RATIO:
        return None
    gain = _points(model.goodput(best), model.goodput(), pred.modelled_share)
    how = f"{ratio:.1f}x longer than" if ratio > 1 else f"{1 / ratio:.1f}x shorter than"
    if acc.info.get("checkpoint_config", {}).get("strategy") == HF_TRAINER:
        return _save_steps_advice(acc, model, pred, how, gain)
    text = (
        f"checkpoint every {fd(tau)} is {how} the optimum {fd(best)} (C {fd(model.stall)}, "
        f"W {fd(model.persist)}, MTBF {fd(model.mtbf)} {pred.mtbf_source}): "
    )
    if _on_auto(acc):
        text += (
            'the run is on every="auto", which plans from a prior until failures are observed and again at '
            "each restart from the failures of the run's earlier attempts; to use this run's measured rate "
            f'from the start, set every="{fd(best)}"'
        )
    else:
        text += f'checkpoint every {fd(best)}, or let every="auto" tune it'
    return _advice("interval", text, gain)


def _save_steps_advice(
    acc: Accounting, model: MeasuredModel, pred: Prediction, how: str, gain: float | None
) -> Advice | None:
    """The interval advice for a Hugging Face Trainer, whose ``save_steps`` sets it (None: no step time)."""
    best = pred.optimal_interval_seconds
    config = acc.info.get("checkpoint_config", {})
    if acc.step_stats is None or acc.step_stats.median <= 0 or not best or not config.get("every_steps"):
        return None
    steps = max(1, round(best / acc.step_stats.median))
    text = (
        f"save_steps={config['every_steps']} (a checkpoint every {fd(model.interval or 0.0)}) is {how} the "
        f"optimum {fd(best)} (C {fd(model.stall)}, MTBF {fd(model.mtbf or 0.0)} {pred.mtbf_source}): "
        f"set save_steps={steps} in TrainingArguments"
    )
    return _advice("interval", text, gain)


def _on_auto(acc: Accounting) -> bool:
    """Whether the run's durable saves followed ``every="auto"``: the checkpoint config it recorded names no
    fixed interval (neither ``every_steps`` nor ``interval_seconds``), or the live policy changed it."""
    config = acc.info.get("checkpoint_config")
    changed = any(c.get("tier") != "memory" for c in acc.info.get("interval_changes", []))
    fixed = config is not None and ("every_steps" in config or "interval_seconds" in config)
    return changed or (config is not None and not fixed and config.get("strategy") != HF_TRAINER)


def _no_checkpoint(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    if acc.saves or acc.failures == 0 or model.mtbf is None or acc.categories["lost_work"] <= 0:
        return None
    share = acc.categories["lost_work"] / acc.job_seconds
    text = "no checkpoint was saved, so every failure threw away all work since the start: enable checkpoints"
    return _advice("no_checkpoint", text, 100.0 * share, bound=True)


def _blocking(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    if not acc.saves or acc.job_seconds <= 0:
        return None
    stall_share = acc.categories["checkpoint_stall"] / acc.job_seconds
    strategy = acc.info.get("checkpoint_config", {}).get("strategy")
    total_stall = sum(s.stall_seconds or 0.0 for s in acc.saves)
    blocking = strategy in BLOCKING_STRATEGIES or (
        strategy is None and acc.overlap_seconds <= 0.01 * total_stall
    )
    if not blocking or stall_share < STALL_SHARE:
        return None
    cut = model.stall * (1.0 - ASYNC_STALL_FRACTION)
    faster = replace(model, stall=model.stall - cut, persist=model.persist + cut)
    gain = _points(faster.goodput(), model.goodput(), pred.modelled_share)  # at the same interval
    if gain is None:
        return _advice("async", _async_text(strategy, stall_share, model), 100.0 * stall_share, bound=True)
    return _advice("async", _async_text(strategy, stall_share, model), gain)


def _async_text(strategy: str | None, stall_share: float, model: MeasuredModel) -> str:
    name = strategy or "a blocking save"
    return (
        f"checkpoint stalls are {stall_share:.1%} of wall time with {name} (C {fd(model.stall)}): "
        f'strategy="dcp_async" blocks only for the staging copy (about {ASYNC_STALL_FRACTION:.0%} of C)'
    )


def _data_wait(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    share = acc.categories["data_wait"] / acc.job_seconds if acc.job_seconds > 0 else 0.0
    if share <= DATA_WAIT_SHARE or acc.step_stats is None:
        return None
    if acc.info.get("cache_stats"):  # already reading through the cache
        how = "raise num_workers / prefetch_factor, and the cache's prefetch_bytes / prefetch_workers"
    else:
        how = "raise num_workers / prefetch_factor, and enable the local cache for remote data"
    text = (
        f"data_wait is {share:.1%} of wall time ({fd(acc.step_stats.mean_fetch)} per step waiting for the "
        f"batch): {how}"
    )
    return _advice("data_wait", text, 100.0 * share, bound=True)


# what the Run's own post_step_checks event is, where the advice on `other` names it
_CHECKS_NOTE = " (goodput's checks after each step: the numeric guard, the straggler detector)"


def _other(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    share = acc.categories["other"] / acc.job_seconds if acc.job_seconds > 0 else 0.0
    if share <= OTHER_SHARE:
        return None
    named = sorted(acc.info.get("custom", {}).items(), key=lambda kv: -kv[1]["seconds"])
    seen = ", ".join(
        f"{name} {fd(t['seconds'])}" + (_CHECKS_NOTE if name == "post_step_checks" else "")
        for name, t in named
        if t["seconds"] > 0
    )
    text = (
        f"other is {share:.1%} of wall time ({fd(acc.categories['other'])}): time outside steps, saves and "
        "restores (eval, logging, teardown, work between run.step_done() and the next batch)"
        + (f"; events with seconds: {seen}" if seen else "")
        + ": make it rarer or cheaper, and record it with ledger.event(name, seconds=...) to see what it is"
    )
    return _advice("other", text, 100.0 * share, bound=True)


def _cold_cache(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    for stats in acc.info.get("cache_stats", []):
        hits, misses = float(stats.get("hits", 0)), float(stats.get("misses", 0))
        if int(stats.get("epoch", 0)) < 1 or hits + misses == 0 or hits / (hits + misses) >= COLD_HIT_RATE:
            continue
        budget, size = stats.get("budget_bytes"), stats.get("dataset_bytes")
        sizes = f" (budget {budget} B, data {size} B)" if budget and size else ""
        share = acc.categories["data_wait"] / acc.job_seconds if acc.job_seconds > 0 else 0.0
        text = (
            f"the data cache is cold every epoch: hit rate {hits / (hits + misses):.0%} in epoch "
            f"{stats.get('epoch')}{sizes}; the budget is smaller than the data, so each epoch evicts what the "
            "next one needs: raise the cache budget to the dataset size (the gain is bounded by data_wait)"
        )
        return _advice("cold_cache", text, 100.0 * share, bound=True)
    return None


def _restarts(acc: Accounting, model: MeasuredModel, pred: Prediction) -> Advice | None:
    """Shorten the restart: only for a run that restarted (R measured, the sum of its parts as listed)."""
    if not acc.restart_parts or model.interval is None or model.mtbf is None:
        return None
    waste = model.interval / 2.0 + model.persist
    if model.restart + model.detect <= waste:
        return None
    parts = acc.restart_parts
    halved = replace(model, restart=model.restart / 2.0)
    gain = _points(halved.goodput(), model.goodput(), pred.modelled_share)
    text = (
        f"each restart costs R {fd(model.restart)} (downtime {fd(parts['restart_downtime'])}, init "
        f"{fd(parts['init'])}, restore {fd(parts['checkpoint_restore'])}) after a detection of "
        f"{fd(model.detect)}, more than the {fd(waste)} of work a failure loses at this interval: shorten init "
        "and restore (fewer imports before training, restore from a local copy); the gain shown is for halving R"
    )
    return _advice("restart", text, gain)


def _state(acc: Accounting) -> list[Advice]:
    registered = acc.info.get("state_registered")
    if registered is None:
        return []
    keys = set(registered.get("keys", []))
    out = []
    if "data" not in keys:
        out.append(
            _advice(
                "state_data",
                "no data position is checkpointed: a restart re-reads or skips samples; register the loader "
                "(run.restore(..., loader=loader)) so each sample is seen exactly once",
                None,
            )
        )
    if "rng" not in keys:
        out.append(
            _advice(
                "state_rng",
                "RNG state is not checkpointed: dropout and sampling after a restart differ from an "
                "uninterrupted run; register it",
                None,
            )
        )
    return out

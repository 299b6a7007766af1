"""The report as a readable table (internal to :mod:`goodput.ledger.report`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from goodput.ledger.accounting import CATEGORIES, Accounting
from goodput.ledger.stragglers import straggler_lines
from goodput.units import format_duration as fd

if TYPE_CHECKING:
    from goodput.ledger.report import Advice, Prediction, Report


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def _dur(x: float | None) -> str:
    return "n/a" if x is None else fd(x)


def _gain(a: Advice) -> str:
    if a.gain_points is None:
        return "(correctness)"
    prefix = "up to " if a.upper_bound else ""
    return f"({prefix}{a.gain_points:+.1f} points)"


def render(report: Report) -> str:
    """Categories in seconds and % of job time, goodput measured vs predicted, C, W, R, D, MTBF, advice."""
    acc = report.accounting
    wall, job = acc.wall_seconds, acc.job_seconds
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(acc.start))
    launches = f" in {acc.launches} launches" if acc.launches > 1 else ""
    lines = [
        f"goodput report: {report.run_dir or '(events)'}",
        f"  {len(acc.attempts)} attempt(s){launches} from {started}, wall time {fd(wall)} ({wall:.1f} s)",
        "",
        f"  {'category':<20}{'seconds':>12}{'% job':>9}",
    ]
    for name in CATEGORIES[:-1]:  # the job's own categories; between_launches is outside the job
        seconds = acc.categories[name]
        lines.append(f"  {name:<20}{seconds:>12.2f}{_pct(seconds / job if job > 0 else 0.0):>9}")
    lines.append(f"  {'job time':<20}{job:>12.2f}{_pct(1.0 if job > 0 else 0.0):>9}")
    between = acc.categories["between_launches"]
    if between > 0:
        lines.append(f"  {'between_launches':<20}{between:>12.2f}   (not the job's: goodput leaves it out)")
        lines.append(f"  {'wall time':<20}{sum(acc.categories.values()):>12.2f}")
    lines += ["", *_figures(report), "", *_steps(report)]
    lines += straggler_lines(acc)
    if report.advice:
        lines += ["", "advice:"]
        lines += [f"  - {a.text} {_gain(a)}" for a in report.advice]
    else:
        lines += ["", "advice: none; nothing stands out"]
    return "\n".join(lines)


def _figures(report: Report) -> list[str]:
    acc, pred = report.accounting, report.prediction
    n_saves = sum(1 for s in acc.saves if s.stall_seconds is not None)
    n_durable = sum(1 for s in acc.saves if s.durable is not None)
    mtbf = {"observed": _dur(pred.mtbf_seconds), "assumed": f"{_dur(pred.mtbf_seconds)} (assumed)"}.get(
        pred.mtbf_source, "n/a (no failure observed; pass --mtbf to assume one)"
    )
    model = "shrink and regrow model" if pred.shrink is not None else "planner"
    planner = (
        "n/a (no checkpoint interval measured)"
        if pred.planner_goodput is None
        else f"{_pct(pred.predicted_goodput)}  = {model} {_pct(pred.planner_goodput)} x "
        f"{_pct(pred.modelled_share)} past the first init - {_pct(pred.unmodelled_share)} unmodelled"
    )
    shrinks = sum(1 for r in acc.reshapes if r.kind == "shrink")
    optimum = pred.optimal_interval_seconds
    interval = (
        f"current {_dur(pred.interval_seconds)}, optimal {_dur(optimum) if optimum else _no_optimum(report)}"
    )
    if optimum is not None and pred.planner_goodput_optimal is not None:
        interval += f" (planner goodput there {_pct(pred.planner_goodput_optimal)})"
    return [
        f"  {'goodput (measured)':<28}{_pct(acc.goodput)}",
        f"  {'goodput (predicted)':<28}{planner}",
        f"  {'capacity goodput (measured)':<28}{_pct(acc.capacity_goodput)}  = productive rank-seconds / "
        f"reserved rank-seconds ({acc.capacity.reserved_world if acc.capacity else 1} ranks reserved)",
        f"  {'capacity goodput (pred.)':<28}{_pct(pred.predicted_capacity_goodput)}",
        f"  {'restarts / failures':<28}{acc.restarts} / {acc.failures}"
        + (f", {shrinks} answered by shrinking in place" if shrinks else "")
        + (f" (and {acc.preemptions} preemption(s), not failures)" if acc.preemptions else ""),
        f"  {'MTBF':<28}{mtbf}",
        f"  {'C checkpoint stall':<28}{_dur(acc.ckpt_stall_seconds)} mean of {n_saves} save(s)"
        + (
            f", of which {_dur(acc.ckpt_wait_seconds)} waiting for the save in flight"
            if acc.ckpt_wait_seconds
            else ""
        ),
        f"  {'W persist (async overlap)':<28}{_dur(acc.persist_seconds)} mean of {n_durable} durable, "
        f"{fd(acc.overlap_seconds)} in all",
        f"  {'R restart':<28}{_restart_line(report)}",
        f"  {'D failure detection':<28}{_dur(acc.detect_seconds)}",
        f"  {'checkpoint interval':<28}{interval}",
        *_covered_line(pred),
        *[
            f"  {'restores from ' + tier:<28}{int(t['count'])}, {_dur(t['seconds_mean'])} each, "
            f"{t['lost_steps_mean']:.1f} steps lost per failure"
            for tier, t in report.restores_by_tier.items()
        ],
    ]


def _covered_line(pred: Prediction) -> list[str]:
    """Which failures the prediction charges half the durable interval: only those no memory tier or
    survivor recovered (none for a run without either)."""
    if pred.durable_share_source == "none":
        return []
    how = "as restored" if pred.durable_share_source == "observed" else "assumed: no restore seen"
    return [
        f"  {'durable-tier failures':<28}{_pct(pred.durable_share)} ({how}); each other failure loses "
        f"{_dur(pred.covered_loss_seconds)} of work"
    ]


def _restart_line(report: Report) -> str:
    """R as the planner used it, and where it comes from."""
    acc, restart = report.accounting, report.prediction.restart_seconds
    if restart is None:
        return "n/a (no restart, and no failure the checkpoint model plans for)"
    if acc.restart_parts:
        parts = acc.restart_parts
        return (
            f"{fd(restart)} = downtime {fd(parts['restart_downtime'])} + init {fd(parts['init'])} + restore "
            f"{fd(parts['checkpoint_restore'])}, mean of {_starts(acc)}"
        )
    if not report.prediction.restart_estimated:
        return f"{fd(restart)} (no restart: a rollback in place, its restart_downtime + rollback, mean)"
    return f"{fd(restart)} (est.: no restart seen; the first attempt's init + checkpoint_restore)"


def _no_optimum(report: Report) -> str:
    """Why the report has no optimal interval: no failure the durable checkpoint interval plans for."""
    if report.prediction.durable_share <= 0.0:
        return "n/a (every failure was recovered from memory or a survivor: none needed the durable tier)"
    if report.accounting.failures:
        return "n/a (every failure shrank in place: none was recovered from a checkpoint)"
    return "n/a (no failure observed: pass --mtbf to assume one)"


def _steps(report: Report) -> list[str]:
    acc = report.accounting
    stats = acc.step_stats
    if stats is None:
        return ["  steps: none completed"]
    lines = [
        f"  steps: {stats.count} completed; step time mean {fd(stats.mean)}, median {fd(stats.median)}, "
        f"p90 {fd(stats.p90)}, max {fd(stats.max)}; fetch mean {fd(stats.mean_fetch)}"
    ]
    changes = acc.info.get("interval_changes", [])
    if changes:
        last = changes[-1]
        lines.append(
            f"  interval changes: {len(changes)}; last to {_dur(last.get('interval_seconds'))}"
            f" ({last.get('reason', 'no reason given')})"
        )
    lines += _warm_lines(acc.info, acc.restarts, frozenset(r.generation for r in acc.reshapes))
    lines += _reshape_lines(acc)
    lines += _numeric_lines(acc.info)
    restores = acc.info.get("restore_parts", [])
    if restores:  # the last restore, split into its parts
        last = restores[-1]
        parts = ", ".join(
            f"{name} {fd(float(last[f'{name}_seconds']))}"
            for name in ("find", "verify", "read", "load", "position")
            if isinstance(last.get(f"{name}_seconds"), int | float)
        )
        lines.append(f"  restore of step {last.get('step')}: {parts}")
    custom = acc.info.get("custom", {})
    if custom:
        tallies = ", ".join(f"{k} x{v['count']} ({fd(v['seconds'])})" for k, v in sorted(custom.items()))
        lines.append(f"  custom events (time inside 'other' or the steps): {tallies}")
    if acc.at_risk_seconds > 0:
        lines.append(f"  at risk: {fd(acc.at_risk_seconds)} of steps not yet in a durable checkpoint")
    return lines


def _numeric_lines(info: dict[str, Any]) -> list[str]:
    """The numeric guard's ladder: each fault found, each rollback (tier, from, to, seconds), each skip and the
    samples it skipped, and a stop."""
    lines = []
    for e in info.get("numeric", []):
        name = e["event"]
        if name == "numeric_fault":
            who = "" if e.get("on_rank") is None else f" on rank {e['on_rank']}"
            value = e.get("value")
            shown = (
                f": {value:.4g}" if isinstance(value, int | float) else "" if value is None else f": {value}"
            )
            lines.append(
                f"  numeric fault: {e['kind']} ({e.get('detail', '')}) at step {e['step']}{who}{shown}"
            )
        elif name == "rollback_nonfinite":
            lines.append(
                f"    passed over the checkpoint of step {e['step']}: non-finite parameters on {e['ranks']} rank(s)"
            )
        elif name == "rollback":
            lines.append(
                f"    rolled back from step {e['from_step']} to {e['to_step']} ({e['tier']}, {fd(float(e['seconds']))})"
            )
        elif name == "skip":
            shown = e.get("indices")
            samples = f"samples {shown[:16]}{' ...' if len(shown) > 16 else ''}" if shown else ""
            lines.append(
                f"    skipped steps {e['first_step']}-{e['last_step']}: {e['samples']} samples, positions "
                f"{e['first_position']}-{e['end_position']} of epoch {e['epoch']} {samples}".rstrip()
            )
        elif name == "sdc_named":
            lines.append(f"    rank {e['named_rank']} named corrupt at step {e['step']} ({e['times']} times)")
        elif name == "numeric_stop":
            lines.append(f"    stopped: {e['reason']}")
        elif name == "spike_missed":
            lines.append(f"  spike injected at step {e['step']} not caught: {e['why']}")
    rule = info.get("spike_rule")
    if rule and rule.get("rise") is not None:
        lines.append(
            f"  spike rule: catches a rise of {float(rule['rise']):.1f}x over the loss's level (at step {rule['step']})"
        )
    return lines


_LISTED = 12  # shrinks and grows listed one per line; the rest are counted


def _reshape_lines(acc: Any) -> list[str]:
    """The time short of the reserved ranks, and each shrink and grow with its cost."""
    figures = acc.capacity
    if figures is None or (not acc.reshapes and figures.reduced_seconds <= 0):
        return []
    share = figures.reduced_seconds / acc.job_seconds if acc.job_seconds > 0 else 0.0
    lines = [
        f"  world size: {figures.reserved_world} ranks reserved; below that for {fd(figures.reduced_seconds)} "
        f"({_pct(share)} of job time)"
    ]
    if not acc.reshapes:
        return lines
    means = [
        f"shrink {_dur(figures.shrink_seconds)}",
        f"grow {_dur(figures.grow_seconds)}",
        f"replacement ready {_dur(figures.regrow_seconds)} after a failure was noticed",
    ]
    lines.append(f"  shrinks and grows in place (mean): {', '.join(means)}")
    for r in acc.reshapes[:_LISTED]:
        if r.kind == "shrink":
            what = f"ranks {list(r.failed_ranks)} lost" + (
                f", batch kept by {r.batch_rule}" if r.batch_rule else ""
            )
        else:
            what = f"{r.joined} joined"
        lines.append(
            f"    {r.kind} {r.world_before}->{r.world_after} at {fd(r.at)}, step {r.step}: {fd(r.seconds)} ({what})"
        )
    if len(acc.reshapes) > _LISTED:
        lines.append(f"    ... and {len(acc.reshapes) - _LISTED} more")
    return lines


def _warm_lines(
    info: dict[str, Any], restarts: int, resized: frozenset[int | None] = frozenset()
) -> list[str]:
    """Warm against cold restarts, and the mean parts of the warm ones (from ``warm_restart`` events; those of
    a generation that shrank or grew in place are no restart)."""
    warm = [
        e
        for e in info.get("warm_restart", [])
        if e.get("generation") not in resized or e.get("generation") is None
    ]
    if not warm:
        return []
    firsts = [float(e["seconds"]) for e in info.get("warm_first_step", [])]
    parts = [
        (label, [float(e[key]) for e in warm if isinstance(e.get(key), int | float)])
        for label, key in (
            ("detection", "detection_seconds"),
            ("hand-over", "handover_seconds"),
            ("re-form", "reform_seconds"),
            ("restore", "restore_seconds"),
        )
    ]
    parts.append(("first step", firsts))
    shown = ", ".join(f"{label} {fd(sum(v) / len(v))}" for label, v in parts if v)
    # every rank of a generation records its own warm_restart: count generations, not events
    count = len({e.get("generation", i) for i, e in enumerate(warm)})
    return [f"  restarts: {count} warm, {max(0, restarts - count)} cold; warm parts (mean): {shown}"]


def _starts(acc: Accounting) -> str:
    """What R is the mean of: the restarts, and the relaunches that followed a failed launch."""
    relaunches = acc.restart_samples - acc.restarts
    return f"{acc.restarts} restart(s)" + (
        f" and {relaunches} relaunch(es) after a failure" if relaunches > 0 else ""
    )

"""The table ``goodput bench peers`` prints: one line per run, then the ratios against their goals."""

from __future__ import annotations

from typing import Any

__all__ = ["print_table"]


def print_table(result: dict[str, Any]) -> None:
    """``held-out``: the final model's loss on the held-out slice (``bench/_peers_heldout.py``)."""
    goals = result["goals"]
    print(f"{result['steps']} steps, 2 ranks; baseline checkpoints every {result['baseline_every']} steps")
    for contender, reason in result.get("skipped", {}).items():
        print(f"{contender}: skipped: {reason}")
    w = max([len("schedule"), *(len(_name(r)) for r in result["rows"])])
    print(
        f"{'schedule':>{w}} {'contender':>9} {'wall s':>8} {'/free':>6} {'/base':>6} {'goodput':>8} "
        f"{'kills':>5} {'lost/f':>6} {'twice':>5} {'never':>5} {'redone':>6} {'held-out':>8}"
    )
    for r in result["rows"]:
        if "note" in r or "error" in r or "samples_twice" not in r:
            print(f"{_name(r):>{w}} {r['contender']:>9}  {r.get('note') or r.get('error', 'no reference')}")
            continue
        gp = "-" if r["goodput"] is None else f"{100 * r['goodput']:.1f}%"
        lost = "-" if r.get("lost_per_failure") is None else f"{r['lost_per_failure']:.2f}"
        heldout = "-" if r.get("heldout_loss") is None else f"{r['heldout_loss']:.4f}"
        print(
            f"{_name(r):>{w}} {r['contender']:>9} {r['wall_seconds']:8.1f} {r['over_fault_free'] or 0:6.2f} "
            f"{r['over_baseline'] or 0:6.2f} {gp:>8} {len(r['kills']):5d} {lost:>6} {r['samples_twice']:5d} "
            f"{r['samples_never']:5d} {r['steps_redone']:6d} {heldout:>8}"
        )
    for key, value in result["ratios"].items():
        print(f"  {key} = {value} (goal {goals.get(key, 'none: what its users get')})")
    for name, why in result.get("unmet_schedules", {}).items():
        print(f"schedule {name} met no failure: {why}")


def _name(row: dict[str, Any]) -> str:
    """The schedule's name, with the round after the first (``none#2``) or the seed of several (``40s seed 2``,
    as the result's ``schedules`` and ``unmet_schedules`` name it)."""
    if "seed" in row:
        return f"{row['schedule']} seed {row['seed']}"
    return f"{row['schedule']}#{row['round'] + 1}" if row.get("round") else str(row["schedule"])

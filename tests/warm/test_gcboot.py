"""``python -m goodput.warm.boot SCRIPT``: the script runs as ``python SCRIPT`` would, with the collector held
back until ``release`` (what Run calls once its set-up is done)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from goodput.warm.boot import HELD_THRESHOLDS

_SCRIPT = """
import gc, json, sys
import sibling  # next to the script: found as under `python script.py`
held = gc.get_threshold()
from goodput.warm.boot import release
release()
print(json.dumps({"name": __name__, "argv": sys.argv, "sibling": sibling.VALUE, "held": held,
                  "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_script_runs_as_main_with_the_collector_held_until_release(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "sibling.py").write_text("VALUE = 7\n")
    script = folder / "train.py"
    script.write_text(_SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "goodput.warm.boot", str(script), "--lr", "3"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the script's folder: the sibling must come from the script's own
    )
    seen = json.loads(out.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(script), "--lr", "3"]
    assert seen["sibling"] == 7
    assert tuple(seen["held"]) == HELD_THRESHOLDS
    assert tuple(seen["after"]) == gc.get_threshold()  # this interpreter's defaults, put back
    assert seen["frozen"] > 1_000  # the objects made so far, out of later full collections


def test_release_without_hold_changes_nothing() -> None:
    code = (
        "import gc; before = gc.get_threshold(); from goodput.warm.boot import release; release(); "
        "print(gc.get_threshold() == before, gc.get_freeze_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "0"]

"""docs/environment.md lists exactly the variables of ``goodput._env``, with the same meaning, default and
setter, and the code names no ``GOODPUT_*`` variable outside that table.

Run ``python tests/test_env.py`` to print the page's table after changing ``goodput._env``.
"""

from __future__ import annotations

import os
import re

from goodput._env import VARIABLES

ROOT = os.path.join(os.path.dirname(__file__), "..")
PAGE = os.path.join(ROOT, "docs", "environment.md")


def table() -> str:
    """The page's table, as ``goodput._env`` declares it."""
    rows = ["| Variable | Meaning | Default | Set by |", "|---|---|---|---|"]
    for var in VARIABLES:
        default = f"`{var.default}`" if var.default else "(unset)"
        rows.append(f"| `{var.name}` | {var.meaning} | {default} | {var.set_by} |")
    return "\n".join(rows) + "\n"


def test_the_page_lists_the_table() -> None:
    with open(PAGE) as f:
        page = f.read()
    assert table() in page, "docs/environment.md is stale: paste the table python tests/test_env.py prints"


def test_the_code_names_only_the_table_s_variables() -> None:
    declared = {var.name for var in VARIABLES}
    named: set[str] = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "src", "goodput")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    named |= set(re.findall(r"GOODPUT_[A-Z0-9_]*[A-Z0-9]", f.read()))
    # A command line's argument name in a docstring, and the prefix of a family (GOODPUT_WARM_*): not variables.
    placeholders = {"GOODPUT_SHARD_FOLDER", "GOODPUT_WARM"}
    assert named - placeholders <= declared, sorted(named - placeholders - declared)


if __name__ == "__main__":
    print(table(), end="")

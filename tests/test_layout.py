"""The parts keep their seams: read every module's imports and check the layout's rules (see DESIGN.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import goodput

_SRC = Path(goodput.__file__).parent
_PARTS = sorted(p.name for p in _SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()) + sorted(
    p.stem for p in _SRC.glob("*.py")
)


def _imports() -> dict[str, set[str]]:
    """Module name -> every goodput module it imports (top level or inside functions; TYPE_CHECKING too)."""
    found: dict[str, set[str]] = {}
    for path in _SRC.rglob("*.py"):
        rel = path.relative_to(_SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                if node.module == "goodput":
                    targets.update(f"goodput.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        found[name] = {t for t in targets if t == "goodput" or t.startswith("goodput.")}
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(src_parts: set[str], forbidden: set[str]) -> list[str]:
    bad = []
    for module, targets in _imports().items():
        if _part(module) not in src_parts:
            continue
        bad += [f"{module} imports {t}" for t in targets if _part(t) in forbidden]
    return sorted(bad)


def test_the_walk_sees_the_parts() -> None:
    """Guards the test itself: the import walk finds the modules and their imports."""
    found = _imports()
    assert "goodput.run.run" in found and "goodput.checkpoint.manager" in found
    assert "goodput.checkpoint" in found["goodput.run.run"]


def test_planning_is_pure() -> None:
    for module, targets in _imports().items():
        if _part(module) != "planning":
            continue
        outside = {t for t in targets if _part(t) not in {"planning", "units", "errors"}}
        assert not outside, f"{module} imports {sorted(outside)}"
        text = (_SRC / Path(*module.split(".")[1:])).with_suffix(".py")
        if not text.exists():
            text = _SRC / Path(*module.split(".")[1:]) / "__init__.py"
        tree = ast.parse(text.read_text())
        io_mods = {"os", "io", "pathlib", "time", "socket", "subprocess", "torch", "fsspec", "shutil"}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            assert not set(names) & io_mods, f"{module} imports {names}"


def test_checkpoint_and_data_stay_apart_and_below() -> None:
    above = {"run", "ledger", "cli", "demo", "bench", "testing"}
    assert _violations({"checkpoint"}, above | {"data"}) == []
    assert _violations({"data"}, above | {"checkpoint"}) == []


def test_ledger_learns_through_events() -> None:
    assert _violations({"ledger"}, {"run", "cli", "checkpoint"}) == []


def test_only_bench_and_drill_use_testing() -> None:
    """The S3 server and the fault proxy serve benchmarks and the drill's storage scenarios, nothing else."""
    users = {_part(m) for m, targets in _imports().items() if any(_part(t) == "testing" for t in targets)}
    assert users <= {"bench", "drill", "testing"}, users


def test_launch_never_imports_torch() -> None:
    """The launcher starts in a second and stays small: no module of goodput.launch imports torch, directly or
    through what it imports (checked in a fresh interpreter)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import goodput.launch as part\n"
        "for m in pkgutil.iter_modules(part.__path__, 'goodput.launch.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_command_line_up_to_a_launch_never_imports_torch(tmp_path: Path) -> None:
    """Every ``goodput`` command first builds the whole parser (each command registers its options, the data
    formats among them), and ``goodput launch`` checks its arguments before torchrun starts: none of it may
    import torch, which costs each of the many CLI processes a test or a job starts seconds."""
    code = (
        "import sys\n"
        "from goodput.cli import main\n"
        f"status = main(['launch', '--nproc', '2', '--run-dir', {str(tmp_path / 'run')!r}, '--', 'missing.py'])\n"
        "print('exit', status, 'torch imported:', 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "exit 2 torch imported: False", done.stdout + done.stderr


# The parts of a job: the launcher (launch/), the warm agent and the worker's side of a hand-over (warm/), the
# worker (run/), what the last two save (checkpoint/), and the contract between them all (job/).
_JOB_PARTS = ("launch", "warm", "run", "checkpoint", "job")


def test_the_contract_imports_neither_side() -> None:
    """goodput.job holds what the launcher and the workers agree on; it reads only the environment table, the
    errors and the lifetime helper, so either side imports it without the other."""
    leaves = {"job", "_env", "errors", "_lifetime"}
    bad = [
        f"{m} imports {t}"
        for m, ts in _imports().items()
        if _part(m) == "job"
        for t in ts
        if _part(t) not in leaves
    ]
    assert bad == []


def test_the_launcher_and_the_worker_meet_in_the_contract() -> None:
    """One direction: the worker (run/) may import the warm hand-over (warm/), and the warm agent may import the
    launcher (launch/); the launcher imports neither, and the worker never imports the launcher."""
    assert _violations({"run"}, {"launch"}) == []
    assert _violations({"launch"}, {"run", "warm"}) == []
    assert _violations({"warm"}, {"run"}) == []


def test_the_contract_never_imports_torch() -> None:
    """Every module of goodput.job imports without torch (checked in a fresh interpreter): the launcher reads
    the same files and codes as the workers, and must start in a second."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import goodput.job as part\n"
        "names = [m.name for m in pkgutil.iter_modules(part.__path__, 'goodput.job.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names), sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, torch_modules = out.strip().split(" ", 1)
    assert int(count) >= 4 and torch_modules == "[]", out


def _cycle(edges: set[tuple[str, str]]) -> list[str]:
    """One cycle of the directed graph ``edges`` (its nodes in order, the first repeated at the end), or []."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return []


def test_the_cycle_finder_finds_cycles() -> None:
    """Guards the test below: a circle of three is found, a chain is not."""
    assert _cycle({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == ["a", "b", "c", "a"]
    assert _cycle({("a", "b"), ("b", "c"), ("a", "c")}) == []


def test_no_import_cycle_among_the_parts_of_a_job() -> None:
    """No circle of imports among launch/, warm/, run/, checkpoint/ and job/. Every import counts, inside
    functions and under TYPE_CHECKING too: a lazy import avoids a circle at import time, not in the design."""
    edges = {
        (_part(m), _part(t))
        for m, ts in _imports().items()
        for t in ts
        if _part(m) in _JOB_PARTS and _part(t) in _JOB_PARTS and _part(m) != _part(t)
    }
    assert ("run", "checkpoint") in edges and ("warm", "checkpoint") in edges  # the walk sees imports
    assert _cycle(edges) == []


def test_warm_reaches_checkpoint_only_through_training_state() -> None:
    """The warm hand-over speaks TrainingState's live form, sent through the one transfer of a state between
    processes; its one other need is the RNG module."""
    allowed = {"goodput.checkpoint.state", "goodput.checkpoint.rng", "goodput.checkpoint.transfer"}
    bad = [
        f"{module} imports {t}"
        for module, targets in _imports().items()
        if _part(module) == "warm"
        for t in targets
        if _part(t) == "checkpoint" and t not in allowed
    ]
    assert bad == []


def test_verify_is_not_imported_by_the_library() -> None:
    """Verify-resume reads and compares runs; only its command, the drill (which compares the same way) and the
    tooling import it. What Run records lives in goodput.run.records."""
    tools = {"verify", "drill", "cli", "bench", "demo", "testing"}
    assert _violations(set(_PARTS) - tools, {"verify"}) == []


def test_the_drill_is_not_imported_by_the_library() -> None:
    """The drill runs jobs and judges them from outside; only its command imports it."""
    assert _violations(set(_PARTS) - {"drill", "cli"}, {"drill"}) == []


def test_no_file_over_450_lines() -> None:
    too_long = []
    for path in sorted(_SRC.rglob("*.py")):
        rel = path.relative_to(_SRC).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > 450:  # split it instead
            too_long.append(f"{rel}: {lines} lines")
    assert too_long == []


# Reads of another goodput object's private attribute from a module that does not define it: each one here is
# a known friendship, with its reason. Add to it only with a reason; better, give the owner a public method.
_PRIVATE_READS_ALLOWED = {
    # the prefetch thread is the cache's own background half, kept in its own file for size: it runs under
    # the cache's lock and pins the cache's window
    ("goodput.data._prefetch", "_cache._index"),
    ("goodput.data._prefetch", "_cache._unpin_window"),
    ("goodput.data._prefetch", "_cache._ensure"),
    ("goodput.data._prefetch", "_cache._local"),
    ("goodput.data._prefetch", "_cache._pin_window"),
    ("goodput.data._prefetch", "_cache._remote_info"),
    ("goodput.data._prefetch", "_cache._is_ready"),
    # the cache benchmark reports this process's own counters, which the public cache_metrics() (node-wide,
    # every process of the folder) does not give
    ("goodput.bench._cache_run", "ds._source"),
}


def _private_names(tree: ast.AST) -> set[str]:
    """The private attribute names a module defines: class members and ``self._x = ...`` assignments."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _imported_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing (``os``, ``dist``): their private members are a library's affair."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _private_reads() -> list[tuple[str, str]]:
    """(module, ``x._name``) for each read of a private attribute that another goodput module defines, on an
    object that is not the module's own (``self``, ``cls``, ``super()``)."""
    trees = {}
    for path in _SRC.rglob("*.py"):
        rel = path.relative_to(_SRC.parent).with_suffix("")
        trees[".".join(rel.parts).removesuffix(".__init__")] = ast.parse(path.read_text())
    defined = {module: _private_names(tree) for module, tree in trees.items()}
    everywhere = set().union(*defined.values())
    found = []
    for module, tree in trees.items():
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if (
                not isinstance(node, ast.Attribute)
                or not node.attr.startswith("_")
                or node.attr.startswith("__")
            ):
                continue
            base: ast.expr = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            if isinstance(base, ast.Name) and base.id in imported:
                continue
            if node.attr in everywhere and node.attr not in defined[module]:
                found.append((module, ast.unparse(node).removeprefix("self.")))
    return sorted(set(found))


def test_the_private_walk_sees_reads() -> None:
    """Guards the test below: the allowed reads are found (so an empty list means none, not a blind walk)."""
    assert set(_private_reads()) >= _PRIVATE_READS_ALLOWED


def test_no_module_reads_another_modules_private_attributes() -> None:
    """A module uses another module's objects through their public members (``self._x`` is the class's own)."""
    assert [read for read in _private_reads() if read not in _PRIVATE_READS_ALLOWED] == []

"""The integrations stay optional: the base install and ``import goodput`` pull in no framework, the core never
imports ``goodput.integrations``, and the callbacks' per-step cost is measured by ``goodput bench ledger``."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from tests.helpers.paths import ROOT
from tests.test_layout import _imports, _part

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate", "prometheus_client")


def test_importing_goodput_and_the_integrations_package_imports_no_framework() -> None:
    code = (
        "import sys, goodput, goodput.integrations\n"
        "from goodput import *\n"
        "goodput.Run, goodput.CheckpointManager, goodput.ResumableLoader, goodput.Ledger\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_base_install_depends_on_no_framework_and_the_extras_name_them() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    for package in ("lightning", "transformers", "accelerate", "prometheus"):
        assert package not in base, package
    extras = project["optional-dependencies"]
    assert any(d.startswith("lightning") for d in extras["lightning"])
    assert {d.split(">")[0] for d in extras["hf"]} == {"transformers", "accelerate"}
    assert any(d.startswith("prometheus-client") for d in extras["prometheus"])
    dev = {d.split(">")[0] for d in extras["dev"]}
    assert {"lightning", "transformers", "accelerate", "prometheus-client"} <= dev  # CI tests them
    pins = {
        line.split("==")[0] for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line
    }
    assert {"lightning", "transformers", "accelerate", "prometheus-client", "torch"} <= pins


def test_nothing_in_the_core_imports_the_integrations() -> None:
    bad = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if _part(module) not in ("integrations", "bench") and module != "goodput"
        for target in targets
        if _part(target) == "integrations"
    ]
    assert bad == []


def test_bench_ledger_measures_both_callbacks() -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from goodput.bench._callbacks import callback_overheads

    results = callback_overheads(300)
    for name in ("lightning", "hf"):
        figures = results[name]
        assert isinstance(figures, dict), figures
        assert figures["hook_seconds"] > 0 and figures["wrapper_seconds"] >= 0
        assert figures["overhead_per_step"] == (figures["hook_seconds"] + figures["wrapper_seconds"]) / 300


DOC_EXAMPLES = {  # docs/integrations.md heading -> the files the suite runs that the example is an excerpt of
    "## Lightning": ("tests/scripts/lightning_train.py",),
    "## Hugging Face Trainer": ("tests/scripts/hf_train.py",),
    # the test makes the exporter, and its helper the Run that takes it
    "## Prometheus": ("tests/integrations/test_integration_prometheus.py", "tests/helpers/exporting.py"),
}


def _code_lines(text: str) -> list[str]:
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in lines if line]


def test_doc_examples_are_excerpts_of_the_tested_files() -> None:
    page = (ROOT / "docs" / "integrations.md").read_text()
    for heading, paths in DOC_EXAMPLES.items():
        section = page.split(heading + "\n", 1)[1]
        example = _code_lines(section.split("```python\n", 1)[1].split("```", 1)[0])
        source = iter([line for path in paths for line in _code_lines((ROOT / path).read_text())])
        missing = [line for line in example if not any(line == s for s in source)]  # in order
        assert missing == [], f"docs/integrations.md {heading}: not in {paths} (in this order): {missing}"

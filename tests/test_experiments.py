"""The one-off experiments in ``experiments/`` keep running against the current package: each imports (every name
it takes from ``pacer`` still exists), each is described in ``experiments/README.md`` with the command to rerun it,
none is left in ``scripts/`` (set-up and product scripts only), and the one that needs no model or collection
(``validation_table.py``) reproduces its table from a shipped checkpoint."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
SCRIPTS = sorted(p.name for p in EXPERIMENTS.glob("*.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"experiment_{name[:-3]}", EXPERIMENTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_experiments():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_experiment_imports_against_the_package(name):
    """Importing runs nothing (each has a ``__main__`` guard) but resolves every import from ``pacer``."""
    module = load(name)
    assert callable(getattr(module, "main", None)) or callable(getattr(module, "table", None))


def test_the_readme_describes_each_experiment_and_how_to_rerun_it():
    readme = (EXPERIMENTS / "README.md").read_text()
    described = set(re.findall(r"\[`([a-z0-9_]+\.py)`\]\(\1\)", readme))
    assert described == set(SCRIPTS), "experiments/README.md must have one row per script, and no row for a missing one"
    for name in SCRIPTS:
        assert f"experiments/{name}" in readme, f"experiments/README.md gives no command to rerun {name}"


def test_scripts_holds_no_experiment():
    assert not {p.name for p in (REPO / "scripts").iterdir()} & set(SCRIPTS)


def test_validation_table_reproduces_the_shipped_checkpoints_report():
    ckpt = REPO / "src/pacer/checkpoints/pacer-default"
    out = subprocess.run([sys.executable, str(EXPERIMENTS / "validation_table.py"), str(ckpt)], check=True,
                         capture_output=True, text=True).stdout
    compare = json.loads((ckpt / "config.json").read_text())["validation"]["compare"]["measured"]
    header = next(line for line in out.splitlines() if line.startswith("| profile / group |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    row = next(line for line in out.splitlines() if line.startswith("| measured |"))
    cells = dict(zip(cols, (c.strip() for c in row.strip("|").split("|")), strict=True))
    for method in ("layer", "cumprob", "fixed", "oracle"):
        assert cells[method] == f"{compare[method]['predicted_speedup']:.3f}", method
    assert cells["layer / cumprob"] == f"{compare['vs_cumprob']:.3f}"

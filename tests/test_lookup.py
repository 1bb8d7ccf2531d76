"""``lookup`` (prompt lookup, no draft model): exact under greedy decoding and in distribution under sampling,
accepted where the text repeats, loaded and run without any draft model."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import FLAT
from pacer import Decoder, SamplingConfig
from pacer.backends.transformers import TransformersModel
from pacer.decoding import Output, speculative_generate
from pacer.decoding.stats import GenerationStats
from pacer.drafters.lookup import LookupDrafter
from pacer.policies import LookupPolicy
from pacer.tiny import save_tiny_pair, tiny_pair
from test_backend import FakeBackend, V
from test_sampling import (
    SMALL_VOCAB,
    _small_target,
    chi2_pvalue,
    exact_drafted_joint,
    exact_joint,
    sample_first_tokens,
)


class Periodic(FakeBackend):
    """A target whose next token depends on the last two tokens only: its output soon repeats itself."""

    def _row(self, seen):
        g = torch.Generator().manual_seed(hash((1, tuple(seen[-2:]))) % (1 << 31))
        return torch.randn(V, generator=g) * 3


def test_lookup_is_exact_and_accepted_where_the_text_repeats():
    prompt = [1, 2, 3, 4, 5]
    plain = Output(120, set())
    from pacer.decoding import autoregressive_generate

    autoregressive_generate(Periodic(salt=1), prompt, plain, SamplingConfig(), GenerationStats())
    for gamma in (1, 4, 8):
        stats = GenerationStats()
        out = speculative_generate(Periodic(salt=1), LookupDrafter(V), LookupPolicy(gamma=gamma), prompt,
                                   Output(120, set()), SamplingConfig(), stats)
        assert out == plain.ids
        assert stats.accepted_tokens > 40 and stats.target_calls < 80  # the repeats came from the lookup
        assert stats.draft_forwards == 0  # no draft model


def test_lookup_runs_without_a_draft_model(tmp_path, capsys):
    t, _ = tiny_pair("close")
    dec = Decoder(t, None, threads=1, costs=FLAT)
    for prompt in ("hello world, this is", "abc abc abc abc abc abc", "def f(x):\n    return f(x)"):
        ar = dec.generate(prompt, "ar", max_new_tokens=30)
        for cost_aware in (None, False):
            res = dec.generate(prompt, "lookup", max_new_tokens=30, cost_aware=cost_aware)
            assert res.token_ids == ar.token_ids
    assert dec.generate("abc abc abc abc abc abc", "lookup", max_new_tokens=10, gamma=4).stats.draft_tokens > 0
    from pacer.cli import main

    target, _ = save_tiny_pair(tmp_path)
    rc = main(["generate", "abc abc abc abc", "--method", "lookup", "--json", "--max-new-tokens", "8", "--target",
               str(target), "--draft", "/nowhere/no-draft-is-loaded", "--dtype", "float32", "--threads", "1"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["stats"]["method"] == "lookup"


@pytest.mark.parametrize("verify", ["token", "block"])
def test_lookup_sampling_matches_the_target_distribution(verify):
    """A deterministic proposal (``q`` one-hot at the looked-up token) under rejection sampling, token by token or
    block verification: the joint distributions of the first two tokens and of the two the first drafting round
    gives are the target's exactly (chi-square over 2500 seeds)."""
    target = _small_target()
    dec = Decoder(TransformersModel(target, None, "t", "t", torch.float32), None, threads=1)
    dec.eos.clear()
    # every id once, in order, then 0..3: whatever the prefill's token a, the lookup proposes a+1 a+2 after it
    prompt = list(range(SMALL_VOCAB)) + [0, 1, 2, 3]
    cfg = SamplingConfig(temperature=1.0, verify=verify)
    counts, drafted_counts, drafted, accepted = sample_first_tokens(dec, prompt, "lookup", cfg, 2500)
    assert drafted >= 2 * 2500 and accepted > 0  # the first drafting round always drafts two looked-up tokens
    assert chi2_pvalue(counts, exact_joint(target, prompt, cfg)) > 1e-3
    assert chi2_pvalue(drafted_counts, exact_drafted_joint(target, prompt, cfg)) > 1e-3


def test_the_cost_rule_drafts_confident_lookups_where_a_prior_would_not():
    """Verification not free: an extra scored token costs 0.65 of a forward, so a free token pays only when it
    survives with probability >= 0.65 - more than the rule's prior acceptance (0.6). A 3-token match (confidence
    0.75) is drafted from the first round on; 1-token matches (0.35) never are."""
    from pacer.costs import Costs
    from pacer.policies.cost_aware import CostAwarePolicy

    costs = Costs(draft=0.0, target={1: 1.0, 2: 1.65, 4: 2.95, 8: 5.55, 16: 10.75})
    prompt = [1, 2, 3, 4, 5]
    plain = Output(120, set())
    from pacer.decoding import autoregressive_generate

    autoregressive_generate(Periodic(salt=1), prompt, plain, SamplingConfig(), GenerationStats())
    drafted = {}
    for key_len in (1, 3):
        stats = GenerationStats()
        rule = CostAwarePolicy(LookupPolicy(gamma=8, min_draft=0), costs, refine=0.0)
        out = speculative_generate(Periodic(salt=1), LookupDrafter(V, key_len=key_len), rule, prompt,
                                   Output(120, set()), SamplingConfig(), stats)
        assert out == plain.ids
        drafted[key_len] = stats.draft_tokens
    assert drafted[1] == 0 and drafted[3] > 20


def test_one_round_looks_up_again_after_the_text_it_drafted():
    """A continuation shorter than the round's budget is followed by another lookup keyed by the end of the text as
    drafted so far (prompt + the first continuation), not by the same key again."""
    tokens = list(range(10, 40)) + [10, 11, 12]
    d = LookupDrafter(64, ngram=8, key_len=3)
    draft = d.propose(tokens, LookupPolicy(gamma=16), 16, SamplingConfig(), None)
    assert draft.tokens == list(range(13, 29))  # 13..20 found after (10, 11, 12), then 21..28 after (18, 19, 20)

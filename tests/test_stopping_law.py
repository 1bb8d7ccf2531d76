"""The law of the generated sequence under sampling when the draft length depends on the drafted tokens.

A length rule that decides from what it has drafted is lossless only if it never drops a token after seeing it:
the tokens a round verifies must be ``q``'s draws, whichever way the rule then decided. Here every rule whose length
depends on the draft - the draft's confidence and entropy, the cumulative probability of its own tokens, the
cost-aware rule over them - generates the first three tokens
of a tiny pair many times over, under token-level and block verification, and their joint law is compared with the
target's own (exact, from its logits, warped by top-k 3 so that 27 sequences carry all the mass) by Pearson's
chi-square (``tests/test_sampling.py``'s criterion: pass at ``p > 1e-4``, fixed seeds).

The negative control plants the bug such an engine can have: a round that stops drops its last drafted token. For a
rule that reads the drafted token itself (its probability ``q(d_i)``: the cumulative rule) the tokens kept are then
chosen by their own value, and the test sees the skew. A rule that reads only ``q``'s shape (the confidence
``max q`` and the entropy: functions of the tokens before ``d_i``, and the cost rule over them) decides, in effect,
before drawing ``d_i``, so dropping it leaves the law exact: there the planted bug is no bug.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pacer import Decoder, SamplingConfig
from pacer.costs import Costs
from pacer.decoding import drafter as drafting
from pacer.tiny import tiny_pair
from test_sampling import ALPHA, chi2_pvalue, reference_warp

PROMPT = [72, 101, 108, 108, 111, 32]
CFG = SamplingConfig(1.0, top_k=3)
SEEDS = 800
#: a target forward of k tokens costs more with k, a draft token a fifth of one token's: the cost rule then stops
#: after one token or two depending on what it drafted
COSTS = Costs(draft=0.2, target={1: 1.0, 2: 1.25, 3: 1.5, 4: 1.75, 8: 2.75})

#: rules whose draft length depends on the drafted tokens: (method, settings); thresholds near the middle of
#: what the tiny pair's top-3 draft shows, so that the first round stops after one token or two about equally
RULES = {
    "confidence": ("confidence", {"threshold": 0.6}),
    "entropy": ("entropy", {"threshold": 0.8}),
    "cumprob": ("cumprob", {"threshold": 0.5}),
    "cost-cumprob": ("cumprob", {"cost_aware": True}),
    "cost-confidence": ("confidence", {"cost_aware": True}),
}
#: the rules that read the drafted token's own probability, where dropping it after seeing it skews the law by more
#: than these sample sizes resolve (the cost rule over the cumulative probability reads it too, through its
#: calibrated survival, and is skewed less: its stops depend on the token far more weakly)
READS_THE_TOKEN = {"cumprob"}


@pytest.fixture(scope="module")
def dec() -> Decoder:
    d = Decoder(*tiny_pair("close"), threads=1, costs=COSTS)
    d.eos.clear()  # always four tokens
    return d


@pytest.fixture(scope="module")
def exact(dec) -> dict[tuple[int, int, int], float]:
    """``p(x1) p(x2 | x1) p(x3 | x1, x2)`` of the warped target over its support, from the target's logits."""
    model = dec.target.model if hasattr(dec.target, "model") else dec.pair.target.model

    @torch.inference_mode()
    def warped(ids: list[int]) -> np.ndarray:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double().numpy()
        return reference_warp(logits, CFG)

    out = {}
    p1 = warped(PROMPT)
    for a in np.flatnonzero(p1):
        p2 = warped(PROMPT + [int(a)])
        for b in np.flatnonzero(p2):
            p3 = warped(PROMPT + [int(a), int(b)])
            for c in np.flatnonzero(p3):
                out[int(a), int(b), int(c)] = p1[a] * p2[b] * p3[c]
    return out


def sample(dec: Decoder, method: str, settings: dict, verify: str, seeds: int = SEEDS) -> tuple[dict, list[int]]:
    """Counts of the first three tokens over ``seeds`` seeded generations, and how many tokens each first drafting
    round drafted."""
    settings = {"max_draft": 2, **settings}
    options = {k: settings.pop(k) for k in list(settings) if k not in ("cost_aware", "gamma", "max_draft")}
    counts: dict = {}
    lengths = []
    for s in range(seeds):
        cfg = dataclasses.replace(CFG, seed=s, verify=verify)
        # the prefill gives the first token; the first drafting round may draft max_draft (its target token too)
        r = dec.generate(PROMPT, method, max_new_tokens=settings["max_draft"] + 2, sampling=cfg, options=options,
                         **settings)
        key = tuple(r.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
        lengths.append(r.stats.draft_lengths[1])
    return counts, lengths


def pvalue(counts: dict, exact: dict) -> float:
    """The smaller p-value of the three tokens' joint and of the first two's (where fewer cells pool)."""
    out = 1.0
    for n in (3, 2):
        c: dict = {}
        e: dict = {}
        for k, v in counts.items():
            c[k[:n]] = c.get(k[:n], 0) + v
        for k, v in exact.items():
            e[k[:n]] = e.get(k[:n], 0.0) + v
        keys = sorted(set(c) | set(e))
        out = min(out, chi2_pvalue(np.array([c.get(k, 0) for k in keys]), np.array([e.get(k, 0.0) for k in keys])))
    return out


def drop_the_last_token_when_the_rule_stops(monkeypatch) -> None:
    """The planted bug: a round the rule ends (not the budget) loses its last drafted
    token."""
    ask, draft = drafting.Proposal.ask, drafting.Proposal.draft

    def planted_ask(self, free=False, confidence=None):
        ok = ask(self, free, confidence)
        self.dropped = not ok and 0 < self.state.n < self.budget
        return ok

    def planted_draft(self):
        if getattr(self, "dropped", False):
            self.state = self.state.prefix(self.state.n - 1)
            self.qs = self.qs[: self.state.n]
        return draft(self)

    monkeypatch.setattr(drafting.Proposal, "ask", planted_ask)
    monkeypatch.setattr(drafting.Proposal, "draft", planted_draft)


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("rule", list(RULES))
def test_a_data_dependent_length_keeps_the_targets_law(dec, exact, rule, verify):
    method, settings = RULES[rule]
    counts, lengths = sample(dec, method, settings, verify)
    assert {1, 2} <= set(lengths), "the rule must stop after one token or two (its length depends on the draft)"
    assert pvalue(counts, exact) > ALPHA


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("rule", sorted(READS_THE_TOKEN))
def test_dropping_the_last_drafted_token_when_the_rule_stops_is_seen(dec, exact, rule, verify, monkeypatch):
    method, settings = RULES[rule]
    drop_the_last_token_when_the_rule_stops(monkeypatch)
    counts, _ = sample(dec, method, settings, verify)
    assert pvalue(counts, exact) <= ALPHA, "the planted bug skews the law: the test above must fail on it"


def test_the_planted_bug_drops_tokens(dec, monkeypatch):
    """The plant really acts: rounds that stop by the rule verify fewer tokens than they drafted."""
    method, settings = RULES["cumprob"]
    _, before = sample(dec, method, settings, "token", seeds=60)
    drop_the_last_token_when_the_rule_stops(monkeypatch)
    _, after = sample(dec, method, settings, "token", seeds=60)
    assert sum(after) < sum(before)

"""The forward ledger and the per-round time breakdown, on the pure-Python fake backend: every forward
of a generation is recorded with its size and context, the parts of the breakdown add up to the wall time, and a
round that drafts nothing does what plain decoding does (no draft call, no tree, no pool work)."""

from __future__ import annotations

import time

import pytest

from pacer.costs import Costs
from pacer.decoding import Output, autoregressive_generate, speculative_generate
from pacer.decoding.meter import (
    DRAFT,
    PARTS,
    TARGET,
    Call,
    MeteredBackend,
    breakdown,
    first_round_end,
    metered,
    recording,
)
from pacer.decoding.stats import GenerationStats
from pacer.drafters import TokenDrafter
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.policies import DraftPolicy, FixedPolicy
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.sampling import SamplingConfig
from test_backend import FakeBackend

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


class Slow(FakeBackend):
    """A fake backend whose forward sleeps a fixed time per call (so that forwards dominate the wall time)."""

    def __init__(self, *a, delay: float = 0.002, **kw):
        super().__init__(*a, **kw)
        self.delay = delay

    def forward(self, ids, **kw):
        time.sleep(self.delay)
        return super().forward(ids, **kw)


class Never(DraftPolicy):
    """Drafts nothing, ever (what the cost rule does where no draft pays)."""

    name = "never"

    def __init__(self):
        super().__init__(0, 8)

    def should_continue(self, state) -> bool:
        return False


def _pair(delay: float = 0.0):
    t = MeteredBackend(Slow(1, delay=delay), TARGET)
    d = MeteredBackend(Slow(2, agree_with=1, agree=0.8, delay=delay), DRAFT)
    return t, d


def test_the_ledger_records_every_forward_with_its_size_and_context_only_while_recording():
    t, d = _pair()
    stats = GenerationStats()
    speculative_generate(t, TokenDrafter(d, t.vocab_size), FixedPolicy(gamma=3), PROMPT, Output(12, set()),
                         SamplingConfig(), stats)
    targets = [c for c in stats.calls if c.role == TARGET]
    drafts = [c for c in stats.calls if c.role == DRAFT]
    assert len(targets) == stats.target_calls and len(drafts) == stats.draft_forwards
    # the target's prefill (the prompt alone) first, then the draft reads the prompt and its token
    assert stats.calls[0] == targets[0] and stats.draft_lengths[0] == 0
    assert targets[0].context == 0 and targets[0].k == len(PROMPT) and targets[0].kind == "target_prefill"
    assert drafts[0].context == 0 and drafts[0].k == len(PROMPT) + 1 and drafts[0].kind == "draft_catch_up"
    # later target forwards score gamma + the unseen tokens after what was cached
    for c, g in zip(targets[1:], stats.draft_lengths[1:], strict=True):
        assert c.k >= g + 1 and c.context >= len(PROMPT) and c.kind == "target_chain"
    t.forward([1, 2])  # outside a recording: nothing is added
    assert len(stats.calls) == len(targets) + len(drafts)
    c = stats.calls[3]
    assert Call.from_list(c.to_list()) == Call(c.role, c.k, c.context, c.tree, round(c.seconds, 6), c.rows)


def test_metered_backend_reads_through_and_is_applied_once():
    inner = FakeBackend(1)
    m = metered(inner, TARGET)
    assert metered(m, TARGET) is m and m.vocab_size == inner.vocab_size and m.identity is inner
    m.forward([1, 2, 3])
    assert m.length == 3 == inner.length
    m.crop(1)
    assert inner.length == 1
    with recording([]) as calls:
        m.forward([4], keep=1)
    assert [(c.k, c.context, c.rows) for c in calls] == [(1, 1, 1)]


@pytest.mark.parametrize("drafter", ["token", "phrase"])
def test_the_breakdown_adds_up_to_the_wall_time(drafter):
    t, d = _pair(delay=0.003)
    dr = TokenDrafter(d, t.vocab_size) if drafter == "token" else \
        PhraseDrafter(d, t.vocab_size, PhraseOptions(warm_start=False))
    stats = GenerationStats()
    speculative_generate(t, dr, FixedPolicy(gamma=4), PROMPT, Output(40, set()), SamplingConfig(), stats)
    parts = stats.breakdown()
    assert list(parts) == list(PARTS)
    assert sum(parts.values()) == pytest.approx(stats.wall_time, rel=1e-9, abs=1e-12)
    assert all(v >= 0 for k, v in parts.items() if k != "rest") and parts["rest"] > -1e-4
    forwards = sum(c.seconds for c in stats.calls)
    assert forwards >= 0.003 * len(stats.calls)  # the sleeps are inside the recorded forwards
    assert parts["rest"] < 0.5 * stats.wall_time  # the overhead is the small part here
    if drafter == "phrase":
        assert stats.time_pool > 0  # lookups and learning are counted as pool work
    d2 = stats.to_dict()
    assert d2["breakdown"]["rest"] == pytest.approx(parts["rest"], abs=1e-6) and len(d2["calls"]) == len(stats.calls)
    assert breakdown(1.0, [Call(TARGET, 3, 5, True, 0.25)], 0.1, 0.05) == {
        **dict.fromkeys(PARTS, 0.0), "target_tree": 0.25, "policy": 0.1, "pool": 0.05, "rest": pytest.approx(0.6)}


def test_time_to_first_token_is_the_first_rounds_forwards():
    """TTFT (``GenerationStats.ttft``, the summary, a server response's ``time_to_first_token_s``): the forwards up to
    and including the first target forward - the target's prefill, for every method: a drafting method's draft
    reads the prompt after the first token is out. The ledger of a record made while the draft read the prompt
    and drafted first counts those draft forwards too."""
    from pacer.serve.metrics import request_metrics

    t, d = _pair(delay=0.002)
    ar = GenerationStats()
    autoregressive_generate(t, PROMPT, Output(12, set()), SamplingConfig(), ar)
    assert ar.ttft == ar.calls[0].seconds and ar.calls[0].role == TARGET
    sd = GenerationStats()
    speculative_generate(t, TokenDrafter(d, t.vocab_size), FixedPolicy(gamma=4), PROMPT, Output(12, set()),
                         SamplingConfig(), sd)
    assert sd.calls[0].role == TARGET and sd.calls[0].k == len(PROMPT) and sd.calls[1].role == DRAFT
    assert sd.ttft == sd.calls[0].seconds < sum(c.seconds for c in sd.calls)
    assert first_round_end(c.role for c in sd.calls) == 1  # the draft's prompt read is not in it
    # an older ledger: the draft's prompt read and 3 more draft tokens, then the prefill that verified them
    old = [Call(DRAFT, len(PROMPT), 0, False, 0.5)] + [Call(DRAFT, 1, len(PROMPT) + i, False, 0.25) for i in range(3)]
    assert first_round_end(c.role for c in [*old, Call(TARGET, len(PROMPT) + 4, 0, False, 1.0), *sd.calls]) == 5
    assert "first token" in sd.summary() and sd.to_dict()["ttft"] == pytest.approx(sd.ttft, abs=1e-6)
    assert request_metrics(sd)["time_to_first_token_s"] == pytest.approx(sd.ttft, abs=1e-4)


@pytest.mark.parametrize("kind", ["token", "phrase", "phrase+candidates"])
def test_a_round_that_drafts_nothing_costs_what_plain_decoding_costs(kind):
    """No draft forward, no tree, no pool work; the target's forwards are exactly plain decoding's."""
    t, d = _pair()
    if kind == "token":
        dr = TokenDrafter(d, t.vocab_size)
    else:
        dr = PhraseDrafter(d, t.vocab_size,
                           PhraseOptions(warm_start=False, candidates=3 if "candidates" in kind else 0))
    stats = GenerationStats()
    ids = speculative_generate(t, dr, Never(), PROMPT, Output(20, set()), SamplingConfig(), stats)
    plain = GenerationStats()
    ref = autoregressive_generate(t, PROMPT, Output(20, set()), SamplingConfig(), plain)
    assert ids == ref
    assert [c.role for c in stats.calls] == [TARGET] * 20 and not any(c.tree for c in stats.calls)
    assert [(c.k, c.context) for c in stats.calls] == [(c.k, c.context) for c in plain.calls]
    assert stats.draft_forwards == 0 and d.length == 0
    if kind != "token":
        assert len(dr.pool) == 0 and stats.time_pool < 1e-3  # the pool was never touched
        assert dr.report()["candidate_rounds"] == 0


def test_nothing_pays_under_a_linear_curve_so_the_cost_rule_runs_plain_rounds_with_no_tree():
    linear = Costs(draft=0.4, target={1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})
    t, d = _pair()
    dr = PhraseDrafter(d, t.vocab_size, PhraseOptions(warm_start=False, candidates=3))
    stats = GenerationStats()
    rule = CostAwarePolicy(FixedPolicy(gamma=4, min_draft=0), linear, refine=0.0)
    speculative_generate(t, dr, rule, PROMPT, Output(16, set()), SamplingConfig(), stats, rule.pricer)
    assert stats.draft_forwards == 0 and not any(c.tree or c.role == DRAFT for c in stats.calls)


def test_phrase_pool_catches_up_with_rounds_that_drafted_nothing():
    """The pool learns nothing in a round that drafts nothing, and everything committed before at the next round
    that drafts (the prompt included, though the first round drafted nothing)."""
    t, d = _pair()

    class Third(FixedPolicy):  # drafts in every third round only
        def __init__(self):
            super().__init__(gamma=2, min_draft=0)
            self.round = 0

        def should_continue(self, state) -> bool:
            return self.round % 3 == 2 and state.n < 2

        def update(self, state, result):
            self.round += 1

    dr = PhraseDrafter(d, t.vocab_size, PhraseOptions(warm_start=False, candidates=0, sources="prompt,output"))
    sizes = []

    class Spy(Third):
        def update(self, state, result):
            sizes.append((result.drafted, len(dr.pool)))
            super().update(state, result)

    speculative_generate(t, dr, Spy(), PROMPT, Output(30, set()), SamplingConfig(), GenerationStats())
    assert sizes[0] == (0, 0) and sizes[1] == (0, 0)  # two plain rounds: the pool untouched
    assert sizes[2][0] > 0 and sizes[2][1] > 0  # the first drafting round learned the prompt and output so far
    ref = PhraseDrafter(FakeBackend(2), t.vocab_size, PhraseOptions(warm_start=False, candidates=0, sources="prompt"))
    ref._sync(PROMPT)
    assert set(ref.pool.entries) <= set(dr.pool.entries)


class Cycle(FakeBackend):
    """A target that continues the cycle 1..5 (whatever it saw last), so that the prompt's n-grams predict it."""

    def _row(self, seen):
        row = super()._row(seen) * 0.1
        row[seen[-1] % 5 + 1] += 10.0
        return row


def _pool_round(costs: Costs):
    t = MeteredBackend(Cycle(1), TARGET)
    d = MeteredBackend(Slow(2, agree_with=1, agree=0.8), DRAFT)
    dr = PhraseDrafter(d, t.vocab_size, PhraseOptions(warm_start=False, candidates=1, sources="prompt,output"))
    stats = GenerationStats()
    pol = CostAwarePolicy(Never(), costs, refine=0.0)
    ids = speculative_generate(t, dr, pol, PROMPT, Output(24, set()), SamplingConfig(), stats, pol.pricer)
    return ids, stats, dr, d


def test_where_the_draft_drafts_nothing_pool_continuations_are_scored_only_where_they_pay():
    """A round whose draft model drafts nothing gets the pool's continuation of the committed text where the cost
    rule prices it as paying (flat curve): no draft forward, the output is plain decoding's, and the target emits it
    in fewer forwards; where a scored token costs a forward (linear curve) the rounds are plain steps and the pool
    is never touched."""
    plain = GenerationStats()
    t = MeteredBackend(Cycle(1), TARGET)
    ref = autoregressive_generate(t, PROMPT, Output(24, set()), SamplingConfig(), plain)
    flat = Costs(draft=0.03, target={1: 0.3, 8: 0.3, 17: 0.33})
    ids, stats, dr, d = _pool_round(flat)
    assert ids == ref
    assert stats.draft_forwards == 0 and d.length == 0
    rep = dr.report()
    assert rep["pool_rounds"] > 0 and rep["pool_accepted_tokens"] > 0
    assert stats.target_calls < plain.target_calls
    linear = Costs(draft=0.03, target={1: 0.3, 2: 0.6, 4: 1.2, 8: 2.4})
    ids, stats, dr, d = _pool_round(linear)
    assert ids == ref and stats.draft_forwards == 0
    assert [(c.k, c.context) for c in stats.calls] == [(c.k, c.context) for c in plain.calls]
    assert len(dr.pool) == 0 and dr.report()["pool_rounds"] == 0

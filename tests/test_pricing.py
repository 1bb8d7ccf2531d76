"""The pricer (:mod:`pacer.pricing`) and the evidence it prices with: each test pins one rule whose planted bug the
other tests let through (a mutation audit), and fails with that bug."""

from __future__ import annotations

import pytest

from pacer import Decoder
from pacer.costs import ContextCosts, Costs
from pacer.drafters.branches import LOOKUP
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.drafters.sources import SourceEvidence
from pacer.errors import PacerError
from pacer.policies import DraftPolicy, DraftState, FixedPolicy, RoundResult
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.pricing import CostMemory, CostPricer
from pacer.tiny import tiny_pair

#: a curve whose scored tokens cost something (so that c_t(g) and c_t(g + 1) differ everywhere)
CURVE = Costs(draft=0.1, target={1: 1.0, 2: 1.3, 4: 1.9, 8: 3.1, 16: 5.5}, draft_prefill=0.01)


def test_a_phrase_right_so_far_is_not_scored_until_the_text_settles_it():
    """A prediction with its known tokens right and one token still unknown is open, not scored (it would count as
    a rejection at the unknown token). Fails where a phrase one token short of known is scored as settled."""
    ev = SourceEvidence(length=4)
    kind = ("lookup", 2)
    ev.predict(kind, 0, (5, 6, 7))
    ev.score([5, 6])  # 2 of 3 known, both right: the third is unknown
    assert ev.scored(kind) == 0
    ev.score([5, 6, 7])  # all known and right
    assert ev.scored(kind) == 1 and ev.gen[kind][:3] == [[1, 1], [1, 1], [1, 1]]
    ev.predict(kind, 0, (5, 6, 8))
    ev.score([5, 6])
    assert ev.scored(kind) == 1  # open again
    ev.score([5, 6, 7])  # the third is wrong: settled, two right of three
    assert ev.scored(kind) == 2 and ev.gen[kind][2] == [1, 2]


def test_the_memory_counts_no_position_after_the_first_rejection():
    """A round that drafted 4 tokens and accepted 1 tells about positions 1 (accepted) and 2 (rejected) only: d_3
    and d_4 were never judged. Fails where acceptance is counted at positions after the first rejection."""
    mem = CostMemory(alpha=0.5, prior=4.0)
    trials = list(mem.trials)
    hits = list(mem.hits)
    mem.update([None] * 4, drafted=4, accepted=1)
    assert [mem.trials[i] - trials[i] for i in range(1, 5)] == [1, 1, 0, 0]
    assert [mem.hits[i] - hits[i] for i in range(1, 5)] == [1, 0, 0, 0]
    pricer = CostPricer(CURVE, CostMemory())
    pricer.learn(FixedPolicy(gamma=4), DraftState(tokens=[1, 2, 3, 4]), RoundResult(drafted=4, accepted=1))
    assert [c[1] for c in pricer.gen_counts[1:5]] == [1, 1, 0, 0]
    assert [c[0] for c in pricer.gen_counts[1:5]] == [1, 0, 0, 0]


def test_a_draft_round_scores_its_drafted_tokens_and_the_pending_one():
    """``draft_rate``: a round that drafted ``g`` tokens costs ``g (c_d + c_p) + c_t(g + 1)`` (the target scores the
    pending token too) for ``1 + Σ_{i<=g} Π α`` expected tokens, the best over ``g``. Fails where ``g`` drafted tokens
    are priced at ``c_t(g)``."""
    memory = CostMemory(alpha=0.7, prior=1e9)  # α_i = 0.7 at every position, whatever is observed
    pricer = CostPricer(CURVE, memory, max_draft=6)
    c = pricer.costs
    best, S, E = 1 / c.target_cost(1), 1.0, 1.0
    for g in range(1, 7):
        S *= pricer.gen_alpha(g)
        E += S
        best = max(best, E / (g * (c.draft + c.policy_per_check) + c.target_cost(g + 1)))
    assert pricer.draft_rate() == pytest.approx(best, rel=1e-12)
    assert pricer.draft_rate() < 1.3 / c.target_cost(1)  # c_t(g) would make a one-token draft look nearly free


class Counting(DraftPolicy):
    """Drafts nothing; counts what the loop told it."""

    def __init__(self) -> None:
        super().__init__(0, 4)
        self.prefill = 0

    def should_continue(self, state: DraftState) -> bool:
        return False

    def prefilled(self, committed: int) -> None:
        self.prefill += committed


def test_the_cost_rule_passes_the_prefills_token_to_the_policy_it_wraps(pairs):
    """The first token comes from the target's prefill; a policy that counts the output (the oracle) must hear of
    it through the cost rule too. Fails where the rule keeps it to itself."""
    inner = Counting()
    rule = CostAwarePolicy(inner, CURVE, refine=0.0)
    rule.prefilled(1)
    assert inner.prefill == 1
    dec = pairs["close"]
    inner = Counting()
    dec.generate("hello world", "sd", max_new_tokens=5,
        policy=(rule := CostAwarePolicy(inner, CURVE, refine=0.0)), pricer=rule.pricer)
    assert inner.prefill == 1
    ref = dec.generate("hello world", "ar", max_new_tokens=12).token_ids
    res = dec.generate("hello world", "oracle", max_new_tokens=12, reference=ref)
    assert res.token_ids == ref  # the oracle under the rule keeps count from the first token on


def _drafter(dec, **opts) -> PhraseDrafter:
    return PhraseDrafter(dec.draft_backend(), dec.vocab, PhraseOptions(warm_start=False, **opts))


@pytest.mark.parametrize("lookup_better", [True, False])
def test_the_generations_own_text_leads_the_branches_only_where_it_earned_it(pairs, lookup_better):
    """After a draft, the generation's own text's continuation is the first branch when its evidence is at least the
    pool's, else the pool's leads. Fails with the comparison turned round (the own text leading where its evidence is
    below the pool's)."""
    from pacer.decoding import Draft

    dec = pairs["close"]
    d = _drafter(dec, candidates=1)
    d.reset()
    text = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    tokens = text + [5, 10]  # with d_1 = 11 it ends like the text's start: the own text goes on with 12, 13, ...
    d.choice.index.sync(tokens)
    d.pool.add((10, 11), (40, 41, 42), "output")  # the pool continues it otherwise
    ev = d.choice.evidence
    good, poor = [[95, 100]] * ev.length, [[5, 100]] * ev.length
    for k in (1, 2, 3):
        ev.total[("lookup", k)] = good if lookup_better else poor
    ev.total[("pool", 2)] = poor if lookup_better else good
    draft = Draft([11], None, DraftState(tokens=[11], prob=[0.9]), branches=[], anchors=[])
    origins = d.branches.after_draft(tokens, draft, CostPricer(CURVE), [])
    assert origins[0] == LOOKUP if lookup_better else origins[0] == ((10, 11), (40, 41, 42))
    assert draft.branches[0][:2] == ([12, 13] if lookup_better else [40, 41])


class Recording(CostPricer):
    """A pricer that records the yields it is asked to price pool rounds with."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.pool_yields: list[float | None] = []

    def branch_room(self, drafted: int, yield_: float | None = None) -> int:
        if drafted == 0:
            self.pool_yields.append(yield_)
        return super().branch_room(drafted, yield_)


def test_a_pool_round_is_priced_with_this_generations_evidence(pairs):
    """Whether a round that drafts nothing verifies the pool's continuation is priced with what the pool earned in
    this generation (:meth:`SourceEvidence.branch_yield`), not the decoder's learnt yield: a pool that paid in earlier
    generations but not in this text is not verified. Fails where the pricer's own learnt yield prices it."""
    from pacer.sampling import SamplingConfig

    dec = pairs["random"]
    flat = Costs(draft=0.1, target={1: 1.0, 2: 1.01, 64: 1.6})  # a scored token 1% of a forward: a draft round pays
    memory = CostMemory()
    memory.pool_update(1000, 900)  # earlier generations: the pool's continuations nearly always accepted
    pricer = Recording(flat, memory)
    d = _drafter(dec, candidates=2, choose=True)
    d.reset()
    ev = d.choice.evidence
    for kind in [("pool", k) for k in (1, 2)] + [("lookup", k) for k in range(4)]:
        ev.gen[kind] = [[0, 50]] * ev.length  # this generation: never (a draft round beats a phrase round)
    ids = dec.encode("abc abc abc abc")
    d.pool.add_sequence(ids, "prompt")
    rule = Counting()  # a literal rule (this round drafts nothing), its extras priced by the pricer beside it
    draft = d.propose(ids, rule, 4, SamplingConfig(), None, remaining=20, pricer=pricer)
    assert not d._phrase_round and not draft.tokens
    assert pricer.pool_yields and pricer.pool_yields[0] == pytest.approx(d.branches.pool_yield(ids))
    assert pricer.pool_yields[0] < 0.05 and not draft.branches
    assert pricer.branch_room(0, None) > 0  # the learnt yield alone would have verified them


# ------------------------------------------------------------------------------------ costs where they are paid
#: flat below a 160-token context (drafting pays), steep from there on (a scored token costs most of a forward: it
#: does not)
STEEP_FROM = 160


def steepening(context: int) -> Costs:
    if context < STEEP_FROM:
        return Costs(draft=0.05, target={1: 1.0, 2: 1.02, 8: 1.1, 32: 1.6}, draft_prefill=0.001)
    return Costs(draft=0.05, target={1: 1.0, 2: 1.9, 8: 7.0, 32: 26.0}, draft_prefill=0.001)


def test_the_rule_prices_a_round_at_the_context_it_runs_at():
    """The same round is worth drafting after 32 tokens and not after 1,024 on a profile whose curve steepens with
    the context. Fails where the rule prices every round at one context (the first: it would draft at both)."""
    from pacer.costs import ContextCosts

    rule = CostAwarePolicy(FixedPolicy(gamma=8, min_draft=0), ContextCosts(steepening), refine=0.0)
    state = DraftState(remaining=100)
    rule.pricer.set_context(32)
    assert rule.should_continue(state)
    rule.update(state, RoundResult(drafted=0, accepted=0))
    rule.pricer.set_context(1024)
    assert not rule.should_continue(state)
    assert rule.pricer.costs.target_cost(2) == pytest.approx(1.9 * rule.pricer.costs.target_cost(1))
    assert rule.costs.target_cost(8) > 6  # what the rule reports: the costs where it decided last


def _per_round(stats) -> list[tuple[int, int]]:
    """``(draft length, draft forwards)`` of every round after the prefill, from the ledger (each round makes
    exactly one target forward, after its draft's)."""
    rounds, drafts = [], 0
    for call in stats.calls:
        if call.role == "draft":
            drafts += 1
        else:
            rounds.append(drafts)
            drafts = 0
    return list(zip(stats.draft_lengths[1:], rounds[1:], strict=True))


def test_a_round_that_drafts_nothing_makes_no_draft_forward(pairs):
    """A generation that crosses into a context where drafting no longer pays: before, rounds draft; after, every
    round is a plain step with no draft forward at all (no catch-up, no peek), and the output is plain decoding's.
    Fails where the pricer prices one context (it would keep drafting) or where a round that drafts nothing
    still runs the draft."""
    from pacer import Decoder
    from pacer.costs import ContextCosts

    close = pairs["close"]
    dec = Decoder(close.pair, costs=ContextCosts(steepening))
    ids = dec.encode("hello world, " * 12)[:120]  # 120 tokens: the generation crosses 160 after a few rounds
    res = dec.generate(ids, "sd", max_new_tokens=90)
    assert res.token_ids == dec.generate(ids, "ar", max_new_tokens=90).token_ids
    rounds = _per_round(res.stats)
    contexts = [len(ids) + 1 + sum(n + 1 for n in res.stats.accepted_counts[1:i + 1]) for i in range(len(rounds))]
    assert STEEP_FROM % ContextCosts.STEP == ContextCosts.STEP // 2  # priced at the nearest step: none straddles it
    early = [r for r, c in zip(rounds, contexts, strict=True) if c < STEEP_FROM]
    late = [r for r, c in zip(rounds, contexts, strict=True) if c >= STEEP_FROM]
    assert early and sum(g for g, _ in early) > 0  # drafting pays at a short context
    assert late and all(g == 0 for g, _ in late), late  # not at a long one ...
    assert all(f == 0 for g, f in rounds if g == 0), rounds  # ... and a round drafting nothing runs no draft


# --------------------------------------------------------------------------------------- checked given costs
@pytest.mark.parametrize(("costs", "kind", "says"), [
    ("fast", TypeError, "must be a pacer.costs.Costs"),
    (Costs(0.01, {}), ValueError, "no target costs"),
    (Costs(0.01, {"1": 0.3, "2": 0.31}), TypeError, "target cost k '1'"),
    (Costs(0.01, {1: "0.3"}), TypeError, "target cost at k=1"),
    (Costs(0.0, {1: 0.3, 2: 0.31}), ValueError, "draft cost is 0"),
    (Costs(0.01, {1: 0.0, 2: 0.0}), ValueError, "target cost at k=1 is 0"),
    (Costs(0.01, {1: float("nan")}), ValueError, "target cost at k=1 is nan"),
    (Costs(0.01, {1: 0.3}, tree={0: 0.3}), ValueError, "tree cost at k=0"),
    (ContextCosts(lambda context: Costs(0.01, {})), ValueError, "no target costs"),
    (ContextCosts(lambda context: "fast"), TypeError, "must be a pacer.costs.Costs"),
])
def test_costs_given_in_code_are_checked_as_a_profile_is(pairs, costs, kind, says):
    """``Decoder(costs=...)`` refuses what it cannot price with in one line naming the problem (as ``use_profile``
    refuses a profile's), at construction: never a TypeError, IndexError or ZeroDivisionError deep in a round."""
    with pytest.raises(kind, match=says) as e:
        Decoder(pairs["close"].pair, costs=costs)
    assert isinstance(e.value, PacerError) and "\n" not in str(e.value)


def test_given_costs_that_are_good_decode():
    assert Decoder(*tiny_pair("close"), threads=1, costs=CURVE).generate("hello", "sd", max_new_tokens=4).token_ids


def test_predicted_round_is_linear_in_its_bound(monkeypatch):
    """The rule's prediction extends one round token by token: its work grows like ``max_draft`` (it once summed
    the round's survivals again at every token: a million-token bound took hours)."""
    import pacer.pricing as pricing

    summed = []

    def counting_sum(values, start=0):
        values = list(values)
        summed.append(len(values))
        return sum(values, start)

    monkeypatch.setattr(pricing, "sum", counting_sum, raising=False)
    nearly_flat = Costs(draft=1e-6, target={1: 1.0, 10**7: 1.0 + 1e-9 * (10**7 - 1)})
    n, speedup = pricing.predicted_round(nearly_flat, alpha=1.0, max_draft=3000)
    assert n == 3000 and speedup > 100
    assert sum(summed) <= 4 * 3000, f"{sum(summed)} survivals summed for a bound of 3,000"

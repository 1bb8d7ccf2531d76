"""The per-round choice of source (pacer.drafters.sources): the draft model, a phrase verified alone, or both, by
predicted payoff from what each source earned in this generation; lossless whatever it picks."""

import pytest

from pacer.costs import Costs
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.drafters.sources import LOOKUP_LEN, LookupIndex, SourceEvidence
from pacer.policies import FixedPolicy
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.pricing import UNPRICED

#: a CPU-like curve: a scored token beyond the first few costs 5% of a forward, a draft token a fifth of one
CURVE = Costs(draft=0.2, target={1: 1.0, 2: 1.0, 4: 1.05, 8: 1.25, 16: 1.65, 32: 2.45}, draft_prefill=0.01)
#: prompts whose 40-token greedy continuation by the tiny target repeats no 3 tokens of the prompt or itself: a
#: phrase found in the text is then wrong
FRESH = ["The quick brown fox", "zq9 !k# Wp7"]
WRONG = 7


class Recorder(PhraseDrafter):
    """Keeps every round's proposal (after verification: ``branches`` are those the target scored)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.drafts = []

    def propose(self, *a, **kw):
        d = super().propose(*a, **kw)
        self.drafts.append(d)
        return d


def recorder(dec, **opts):
    return Recorder(dec.draft_backend(), dec.vocab, PhraseOptions(warm_start=False, **opts))


def wrong(x):
    return WRONG if x != WRONG else WRONG + 1


def test_evidence_scores_what_the_text_settles():
    """A prediction is scored once the committed text settles it (a mismatch, or all of it), per position, and
    counts for this generation first, then for later ones as their prior."""
    ev = SourceEvidence(length=4)
    kind = ("lookup", 3)
    ev.predict(kind, 2, (5, 6, 7, 8))
    ev.score([1, 2, 5, 6])  # right so far: not settled
    assert ev.scored(kind) == 0
    ev.score([1, 2, 5, 6, 9])  # third token wrong
    assert ev.gen[kind][:3] == [[1, 1], [1, 1], [0, 1]] and ev.gen[kind][3] == [0, 0]
    prior = ev.accept(("pool", 1), 2)
    assert prior == pytest.approx([SourceEvidence.PRIOR, SourceEvidence.PRIOR ** 2])
    for _ in range(30):
        ev.predict(kind, 0, (1, 2))
        ev.score([1, 2])
    assert ev.accept(kind, 2)[1] > 0.85  # both tokens right
    ev.new_generation()
    assert ev.scored(kind) == 0 and ev.accept(kind, 1)[0] > 0.9  # the earlier generations' rate is the prior
    for _ in range(6):  # this generation's text does not repeat: its own evidence takes over in a few phrases
        ev.predict(kind, 0, (1, 2))
        ev.score([3, 3])
    assert ev.accept(kind, 1)[0] < 0.4


def test_lookup_index_finds_the_longest_match_in_the_prompt_first():
    idx = LookupIndex()
    prompt = [1, 2, 3, 4, 5, 6, 9, 3, 4, 7, 7]
    idx.sync(prompt)
    assert idx.find([0, 2, 3, 4]) == (3, (5, 6, 9, 3, 4, 7, 7))  # the 3-token key, not the newer "3 4 -> 7 7"
    assert idx.find([0, 9, 3, 4])[1][:2] == (7, 7)
    idx.sync(prompt + [8, 8, 1])  # committed text is found at once
    assert idx.find([7, 8, 8]) == (3, (1,)) or idx.find([7, 8])[1][:2] == (8, 1)


def test_draft_rate_and_phrase_rate_price_the_round():
    """A phrase verified alone costs one target forward and no draft forward; a draft round pays its draft tokens
    and its share of a catch-up over the tokens still to come."""
    pol = CostAwarePolicy(FixedPolicy(gamma=8), CURVE, refine=0.0).pricer
    L, rate = pol.phrase_rate([0.9, 0.8, 0.7, 0.6])
    assert L == 4 and rate == pytest.approx((1 + 0.9 + 0.8 + 0.7 + 0.6) / CURVE.target_cost(5))
    assert pol.phrase_rate([])[0] == 0
    base = pol.draft_rate()
    assert base >= 1 / CURVE.target_cost(1)
    assert pol.draft_rate(catch_up=500, remaining=1000) < base  # a share of reading 500 tokens ...
    assert pol.draft_rate(catch_up=500) < pol.draft_rate(catch_up=500, remaining=1000)  # ... or all of it
    for _ in range(8):  # this generation's drafts are rejected: the draft model's rate falls to plain decoding's
        pol.gen_counts[1][1] += 1
    assert pol.draft_rate() < base and pol.gen_alpha(1) < 0.3
    assert UNPRICED.draft_rate() is None  # no cost model: no choice


@pytest.mark.parametrize("prompt", FRESH)
def test_draft_model_is_not_run_where_phrases_pay_and_it_does_not(pairs, prompt):
    """The draft never agrees with the target, the pool holds the target's own text: after a few rounds every
    round verifies a phrase alone and the draft model is not run. Fails without the choice (``choose=False``: the
    draft model keeps being run, the phrases checked by it or scored as branches after its tokens)."""
    dec = pairs["random"]
    ids = dec.encode(prompt)
    ar = dec.generate(ids, "ar", max_new_tokens=40).token_ids
    for choose in (True, False):
        d = recorder(dec, choose=choose, candidates=1)
        d.pool.add_sequence(ids + ar, "prompt", partial=True)
        res = dec.generate(ids, "ouroboros", max_new_tokens=40, drafter=d,
                           policy=(rule := CostAwarePolicy(FixedPolicy(gamma=8), CURVE, refine=0.0)),
                           pricer=rule.pricer)
        assert res.token_ids == ar
        later = d.drafts[3:]
        assert later
        if choose:
            assert sum(x.forwards for x in later) == 0
            assert res.extra["drafter"]["phrase_rounds"] >= len(later)
            assert res.stats.rounds < len(ar) / 2  # phrases pay: several tokens a round
        else:
            assert sum(x.forwards for x in later) > 0


@pytest.mark.parametrize("prompt", FRESH)
def test_phrases_this_text_does_not_take_are_not_verified(pairs, prompt):
    """Earlier generations' branches paid (the decoder's learnt yield is high), but this text's phrases are all
    wrong: after a few rounds no phrase token is verified, whether alone or as a branch. Fails without the
    choice (the yield learnt over the decoder's generations keeps the branches scored)."""
    dec = pairs["same"]
    ids = dec.encode(prompt)
    ar = dec.generate(ids, "ar", max_new_tokens=40).token_ids
    seq = ids + ar
    for choose in (True, False):
        d = recorder(dec, choose=choose, candidates=2, phrases=False)
        for j in range(2, len(seq)):  # a wrong continuation for every context of the text
            d.pool.add(tuple(seq[j - 2 : j]), tuple(wrong(x) for x in seq[j : j + 6]) or (WRONG,), "prompt")
        pol = CostAwarePolicy(FixedPolicy(gamma=4), CURVE, refine=0.0)
        pol.memory.branch_update(400, 200)  # as after generations whose branches paid
        pol.memory.pool_update(400, 200)
        d.choice.evidence.total[("pool", 2)] = [[50, 100] for _ in range(d.choice.evidence.length)]
        res = dec.generate(ids, "ouroboros", max_new_tokens=40, drafter=d, policy=pol, pricer=pol.pricer)
        assert res.token_ids == ar
        verified = [sum(len(b) for b in x.branches) for x in d.drafts]
        assert sum(verified[:3]) > 0  # the earlier generations' yield: phrases are tried at first
        if choose:
            assert sum(verified[6:]) == 0, verified
        else:
            assert sum(verified[6:]) > 0, verified


@pytest.mark.parametrize("kind", ["close", "same", "random"])
def test_the_choice_is_lossless(pairs, kind):
    """Whatever source each round picks, the output is plain decoding's (phrases planted half right)."""
    dec = pairs[kind]
    for prompt in ("hello world, this is", *FRESH):
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=40).token_ids
        d = recorder(dec)
        seq = ids + ar
        d.pool.add_sequence(seq[: len(ids) + 20] + [wrong(x) for x in seq[len(ids) + 20 :]], "prompt")
        for policy in (CostAwarePolicy(FixedPolicy(gamma=4), CURVE, refine=0.0), None):
            res = dec.generate(ids, "ouroboros", max_new_tokens=40, drafter=d, policy=policy)
            assert res.token_ids == ar, (kind, prompt)
            d.drafts.clear()


def test_every_committed_position_predicts_from_the_text_before_it(pairs):
    """The generation's own text is scored at every committed position, not once a round, so a grounded prompt
    earns its evidence within a few rounds; and each prediction is what a phrase round at that position would
    verify, from the text before it alone (no later token leaks in). Fails with one prediction a round (fewer
    scored than tokens committed) or with the index synced past the position (a different phrase)."""
    dec = pairs["same"]  # the draft is accepted: a round commits several tokens
    ids = dec.encode("hello world, this is")
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    prompt = ids + ar + ids  # the prompt holds text the output may repeat
    d = recorder(dec, candidates=1)
    made = []
    ev = d.choice.evidence
    predict = ev.predict
    ev.predict = lambda kind, at, phrase: (made.append((kind, at, tuple(phrase))), predict(kind, at, phrase))
    res = dec.generate(prompt, "ouroboros", max_new_tokens=40, drafter=d,
                       policy=(rule := CostAwarePolicy(FixedPolicy(gamma=4), CURVE, refine=0.0)), pricer=rule.pricer)
    seq = prompt + res.token_ids
    lookups = {at: (k, p) for (src, k), at, p in made if src == "lookup" and p}
    matched = []
    for at in range(len(prompt) + 1, max(at for _, at, _ in made) + 1):  # up to the last round's start
        idx = LookupIndex()
        idx.sync(seq[:at])
        k, cont = idx.find(seq[:at])
        if cont:
            matched.append(at)
            assert at in lookups, at
            assert lookups[at][0] == k and lookups[at][1] == cont[: len(lookups[at][1])], at
    acc = res.stats.accepted_counts
    starts = {len(prompt) + sum(acc[:i]) + i for i in range(len(acc))}  # each round's committed text
    assert len(set(matched) - starts) >= 5, (matched, starts)  # positions inside rounds are predicted too


def test_pacer_ouroboros_runs_the_configuration_chosen_on_the_development_questions(pairs):
    """pacer+ouroboros's drafter has siblings=4 unless told otherwise (``SIBLINGS``, measured on the dev set);
    plain ouroboros none; an explicit option wins."""
    from pacer.methods.phrase import SIBLINGS
    from pacer.methods.registry import Build, get

    pair = pairs["close"].pair
    assert SIBLINGS == 4
    assert get("pacer+ouroboros").drafter(Build(pair)).options.siblings == SIBLINGS
    assert get("pacer+ouroboros").drafter(Build(pair, options={"siblings": 0})).options.siblings == 0
    assert get("ouroboros").drafter(Build(pair)).options.siblings == 0


@pytest.mark.parametrize("lookup_len", [None, 8, 12])
def test_a_phrase_round_verifies_up_to_lookup_len_tokens(pairs, lookup_len):
    """Where the text repeats and the generation's own text has paid, a round verifies the longest phrase the
    cost rule prices as paying, up to ``lookup_len`` tokens (default 16). Fails with the length fixed at one value."""
    dec = pairs["random"]
    d = recorder(dec, candidates=1, **({} if lookup_len is None else {"lookup_len": lookup_len}))
    d.reset()
    span = [11 + i for i in range(24)]
    tokens = [3, 4] + span + [5] + span[:3]  # the last 3 tokens start the span: its next 21 follow in the prompt
    assert LOOKUP_LEN == 16
    for k in (1, 2, 3):
        d.choice.evidence.total[("lookup", k)] = [[99, 100] for _ in range(d.choice.evidence.length)]
    pol = CostAwarePolicy(FixedPolicy(gamma=8), CURVE, refine=0.0)
    found = d.choice.choose(tokens, pol.pricer, 16, 0, 0, d._sync)
    assert found is not None  # a phrase verified alone ...
    assert found[0] == span[3 : 3 + (lookup_len or LOOKUP_LEN)] and found[1] is None  # ... from the text itself

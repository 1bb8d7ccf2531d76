"""Ouroboros phrase drafting: lossless with phrases and candidate branches, right tree mask, bounded pool."""

import json
import subprocess
import sys

import pytest
import torch

from pacer.backends.transformers import TransformersBackend
from pacer.costs import Costs
from pacer.decoding import Draft, Tree
from pacer.drafters import TokenDrafter
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.drafters.pool import PhrasePool, clear_shared_pools
from pacer.errors import PacerError
from pacer.policies import ConfidencePolicy, DraftState, FixedPolicy
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.pricing import CostPricer
from pacer.sampling import SamplingConfig

PROMPTS = ["hello world, this is", "def f(x):\n    return", "a", "abc abc abc abc abc"]


def drafter(dec, **opts):
    return PhraseDrafter(dec.draft_backend(), dec.vocab, PhraseOptions(**opts))


def check_stats(res):
    st = res.stats
    assert all(0 <= n <= g for n, g in zip(st.accepted_counts, st.draft_lengths, strict=True))
    rep = res.extra["drafter"]
    assert rep["draft_forwards"] == st.draft_forwards
    assert rep["draft_forwards"] <= rep["draft_tokens"] + rep["rounds"]
    assert st.tau == pytest.approx((st.accepted_tokens + st.rounds) / st.rounds)
    return rep


@pytest.mark.parametrize("kind", ["close", "same", "random"])
@pytest.mark.parametrize("candidates", [0, 1, 3])
def test_greedy_ouroboros_equals_plain(pairs, kind, candidates):
    dec = pairs[kind]
    clear_shared_pools()
    for prompt in PROMPTS:
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=37).token_ids
        for gamma, ngram in ((1, 3), (4, 6), (9, 2)):
            for warm in (False, True):
                opts = {"candidates": candidates, "ngram": ngram, "warm_start": warm}
                res = dec.generate(ids, "ouroboros", max_new_tokens=37, gamma=gamma, options=opts)
                assert res.token_ids == ar, (kind, candidates, prompt, gamma, ngram, warm)
                rep = check_stats(res)
                assert max(res.stats.draft_lengths) - rep["candidate_accepted_tokens"] <= gamma
                if candidates == 0:
                    assert rep["candidate_rounds"] == 0


def test_same_draft_gains_from_warm_phrases(pairs):
    """Draft == target: a second run over the same prompt finds its own output in the (warm) pool."""
    dec = pairs["same"]
    clear_shared_pools()
    ids = dec.encode(PROMPTS[0])
    first = dec.generate(ids, "ouroboros", max_new_tokens=40, gamma=8, options={"candidates": 2})
    second = dec.generate(ids, "ouroboros", max_new_tokens=40, gamma=8, options={"candidates": 2})
    assert first.token_ids == second.token_ids
    rep = second.extra["drafter"]
    assert rep["phrase_tokens"] > 0 and rep["phrase_hits_by_source"].get("warm", 0) > 0
    assert second.stats.draft_forwards < first.stats.draft_forwards


# ------------------------------------------------------------------------------------ planted phrases
def planted(dec, prompt, phrase_of, gamma, candidates, phrases=True, max_new_tokens=30):
    """Generate with an empty, non-learning pool holding one planted entry ``phrase_of(ids, ar)``."""
    ids = dec.encode(prompt)
    ar = dec.generate(ids, "ar", max_new_tokens=max_new_tokens).token_ids
    # the draft checks the phrase (not a round that verifies it alone: tests/test_sources.py)
    d = drafter(dec, sources=(), warm_start=False, candidates=candidates, phrases=phrases, choose=False)
    key, cont = phrase_of(ids, ar)
    d.pool.add(tuple(key), tuple(cont), "prompt")
    res = dec.generate(ids, "ouroboros", max_new_tokens=max_new_tokens, gamma=gamma, drafter=d)
    return res, ar


WRONG = 7  # a byte token; made to differ from the real one where used


def wrong(x):
    return WRONG if x != WRONG else WRONG + 1


def test_phrase_agreement_is_learnt_per_kind_of_entry(pairs):
    """The draft's agreement with phrases is learnt per kind of pool entry (its source and key length) and prices
    the check: where a longer draft forward costs something, an entry of a kind the draft rarely agrees with is not
    checked and one of a kind it agrees with is, though the overall rate lies between them; a kind not seen yet has
    the overall rate. A generation learns the kind of the entry it checked."""
    pool = PhrasePool(ngram=4, capacity=100, key_len=2)
    for _ in range(20):
        pool.learn_agreement(2, 0, ("lookahead", 2))
        pool.learn_agreement(4, 4, ("output", 2))
    poor, good, overall = pool.agreement(4, ("lookahead", 2)), pool.agreement(4, ("output", 2)), pool.agreement(4)
    assert poor[0] < 0.1 < overall[0] < 0.9 < good[0]
    assert pool.agreement(4, ("verify", 1)) == overall
    curve = Costs(0.036, {1: 0.25, 8: 0.26}, draft_curve={1: 0.036, 2: 0.041, 4: 0.047, 8: 0.2})
    policy = CostAwarePolicy(FixedPolicy(gamma=4), curve)
    d = drafter(pairs["same"], sources=(), warm_start=False)
    d.pool = pool
    assert d.pool.check_len(policy.pricer, 1, 4, ("lookahead", 2)) == 0
    assert d.pool.check_len(policy.pricer, 1, 4, ("output", 2)) == 3  # to k = 4: dear beyond (test_costs)
    assert d.pool.check_len(policy.pricer, 1, 4) > 0  # the overall rate alone would check the poor kind's phrases too

    dec = pairs["same"]
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    d2 = drafter(dec, sources=(), warm_start=False, candidates=0)
    key = (ids[-1], ar[0])  # the first drafting round follows the prompt and the prefill's token
    d2.pool.add(key, tuple(ar[1:7]), "prompt")
    assert d2.pool.kind(key, tuple(ar[1:7])) == ("prompt", 2)
    assert dec.generate(ids, "ouroboros", max_new_tokens=30, gamma=8, drafter=d2).token_ids == ar
    assert set(d2.pool.agreed_by) == {("prompt", 2)}
    agreed, checked = d2.pool.agreed_by[("prompt", 2)][0]
    assert agreed == checked >= 1  # the draft is the target: it agrees with the target's own text

    # live, under a priced policy: the same planted phrase is checked when its kind earned it, not otherwise. A
    # phrase token costs 4 ms of draft forward at any length (so the prompt's length, read by the same forward, does
    # not matter): worth it at an agreement above 0.11 - the overall rate here is one half, the poor kind's ~0.05
    linear = Costs(0.036, {1: 0.25, 8: 0.26}, draft_curve={1: 0.036, 64: 0.036 + 63 * 0.004})
    for agreed, checks in ((0, False), (4, True)):
        d3 = drafter(dec, sources=(), warm_start=False, candidates=0)
        d3.pool.add(key, tuple(ar[1:7]), "prompt")
        for _ in range(20):
            d3.pool.learn_agreement(4, agreed, ("prompt", 2))
            d3.pool.learn_agreement(4, 4 - agreed, ("output", 2))
        res = dec.generate(ids, "ouroboros", max_new_tokens=30, drafter=d3, policy=FixedPolicy(gamma=8),
                           pricer=CostPricer(linear))  # a literal rule, its extras priced
        assert res.token_ids == ar
        assert (res.extra["drafter"]["phrase_tokens"] > 0) == checks


@pytest.mark.parametrize("kind", ["close", "same", "random"])
@pytest.mark.parametrize("match", ["full", "partial", "none"])
def test_planted_draft_phrase(pairs, kind, match):
    """The phrase continuing the prompt matches the target's output fully, for 3 tokens, or not at all."""
    dec = pairs[kind]

    def phrase(ids, ar):  # after the prompt and the prefill's token, where the first drafting round starts
        cont = list(ar[1:7])
        if match == "partial":
            cont[3:] = [wrong(ar[4])] * 3
        elif match == "none":
            cont = [wrong(ar[1])] * 6
        return [ids[-1], ar[0]], cont

    for prompt in PROMPTS[:2]:
        res, ar = planted(dec, prompt, phrase, gamma=8, candidates=0)
        assert res.token_ids == ar
        rep = check_stats(res)
        assert rep["phrase_forwards"] >= 1
        if kind == "same":  # the draft agrees with every target token
            want = {"full": 6, "partial": 3, "none": 0}[match]
            assert rep["phrase_tokens"] >= want
            assert res.stats.accepted_counts[1] == 8  # the first drafting round (after the prefill's)
            # first round: one forward for the phrase (+ its own next token), then one per token
            assert res.stats.draft_forwards < rep["draft_tokens"] or match == "none"


@pytest.mark.parametrize("kind", ["close", "same", "random"])
@pytest.mark.parametrize("match", ["full", "partial", "none"])
@pytest.mark.parametrize("n_candidates", [1, 3])
def test_planted_candidate_branch(pairs, kind, match, n_candidates):
    """A candidate after ``d_1 d_2`` of the first drafting round (after the prefill's token) that continues with
    the target's tokens 6, 3 or 0 times."""
    dec = pairs[kind]
    gamma = 2

    def phrase(ids, ar):
        cont = list(ar[gamma + 1 : gamma + 7])
        if match == "partial":
            cont[3:] = [wrong(ar[gamma + 4])] * 3
        elif match == "none":
            cont = [wrong(ar[gamma + 1])] * 6
        return ar[1 : gamma + 1], cont

    for prompt in PROMPTS[:2]:
        res, ar = planted(dec, prompt, phrase, gamma=gamma, candidates=n_candidates, phrases=False)
        assert res.token_ids == ar
        rep = check_stats(res)
        if kind == "same":
            assert rep["candidate_rounds"] >= 1
            ext = {"full": 6, "partial": 3, "none": 0}[match]
            assert res.stats.accepted_counts[1] == gamma + ext
            assert res.stats.draft_lengths[1] == gamma + ext
            assert rep["candidate_accepted_tokens"] >= ext


def test_tree_size_caps_the_branches(pairs):
    dec = pairs["same"]
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    for tree_size, want in ((5, 2), (10, 6), (None, 6), (3, 0)):
        d = drafter(dec, sources=(), warm_start=False, candidates=2, phrases=False, tree_size=tree_size)
        # after d_1 d_2 of the first drafting round (the prefill gave ar[0])
        d.pool.add(tuple(ar[1:3]), (wrong(ar[3]),) * 6, "prompt")
        d.pool.add(tuple(ar[1:3]), tuple(ar[3:9]), "prompt")  # newest: the first candidate
        res = dec.generate(ids, "ouroboros", max_new_tokens=30, gamma=2, drafter=d)
        assert res.token_ids == ar and res.stats.accepted_counts[1] == 2 + want, tree_size
        rep = res.extra["drafter"]
        cap = tree_size - 3 if tree_size else 12
        assert rep["candidate_tokens_proposed"] <= cap * rep["candidate_rounds"]


def test_candidate_cut_by_max_new_tokens_and_eos(pairs):
    dec = pairs["same"]

    def phrase(ids, ar):  # after d_1 d_2 of the first drafting round (the prefill gave ar[0])
        return ar[1:3], ar[3:9]

    for m in (4, 5, 6, 10):
        res, ar = planted(dec, PROMPTS[0], phrase, gamma=2, candidates=1, phrases=False, max_new_tokens=m)
        assert res.token_ids == ar[:m] and len(res.token_ids) == m
    saved = set(dec.eos)
    try:
        ar = dec.generate(PROMPTS[0], "ar", max_new_tokens=30).token_ids
        dec.eos.add(ar[5])  # an end token inside the accepted branch
        res, ar2 = planted(dec, PROMPTS[0], phrase, gamma=2, candidates=1, phrases=False)
        assert res.token_ids == ar2 == ar[: ar.index(ar[5]) + 1] and res.stats.finish_reason == "eos"
    finally:
        dec.eos.clear()
        dec.eos.update(saved)


# ------------------------------------------------------------------------------------------ tree mask
@pytest.mark.parametrize("past_len", [1, 5])
def test_tree_forward_matches_separate_branch_forwards(close, past_len):
    """Every row of one tree forward equals the same row of a plain causal forward of that branch alone."""
    model = close.target_info.model
    ids = close.encode(PROMPTS[1])
    prefix, pending = ids[:-past_len], ids[-past_len:]
    main = [11, 42, 99]
    branches = [[5, 6, 7, 8], [70], [30, 31], [17, 18]]
    anchors = [3, 3, 3, 1]  # the last: a sibling of d_2
    d = Draft(main, None, DraftState(), branches=[list(b) for b in branches], anchors=list(anchors))
    t = TransformersBackend(model)
    t.forward(prefix)
    tree_ids, shape = d.tree_inputs(pending, room=10)
    assert shape.attend.shape == (len(tree_ids), len(tree_ids)) and len(shape.depth) == len(tree_ids)
    tree, _ = t.forward(tree_ids, tree=shape)

    def plain(seq):
        with torch.inference_mode():
            return model(input_ids=torch.tensor([seq])).logits[0].float()

    k = len(pending) + len(main)
    ref = plain(prefix + pending + main)[len(prefix) :]
    torch.testing.assert_close(tree[:k], ref, rtol=1e-4, atol=1e-4)
    o = k
    for b, a in zip(branches, anchors, strict=True):
        ref = plain(prefix + pending + main[:a] + b)[-len(b) :]
        torch.testing.assert_close(tree[o : o + len(b)], ref, rtol=1e-4, atol=1e-4)
        o += len(b)
    # the cache cropped to the main chain is the plain cache: the next token scores like a plain forward
    t.crop(len(prefix) + k)
    nxt, _ = t.forward([5])
    torch.testing.assert_close(nxt[-1], plain(prefix + pending + main + [5])[-1], rtol=1e-4, atol=1e-4)

    # the check has teeth: default (causal-chain) position ids, or a plain causal mask, give other logits
    chain = Tree.chain(len(tree_ids))
    t2 = TransformersBackend(model)
    t2.forward(prefix)
    bad, _ = t2.forward(tree_ids, tree=Tree(shape.attend, chain.depth))
    assert not torch.allclose(bad[k:], tree[k:], atol=1e-3)
    t3 = TransformersBackend(model)
    t3.forward(prefix)
    bad, _ = t3.forward(tree_ids, tree=Tree(chain.attend, shape.depth))
    assert not torch.allclose(bad[k + len(branches[0]) :], tree[k + len(branches[0]) :], atol=1e-3)


def test_tree_inputs_with_siblings():
    """A sibling of d_{a+1} sees the pending tokens and d_1..d_a only, at d_{a+1}'s position; ``total`` caps the
    branches after d_γ only; a backend without such trees gets none."""
    d = Draft([1, 2, 3], None, DraftState(), branches=[[7, 8], [5]], anchors=[3, 1])
    ids, tree = d.tree_inputs([9], room=4)
    assert ids == [9, 1, 2, 3, 7, 8, 5] and tree.depth == (0, 1, 2, 3, 4, 5, 2)
    allowed = tree.attend.int().tolist()
    assert allowed[6] == [1, 1, 0, 0, 0, 0, 1]  # the sibling of d_2: pending, d_1, itself
    assert allowed[5] == [1, 1, 1, 1, 1, 1, 0]  # the tail branch: the whole main chain and its own prefix
    d = Draft([1, 2, 3], None, DraftState(), branches=[[7, 8], [5]], anchors=[3, 1])
    ids, _ = d.tree_inputs([9], room=4, total=0)
    assert ids == [9, 1, 2, 3, 5] and d.branches == [[5]] and d.anchors == [1]
    d = Draft([1, 2, 3], None, DraftState(), branches=[[7, 8], [5]], anchors=[3, 1])
    ids, _ = d.tree_inputs([9], room=4, siblings=False)
    assert ids == [9, 1, 2, 3, 7, 8] and d.anchors == [3]
    # accepting: only a branch anchored where the main draft stopped
    d = Draft([1, 2, 3], None, DraftState(), branches=[[7, 8], [5]], anchors=[3, 1])
    d.tree_inputs([9], room=4)
    logits = torch.zeros(7, 10)
    logits[6, 4] = 1.0  # the target's token after the sibling
    assert d.accept_branch(logits, 4, 1, 5) == 4 and d.extension == [5]
    assert d.accept_branch(logits, 4, 2, 5) == 5 and d.extension == []  # nothing anchored after d_2


def test_tree_inputs_trim_and_plain_path():
    d = Draft([1, 2], None, DraftState(), branches=[[3, 4, 5], [6]])
    ids, tree = d.tree_inputs([9], room=2)
    assert ids == [9, 1, 2, 3, 4, 6] and d.branches == [[3, 4], [6]]
    assert tree.depth == (0, 1, 2, 3, 4, 3)
    allowed = tree.attend.int().tolist()
    assert allowed[4] == [1, 1, 1, 1, 1, 0]  # b_2 of branch 0: main, b_1, itself
    assert allowed[5] == [1, 1, 1, 0, 0, 1]  # branch 1: main, itself
    assert allowed[2] == [1, 1, 1, 0, 0, 0]  # the main chain is causal
    d = Draft([1, 2], None, DraftState(), branches=[[3]])
    assert d.tree_inputs([9], room=0) == ([9, 1, 2], None)


@pytest.mark.parametrize("kind", ["close", "random"])
def test_siblings_are_lossless_and_extend_rounds(pairs, kind, monkeypatch):
    """Greedy with sibling branches (the draft's second choice beside each draft token) equals plain decoding;
    on the close pair some sibling is the target's token and extends its round by one; a target backend that
    scores no such tree gets none, with the same output."""
    dec = pairs[kind]
    clear_shared_pools()
    hits = 0
    for prompt in PROMPTS:
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=40).token_ids
        for gamma in (3, 6):
            res = dec.generate(ids, "ouroboros", max_new_tokens=40, gamma=gamma,  # every round drafts
                               options={"siblings": 4, "candidates": 1, "choose": False})
            assert res.token_ids == ar, (kind, prompt, gamma)
            rep = check_stats(res)
            assert rep["siblings_proposed"] > 0 and rep["siblings_accepted"] <= rep["siblings_proposed"]
            hits += rep["siblings_accepted"]
    if kind == "close":
        assert hits > 0
    monkeypatch.setattr(type(getattr(dec.target, "inner", dec.target)), "sibling_branches", False)
    ids = dec.encode(PROMPTS[1])
    res = dec.generate(ids, "ouroboros", max_new_tokens=40, gamma=6, options={"siblings": 4, "candidates": 0})
    assert res.token_ids == dec.generate(ids, "ar", max_new_tokens=40).token_ids
    rep = res.extra["drafter"]
    assert rep["siblings_proposed"] > 0 and rep["candidate_rounds"] == 0  # proposed, never scored


def test_the_sibling_hit_rate_is_learnt_from_every_rejection():
    """The draft's estimate that its second choice is the target's token is scaled by what the rounds showed:
    every greedy rejection is one observation (whether or not a sibling was scored there), a runner-up that is
    never the target's token drives the scale - and the priced chance - towards 0."""
    from pacer.drafters.branches import SiblingRate

    rate = SiblingRate()
    assert rate.ratio == 1.0 and rate.hits_of([0.4, 0.9]) == [0.4, 0.9]
    for _ in range(20):
        rate.update(0.5, False)
    assert rate.ratio == pytest.approx(2.0 / 12.0) and rate.hits_of([0.6])[0] == pytest.approx(0.1)
    for _ in range(40):
        rate.update(0.25, True)
    assert rate.ratio > 1.0 and rate.hits_of([0.9]) == [1.0]


@pytest.mark.parametrize("kind", ["close", "random"])
def test_a_generation_with_siblings_learns_one_observation_per_rejected_round(pairs, kind):
    dec = pairs[kind]
    clear_shared_pools()
    ids = dec.encode(PROMPTS[0])
    res = dec.generate(ids, "ouroboros", max_new_tokens=40, gamma=4, options={"siblings": 4, "candidates": 0})
    rep = res.extra["drafter"]
    st = res.stats
    rejected = sum(a < d for d, a in zip(st.draft_lengths, st.accepted_counts, strict=True))
    assert rejected > 0 and rep["sibling_observations"] == rejected
    if kind == "random":  # an unrelated target: the draft's runner-up is rarely its token
        assert rep["sibling_hit_ratio"] < 1.0
    assert rep["siblings_proposed"] > 0
    from pacer.request import MethodRequest

    req = MethodRequest.of("ouroboros", gamma=4, options={"siblings": 4, "candidates": 0})
    drafter = dec.make_drafter(req)
    rate = drafter.branches.sibling_rate
    rate.PRIOR = 0.0
    rate.update(10.0, False)  # learnt: the runner-up is never the target's token ...
    rate.update = lambda raw, hit: None  # ... and this generation teaches it nothing else
    res = dec.generate(ids, req, max_new_tokens=40, drafter=drafter)
    assert res.extra["drafter"]["siblings_proposed"] == 0  # priced at nothing: none offered


# ---------------------------------------------------------------------------------------------- pool
def test_pool_stays_within_its_bound_lru():
    pool = PhrasePool(ngram=3, capacity=50, key_len=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        seq = torch.randint(0, 30, (25,), generator=g).tolist()
        pool.add_sequence(seq, "output")
        assert len(pool) <= 50
        assert sum(len(c) for c in pool.index.values()) == len(pool)
    pool.add((1, 2), (3, 4, 5), "verify")
    assert pool.lookup([0, 1, 2], 1) == [((1, 2), (3, 4, 5))]  # newest, longest key first
    for i in range(60):  # push it out
        pool.add((100 + i,), (1, 2, 3), "output")
    assert ((1, 2), (3, 4, 5)) not in pool.entries and len(pool) == 50
    assert all(k[0] >= 100 for k, _ in pool.entries)


def test_pool_lookup_and_sequences():
    pool = PhrasePool(ngram=2, capacity=100, key_len=2)
    pool.add_sequence([1, 2, 3, 4, 5], "prompt")
    assert pool.lookup([9, 2], 1) == [((2,), (3, 4))]
    assert pool.lookup([1, 2], 1) == [((1, 2), (3, 4))]
    pool.add((2,), (8, 9), "output")
    got = pool.lookup([7, 2], 3)
    assert [c for _, c in got] == [(8, 9), (3, 4)]  # newest first, distinct first tokens
    assert pool.lookup([7, 2], 3, exclude_first={8}) == [((2,), (3, 4))]
    # first_cont / partial: only continuations inside the verified part, short tail kept
    p2 = PhrasePool(ngram=4, capacity=100, key_len=1)
    p2.add_sequence([50, 51, 52, 53], "verify", first_cont=1, partial=True)
    assert set(p2.entries) == {((50,), (51, 52, 53)), ((51,), (52, 53))}
    assert p2.counts()["verify"] == 2


def test_drafter_pool_bound_during_generation(close):
    d = drafter(close, pool_size=40, warm_start=False)
    res = close.generate(PROMPTS[1], "ouroboros", max_new_tokens=40, drafter=d)
    assert res.extra["drafter"]["pool_size"] <= 40 and len(d.pool) <= 40


def test_pool_save_load_atomic(tmp_path, close):
    path = tmp_path / "pool.json"
    d = drafter(close, warm_start=False, pool_file=path)
    close.generate(PROMPTS[0], "ouroboros", max_new_tokens=20, drafter=d)  # report() saves
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == ["pool.json"]
    d2 = drafter(close, warm_start=False, pool_file=path)
    assert set(d2.pool.entries) == set(d.pool.entries)
    res = close.generate(PROMPTS[0], "ouroboros", max_new_tokens=20, drafter=d2)
    assert res.extra["drafter"]["phrase_hits_by_source"].get("warm", 0) > 0  # the loaded entries were used
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "pacer-phrase-pool", "vocab": 3, "entries": []}))
    with pytest.raises(PacerError, match="another vocabulary"):
        drafter(close, warm_start=False, pool_file=bad)
    bad.write_text("{not json")
    with pytest.raises(PacerError, match="cannot be read"):
        drafter(close, warm_start=False, pool_file=bad)


def test_bad_options(close):
    with pytest.raises(PacerError, match="unknown phrase source"):
        drafter(close, sources="prompt,nope")
    with pytest.raises(PacerError):
        drafter(close, candidates=-1)


# ---------------------------------------------------------------------------------- features / sampling
class Recording(FixedPolicy):
    hidden_layers = (0, -1)

    def __init__(self, gamma):
        super().__init__(gamma)
        self.states = []

    def update(self, state, result):
        self.states.append((state, result))


def test_phrase_tokens_get_their_features(pairs):
    """Phrase drafting gives the same tokens, probabilities and hidden states as token-by-token drafting."""
    dec = pairs["same"]
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    d = drafter(dec, sources=(), warm_start=False, candidates=0)
    d.pool.add((ids[-1], ar[0]), tuple(ar[1:6]), "prompt")  # after the prompt and the prefill's token
    pa, pb = Recording(6), Recording(6)
    a = dec.generate(ids, "ouroboros", max_new_tokens=30, policy=pa, drafter=d)
    token_drafter = TokenDrafter(dec.draft_backend(), dec.vocab)
    b = dec.generate(ids, "sd", max_new_tokens=30, policy=pb, drafter=token_drafter)
    assert a.token_ids == b.token_ids == ar
    sa, sb = pa.states[0][0], pb.states[0][0]
    assert sa.tokens == sb.tokens and sa.phrase[:5] == [True] * 5 and sa.phrase[5] is False
    assert all(not x for x in sb.phrase)
    for f in ("prob", "top_prob", "entropy"):
        assert getattr(sa, f) == pytest.approx(getattr(sb, f), rel=1e-4, abs=1e-5)
    assert len(sa.hidden) == sa.n and sa.hidden[0].shape == (2 * dec.draft_info.model.config.hidden_size,)
    for x, y in zip(sa.hidden, sb.hidden, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    assert a.stats.draft_forwards < b.stats.draft_forwards


def test_pacer_ouroboros_method_with_a_length_policy(pairs):
    """``pacer+ouroboros`` builds a PhraseDrafter; any policy (confidence, with hidden states) drives it."""
    dec = pairs["close"]
    ids = dec.encode(PROMPTS[1])
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    pol = ConfidencePolicy(0.3, min_draft=0, max_draft=12)
    pol.hidden_layers = (-1,)
    res = dec.generate(ids, "pacer+ouroboros", max_new_tokens=30, policy=pol, options={"candidates": 2})
    assert res.token_ids == ar and "drafter" in res.extra


@pytest.mark.parametrize("kind", ["close", "random"])
def test_sampling_falls_back_to_token_drafting(pairs, kind):
    """Sampling: exactly sd's draws (same seed, same output), reproducible, and no candidate branches."""
    dec = pairs[kind]
    for seed in (1, 2):
        s = SamplingConfig(temperature=0.8, top_k=50, top_p=0.95, seed=seed)
        sd = dec.generate(PROMPTS[0], "sd", max_new_tokens=30, gamma=4, sampling=s)
        a = dec.generate(PROMPTS[0], "ouroboros", max_new_tokens=30, gamma=4, sampling=s,
                         options={"candidates": 3})
        b = dec.generate(PROMPTS[0], "ouroboros", max_new_tokens=30, gamma=4, sampling=s,
                         options={"candidates": 3})
        assert a.token_ids == b.token_ids == sd.token_ids
        assert a.stats.accepted_counts == sd.stats.accepted_counts
        assert a.extra["drafter"]["candidate_rounds"] == 0 and a.extra["drafter"]["phrase_forwards"] == 0


def test_cli_generate_ouroboros(tmp_path):
    from pacer.tiny import save_tiny_pair

    t, d = save_tiny_pair(tmp_path, "close")
    base = [sys.executable, "-m", "pacer", "generate", "def f(x):", "--target", str(t), "--draft", str(d),
            "--dtype", "float32", "--threads", "1", "--max-new-tokens", "24", "--json"]
    cmd = base + ["--method", "ouroboros", "--ngram", "4", "--pool-size", "64", "--candidates", "2",
                  "--gamma", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    rep = res["drafter"]
    assert rep["pool_capacity"] == 64 and rep["pool_size"] <= 64
    assert res["stats"]["draft_forwards"] == rep["draft_forwards"]
    ar = subprocess.run(base + ["--method", "ar"], capture_output=True, text=True, timeout=300)
    assert json.loads(ar.stdout)["token_ids"] == res["token_ids"]

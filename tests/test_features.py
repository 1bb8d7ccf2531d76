"""Which per-token draft features are computed: each policy declares those it reads (``draft_features``) and the
drafter computes only those (a fixed γ, the heuristic and the oracle none: their greedy drafts take the argmax of
the logits without a softmax); the numpy fast path for CPU rows gives the torch path's values; the numpy argmax
is torch's (ties, NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from pacer import SamplingConfig
from pacer.backends.transformers import TransformersBackend
from pacer.costs import Costs
from pacer.decoding.drafter import _features_torch, token_features
from pacer.drafters import TokenDrafter
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.policies import (
    DRAFT_FEATURES,
    ConfidencePolicy,
    CumProbPolicy,
    DraftPolicy,
    DraftState,
    EntropyPolicy,
    FixedPolicy,
    HeuristicPolicy,
)
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.sampling import argmax, softmax_stats

FIELDS = ("prob", "top_prob", "second_prob", "second_token", "entropy")


class Everything(FixedPolicy):
    """A fixed γ of 6 that reads every feature (what a user's policy gets by default)."""

    draft_features = DRAFT_FEATURES

    def __init__(self) -> None:
        super().__init__(gamma=6)


class Soft(FixedPolicy):
    """A fixed γ that asks the loop for soft acceptance (which needs ``q(d_i)``) and reads no feature itself."""

    needs_soft = True


class Untold(DraftPolicy):
    """A policy written before ``draft_features`` existed: it gets every feature."""

    def should_continue(self, state: DraftState) -> bool:
        return state.n < 6


def _computed(state: DraftState) -> set[str]:
    return {f for f in FIELDS if getattr(state, f)}


def _draft(drafter, policy, ids):
    drafter.reset()
    return drafter.propose(ids, policy, 6, SamplingConfig(), torch.Generator())


@pytest.mark.parametrize("phrases", [False, True])
def test_a_drafter_computes_only_the_features_its_policy_reads(close, phrases):
    costs = Costs(draft=1e-4, target={1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0})  # drafting pays: it drafts
    cases = [
        (FixedPolicy(gamma=6), set()),
        (HeuristicPolicy(gamma=6, max_draft=6), set()),
        (ConfidencePolicy(threshold=0.0), {"top_prob"}),
        (EntropyPolicy(threshold=100.0), {"entropy"}),
        (CumProbPolicy(threshold=0.0), {"prob"}),
        (CostAwarePolicy(ConfidencePolicy(threshold=None, max_draft=6), costs, refine=0.0), {"top_prob"}),
        (Soft(gamma=6), {"prob"}),
        (Untold(), set(FIELDS)),
        (Everything(), set(FIELDS)),
    ]
    backend = TransformersBackend(close.draft_info.model)  # the full vocabulary
    make = (lambda: PhraseDrafter(backend, close.vocab, PhraseOptions(warm_start=False))) if phrases else (
        lambda: TokenDrafter(backend, close.vocab))
    ids = close.encode("The 3 quick brown foxes jump over the 3 quick brown")
    drafts = []
    for policy, wanted in cases:
        d = _draft(make(), policy, ids)
        assert len(d.tokens) == 6, policy.describe()
        assert _computed(d.state) == wanted, policy.describe()
        for f in wanted:
            assert len(getattr(d.state, f)) == 6, (policy.describe(), f)
        drafts.append(d.tokens)
    # the argmax of the logits (no features) drafts what the argmax of q does
    assert all(t == drafts[0] for t in drafts), drafts


def test_siblings_make_the_drafter_compute_what_it_prices_them_with(close):
    """Ouroboros' sibling branches read ``q(d_i)`` and the draft's second choice and its probability, whatever the
    policy reads."""
    backend = TransformersBackend(close.draft_info.model)
    drafter = PhraseDrafter(backend, close.vocab, PhraseOptions(warm_start=False, siblings=2))
    d = _draft(drafter, FixedPolicy(gamma=6), close.encode("def f(x):\n    return x"))
    assert _computed(d.state) == {"prob", "second_prob", "second_token"}
    assert len(d.state.second_token) == len(d.tokens) == 6


def _rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = [torch.softmax(torch.randn(5000, generator=g) * s, -1) for s in (0.5, 3.0, 9.0)]
    tied = torch.zeros(300)
    tied[[7, 40, 41]] = torch.tensor([0.4, 0.4, 0.2])  # equal top two: the first of equals is the top
    peaked = torch.zeros(64)
    peaked[63] = 1.0  # the top last; every other probability exactly 0 (the entropy's log of 0)
    return [*rows, tied, peaked, torch.tensor([1.0]), torch.tensor([0.25, 0.75])]


@pytest.mark.parametrize("i", range(7))
def test_the_numpy_features_equal_the_torch_ones(i):
    q = _rows()[i]
    for x in {0, int(q.argmax()), q.numel() - 1}:
        fast, slow = DraftState(), DraftState()
        token_features(q, x, fast)  # a float32 CPU row: numpy
        prob, top, second, entropy, alt = _features_torch(q, x)
        slow.prob, slow.top_prob, slow.second_prob, slow.entropy = [prob], [top], [second], [entropy]
        for f in ("prob", "top_prob", "second_prob", "entropy"):
            assert getattr(fast, f) == pytest.approx(getattr(slow, f), rel=1e-5, abs=1e-6), (i, x, f)
        if q.numel() > 1 and second > 0 and q.tolist().count(second) == 1:  # a unique second: the same id
            assert fast.second_token == [alt], (i, x)
        assert q.numel() == 1 or q[fast.second_token[0]] == second
        assert fast.top_prob[0] >= fast.second_prob[0] and fast.second_token[0] != int(q.argmax()) or q.numel() == 1
    tied = _rows()[3]
    s = DraftState()
    token_features(tied, 7, s)
    assert (s.top_prob, s.second_prob, s.second_token) == ([pytest.approx(0.4)], [pytest.approx(0.4)], [40])
    assert s.entropy == [pytest.approx(-(2 * 0.4 * math.log(0.4) + 0.2 * math.log(0.2)), rel=1e-5)]
    s = DraftState()
    token_features(torch.tensor([0.3, 0.4, 0.3]), 1, s)  # equal seconds either side of the top: the first
    assert s.second_token == [0] and s.second_prob == [pytest.approx(0.3)]


def _logit_rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    rows = [torch.randn(5000, generator=g) * s for s in (0.5, 3.0, 9.0)]
    tied = torch.full((300,), -5.0)
    tied[[7, 40]] = 2.0  # equal top two: the first of equals is the top
    masked = torch.randn(400, generator=g)
    masked[100:] = float("-inf")  # a padded vocabulary (TokenDrafter.align)
    return [*rows, tied, masked, torch.tensor([3.0]), torch.tensor([0.0, 1.0])]


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("i", range(7))
@pytest.mark.parametrize("asked", [DRAFT_FEATURES, frozenset({"prob"}), frozenset({"top_prob", "entropy"})])
def test_features_from_the_logits_equal_those_from_q(i, asked, native, monkeypatch):
    """A greedy draft passes its logits row, not ``q``: the features read from it (one pass of pacer.native's
    kernel, or numpy's exponential into a reused buffer) are those of ``q = softmax(logits)``, asked for or not,
    masked ids and ties included."""
    from pacer import native as nat

    if native:
        assert nat.row_stats_kernel() is not None or nat._compiler() is None  # built wherever a compiler is
        if nat.row_stats_kernel() is None:
            pytest.skip("no C compiler here: numpy's path only")
    else:
        monkeypatch.setitem(nat._state, "kernels", None)
    logits = _logit_rows()[i]
    q = torch.softmax(logits, -1)
    assert softmax_stats(logits.numpy(), entropy=True) is not None  # numpy's path, masked ids included
    for x in {0, int(logits.argmax()), logits.numel() - 1}:
        fast, slow = DraftState(), DraftState()
        token_features(None, x, fast, features=asked, logits=logits)
        token_features(q, x, slow, features=asked)
        assert _computed(fast) == _computed(slow)
        # within the kernel's bound (pacer.native: its sums' relative error on any instruction set; the entropy's
        # absolute error is (1 + 2|s|/z) times it, |s|/z <= log V) beside float32 softmax's own rounding
        rel = nat.RELATIVE_BOUND + 1e-6
        for f in asked:
            tol = {"entropy": {"abs": rel * (1 + 2 * math.log(logits.numel() + 1))}}.get(f, {"abs": 1e-6})
            assert getattr(fast, f) == pytest.approx(getattr(slow, f), rel=rel, **tol), (i, x, f)
    reduced = DraftState()  # a reduced head's row: x at ``index`` among ``ids``
    ids = torch.arange(logits.numel()) * 3
    token_features(None, int(ids[-1]), reduced, index=logits.numel() - 1, ids=ids, logits=logits)
    assert reduced.prob == [pytest.approx(float(q[-1]), rel=nat.RELATIVE_BOUND + 1e-6, abs=1e-7)]
    if logits.numel() > 1:
        assert reduced.second_token[0] % 3 == 0 and reduced.second_token[0] // 3 != int(logits.argmax())

    for ask in (asked, frozenset()):  # x = None: the row's argmax, found by the same read (the greedy draft token)
        drawn = DraftState()
        assert token_features(None, None, drawn, features=ask, logits=logits) == int(logits.argmax())
        assert drawn.tokens == [int(logits.argmax())]
        if ask:
            want = DraftState()
            token_features(None, int(logits.argmax()), want, features=ask, logits=logits)
            assert all(getattr(drawn, f) == getattr(want, f) for f in ask)
        on_ids = DraftState()
        assert token_features(None, None, on_ids, ids=ids, features=ask, logits=logits) == 3 * int(logits.argmax())


def test_features_are_appended_only_where_asked():
    q = _rows()[1]
    for asked in (frozenset(), frozenset({"entropy"}), frozenset({"second_token"}), DRAFT_FEATURES):
        s = DraftState()
        token_features(q, 3, s, features=asked)
        assert s.tokens == [3]
        assert _computed(s) == set(asked)
    s = DraftState()
    token_features(None, 3, s, features=frozenset())  # no q at all where nothing is read
    assert s.tokens == [3] and not _computed(s)


def test_argmax_is_torchs():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(4, 1000, generator=g)
    t[1, [5, 9]] = 50.0  # a tie: the first
    t[2, 17] = float("nan")  # a NaN counts as the maximum
    t[3] = 0.0
    assert argmax(t) == t.argmax(-1).tolist() == [int(t[0].argmax()), 5, 17, 0]
    assert argmax(t[1]) == 5 and isinstance(argmax(t[1]), int)
    b = t.to(torch.bfloat16)  # another dtype: torch's own
    assert argmax(b) == b.argmax(-1).tolist()


def test_the_target_state_equals_a_float64_reference():
    """The target's entropy and top-2 margin (the layer's target-state features), numpy's path (a row with masked
    logits too), against float64."""
    from pacer.sampling import target_state

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 20000, generator=g) * 3
    logits[1, 11] = 40.0  # near-certain
    logits[2] = 0.0
    logits[2, 3] = 1.0
    logits[3, [4, 8]] = 30.0  # a tie at the top: margin 0
    for rows in (logits, torch.cat([logits, torch.full((1, 20000), float("-inf"))]).clone()):
        if not torch.isfinite(rows).all():
            rows[-1, :5] = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0])
        logp = torch.log_softmax(rows.double(), -1)
        p = logp.exp()
        want_h = (-(p * logp.nan_to_num(neginf=0.0)).sum(-1)).tolist()
        top2 = p.topk(2, -1).values
        want_m = (top2[:, 0] - top2[:, 1]).tolist()
        h, m = target_state(rows)
        assert h == pytest.approx(want_h, rel=1e-4, abs=1e-6)
        assert m == pytest.approx(want_m, rel=1e-4, abs=1e-6)

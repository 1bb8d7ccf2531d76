"""Each draft-length rule's stopping decision on hand-made draft states (direction of every threshold included),
the labels the collection records for a hand-computed round, and where the pre-verifier reads a block's survival:
the tests that an inverted or shifted rule fails (exactness tests cannot: a wrong length stays lossless)."""

from __future__ import annotations

import math

import pytest
import torch

from pacer.policies import ConfidencePolicy, DraftState, EntropyPolicy, FixedPolicy, HeuristicPolicy, RoundResult
from pacer.preverify.collect import Recorder
from pacer.preverify.features import TARGET_SCALARS, FeatureSpec
from pacer.preverify.layer import PreVerifier


def state(top=(), entropy=(), prob=None) -> DraftState:
    n = max(len(top), len(entropy))
    top = list(top) or [0.9] * n
    entropy = list(entropy) or [0.1] * n
    return DraftState(tokens=list(range(n)), prob=list(prob or top), top_prob=top, entropy=entropy)


def test_confidence_stops_once_the_top_probability_falls_below_the_threshold():
    p = ConfidencePolicy(threshold=0.5)
    assert p.should_continue(state())  # nothing drafted yet: always go on
    assert p.should_continue(state(top=[0.2, 0.9]))  # only the last token counts
    assert p.should_continue(state(top=[0.9, 0.5]))  # at the threshold: go on
    assert not p.should_continue(state(top=[0.9, 0.49]))
    assert ConfidencePolicy(threshold=None).should_continue(state(top=[0.01]))  # no threshold: the cost rule decides
    assert p.survival(state(top=[0.9, 0.5])) == pytest.approx(0.45)


def test_entropy_stops_once_the_entropy_exceeds_the_threshold():
    p = EntropyPolicy(threshold=1.0)
    assert p.should_continue(state())
    assert p.should_continue(state(entropy=[3.0, 0.2]))
    assert p.should_continue(state(entropy=[0.2, 1.0]))  # at the threshold: go on
    assert not p.should_continue(state(entropy=[0.2, 1.01]))
    assert p.survival(state(entropy=[0.5, 0.25])) == pytest.approx(math.exp(-0.75))


def test_heuristic_grows_by_two_after_a_full_round_and_shrinks_by_one_otherwise():
    p = HeuristicPolicy(gamma=3, min_draft=1, max_draft=6)
    assert p.should_continue(state(top=[0.9] * 2)) and not p.should_continue(state(top=[0.9] * 3))
    p.update(state(top=[0.9] * 3), RoundResult(3, 3))
    assert p.gamma == 5
    p.update(state(top=[0.9] * 5), RoundResult(5, 5))
    assert p.gamma == 6  # capped at max_draft
    p.update(state(top=[0.9] * 6), RoundResult(6, 2))
    assert p.gamma == 5
    for _ in range(8):
        p.update(state(top=[0.9]), RoundResult(1, 0))
    assert p.gamma == 1  # floored at 1
    p.update(DraftState(), RoundResult(0, 0))  # a round that drafted nothing changes nothing
    assert p.gamma == 1
    p.reset()
    assert p.gamma == 3


def test_fixed_drafts_exactly_gamma():
    p = FixedPolicy(gamma=4)
    assert [p.should_continue(state(top=[0.5] * n)) for n in range(6)] == [True] * 4 + [False] * 2


def test_collected_labels_match_a_hand_computed_round():
    """Round: 5 draft tokens, the first 2 accepted. ``accepted`` = d_i and all before it accepted (i <= n);
    ``cond_valid`` = all before it accepted (i <= n + 1); positions 1-based; the history features see the rounds
    before this one only."""
    spec = FeatureSpec(hidden_layers=(-1,), hidden_size=4, max_draft=5)
    rec = Recorder(spec=spec)
    s = state(top=[0.9, 0.8, 0.7, 0.6, 0.5])
    s.hidden = [torch.full((4,), float(i)) for i in range(5)]
    rec.update(s, RoundResult(5, 2, soft=[1.0, 0.9, 0.3, 0.2, 0.1], target_entropy=[0.5, 1.0, 3.0],
                              target_margin=[0.8, 0.2, 0.4]))
    rec.update(s, RoundResult(5, 5, soft=[1.0] * 5))
    out = rec.take()
    assert out["accepted"][:5].tolist() == [1, 1, 0, 0, 0] and out["accepted"][5:].tolist() == [1] * 5
    assert out["cond_valid"][:5].tolist() == [1, 1, 1, 0, 0]
    assert out["position"][:5].tolist() == [1, 2, 3, 4, 5]
    assert out["round"].tolist() == [0] * 5 + [1] * 5
    assert out["soft"][:5].tolist() == pytest.approx([1.0, 0.9, 0.3, 0.2, 0.1])
    assert out["hidden"][3].tolist() == [3.0] * 4  # d_4's own hidden state
    prev = spec.scalar_names.index("prev_ratio")
    assert out["scalars"][0, prev] == 1.0 and out["scalars"][5, prev] == pytest.approx(2 / 5)
    # the target-state scalars: defaults before the first verification, then the previous round's target - the
    # bonus position is the last value, the mean and the min run over the accepted positions and the bonus
    col = {name: spec.scalar_names.index(name) for name in TARGET_SCALARS}
    first = {name: float(out["scalars"][0, c]) for name, c in col.items()}
    assert first == {"t_entropy": 0.0, "t_margin": 1.0, "t_entropy_mean": 0.0, "t_margin_min": 1.0,
                     "prev_accepted": 1.0}
    second = {name: float(out["scalars"][7, c]) for name, c in col.items()}
    assert second == pytest.approx({"t_entropy": 3.0, "t_margin": 0.4, "t_entropy_mean": 1.5, "t_margin_min": 0.2,
                                    "prev_accepted": 2 / 5})
    assert rec.needs_target_state and not FixedPolicy(gamma=4).needs_target_state


def test_a_block_score_is_the_survival_through_the_block_last_token():
    """With the block head at zero the layer's block logit is exactly logit(Π σ(c_i)) over the draft up to the
    block's *last* token."""
    torch.manual_seed(0)
    layer = PreVerifier(hidden_dim=4, n_scalars=3, block_size=2, d=8, max_draft=8).eval()
    c = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])

    class Fixed(torch.nn.Module):
        def forward(self, z):
            return c[: z.shape[1]].expand(z.shape[0], -1)[..., None]

    layer.token_head = Fixed()
    with torch.no_grad():
        _, blk = layer(torch.randn(1, 6, 4), torch.randn(1, 6, 3))
    survival = torch.sigmoid(c).cumprod(0)
    assert torch.sigmoid(blk[0]).tolist() == pytest.approx(survival[[1, 3, 5]].tolist(), rel=1e-5)


def test_cumprob_stops_once_the_product_of_draft_probabilities_falls_below_the_threshold():
    from pacer.policies import CumProbPolicy, DraftState

    pol = CumProbPolicy(threshold=0.5, min_draft=1, max_draft=8)
    st = DraftState()
    assert pol.should_continue(st)  # nothing drafted yet
    for p in (0.9, 0.8, 0.7):  # products 0.9, 0.72, 0.504: all at or above 0.5
        st.prob.append(p)
        st.tokens.append(1)
        assert pol.should_continue(st)
    assert pol.survival(st) == pytest.approx(0.9 * 0.8 * 0.7)
    st.prob.append(0.9)
    st.tokens.append(1)
    assert not pol.should_continue(st)  # 0.4536 < 0.5
    assert CumProbPolicy(threshold=None).should_continue(st)  # under the cost rule: its survival decides
    with pytest.raises(Exception, match="cumprob threshold"):
        CumProbPolicy(threshold=1.5)

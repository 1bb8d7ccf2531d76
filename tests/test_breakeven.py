"""The break-even acceptance of a cost curve (pacer.breakeven): the α at which drafting costs what plain decoding
does, and the ceiling of a draft the target always accepts."""

from __future__ import annotations

import pytest

from pacer.breakeven import break_even, describe, tokens_per_round


def test_one_drafted_token_on_a_known_curve():
    """γ = 1 with a free draft and c_t(2) = 1.5 c_t(1): the round costs 1.5 plain steps, so it must commit 1.5
    tokens: 1 + α = 1.5."""
    be = break_even(0.0, lambda k: 1.0 if k == 1 else 1.5, max_gamma=1)
    assert be is not None and be.gamma == 1 and be.alpha == pytest.approx(0.5, abs=1e-9)
    assert be.ceiling == pytest.approx(2 / 1.5) and be.draft_ratio == 0


def test_the_break_even_costs_what_plain_decoding_does():
    """At the α returned, the best γ's round costs per token exactly what a plain step does; the smallest α over
    γ is taken (a flat curve pays at a lower acceptance with a longer draft)."""
    c_d, c_t = 0.1, (lambda k: 1.0 + 0.05 * (k - 1))
    be = break_even(c_d, c_t)
    cost = be.gamma * c_d + c_t(be.gamma + 1)
    assert tokens_per_round(be.alpha, be.gamma) == pytest.approx(cost / c_t(1), rel=1e-9)
    for g in range(1, 17):
        assert break_even(c_d, c_t, max_gamma=g).alpha >= be.alpha - 1e-12


def test_a_steep_curve_or_a_dear_draft_cannot_pay():
    assert break_even(0.0, lambda k: float(k)) is None  # scoring k tokens costs k plain steps
    assert break_even(1.0, lambda k: 1.0) is None  # a draft token as dear as a plain step
    assert describe(0.5, lambda k: float(k)).startswith("no draft pays on this curve")
    assert describe(0.05, lambda k: 1.0).startswith("drafting pays once the target accepts")


def test_a_dearer_draft_needs_more_acceptance_and_caps_lower():
    def c_t(k):
        return (1.0 + 0.1 * (k - 1))
    cheap, dear = break_even(0.05, c_t), break_even(0.43, c_t)
    assert dear.alpha > cheap.alpha and dear.ceiling < cheap.ceiling

"""What would make drafting pay on a measured cost curve: the break-even acceptance.

A round drafts γ tokens, one draft forward each (``c_d``), and the target scores them with the last committed token
in one forward (``c_t(γ + 1)``). With every drafted token accepted with probability α, independently, the round
commits ``1 + α + ... + α^γ`` tokens; plain decoding commits one per ``c_t(1)``. Drafting γ tokens breaks even at
the α where the two cost the same per token; the *break-even acceptance* is the smallest such α over γ. A draft whose
tokens the target accepts less often than that cannot pay on this machine, whatever the length rule.
``pacer calibrate`` prints it for the machine's own curve; ``docs/results.md`` tabulates it for the shipped profiles.

>>> be = break_even(0.0, lambda k: 1.0 if k == 1 else 1.5, max_gamma=1)  # a free draft, c_t(2) = 1.5 c_t(1)
>>> round(be.alpha, 3), be.gamma
(0.5, 1)
>>> break_even(0.5, lambda k: float(k)) is None  # scoring k tokens costs k plain steps: no acceptance pays
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: the longest draft whose break-even is searched (pacer's drafts stop at 16 tokens a round)
MAX_GAMMA = 16


@dataclass(frozen=True)
class BreakEven:
    """``alpha``: the smallest per-token acceptance at which drafting pays, reached at draft length ``gamma``;
    ``ceiling``: the speedup over plain decoding of a draft whose every token is accepted, at its best γ (the most
    any length rule can reach with this draft on this curve); ``draft_ratio``: ``c_d / c_t(1)``."""

    alpha: float
    gamma: int
    ceiling: float
    draft_ratio: float

    def describe(self) -> str:
        return (f"drafting pays once the target accepts a drafted token with probability above {self.alpha:.2f} "
                f"(break-even at γ = {self.gamma}); a draft token costs {self.draft_ratio:.2f} of a plain step, so "
                f"even a draft the target always accepts reaches at most {self.ceiling:.2f}x plain decoding here")


def tokens_per_round(alpha: float, gamma: int) -> float:
    """``1 + α + ... + α^γ``: the tokens a round of γ drafted tokens commits, each accepted with probability α."""
    return sum(alpha**i for i in range(gamma + 1))


def break_even(c_d: float, c_t: Callable[[int], float], max_gamma: int = MAX_GAMMA) -> BreakEven | None:
    """The break-even acceptance of the curve ``c_t(k)`` (seconds of a target forward scoring ``k`` tokens) with a
    draft token costing ``c_d``; ``None`` where no acceptance below 1 pays at any γ up to ``max_gamma``."""
    plain = c_t(1)
    best: tuple[float, int] | None = None
    for gamma in range(1, max_gamma + 1):
        need = (gamma * c_d + c_t(gamma + 1)) / plain  # tokens a round must commit to cost what plain decoding does
        if need >= gamma + 1:
            continue
        lo, hi = 0.0, 1.0
        for _ in range(60):  # tokens_per_round rises with α: bisection
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tokens_per_round(mid, gamma) < need else (lo, mid)
        if best is None or hi < best[0]:
            best = (hi, gamma)
    if best is None:
        return None
    ceiling = max((g + 1) * plain / (g * c_d + c_t(g + 1)) for g in range(1, max_gamma + 1))
    return BreakEven(best[0], best[1], ceiling, c_d / plain)


def describe(c_d: float, c_t: Callable[[int], float]) -> str:
    """One line for ``pacer calibrate``: the break-even acceptance, or why no draft pays."""
    be = break_even(c_d, c_t)
    if be is None:
        return (f"no draft pays on this curve: even a draft the target always accepts is slower than plain decoding "
                f"(a draft token costs {c_d / c_t(1):.2f} of a plain step)")
    return be.describe()

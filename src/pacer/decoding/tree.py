"""One round's proposal, :class:`Draft`, and its verification as a token tree (Ouroboros candidate branches)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..rounds import DraftState
from ..sampling import argmax
from .backend import Tree


@dataclass
class Draft:
    """One round's proposal: ``tokens`` (``d_1..d_γ``), ``q`` (``[γ, V]``, sampling only), the policy state
    and the number of draft forwards it took.

    ``branches`` (greedy only, e.g. Ouroboros candidate phrases): alternative continuations that the target
    verifies in the same forward as ``d_1..d_γ``, as a tree. Branch ``j`` follows ``d_1..d_a`` with
    ``a = anchors[j]`` (``γ`` when ``anchors`` is empty: a continuation after the whole draft; ``a < γ``: a
    *sibling* of ``d_{a+1}``, e.g. the draft's second choice there): its tokens attend to the cache, the pending
    tokens, ``d_1..d_a`` and their own branch prefix, with positions going on after ``d_a`` (:meth:`tree_inputs`).
    If exactly ``a`` draft tokens are accepted, the longest prefix of a branch anchored there that matches the
    target becomes ``extension`` (:meth:`accept_branch`) and is committed after ``d_a``. The target's cache is
    cropped to the accepted main draft as usual; extension tokens are re-fed with the next round's forward. The
    policy only ever sees the main draft (``state``, ``γ``, ``n``); the round's stats count the extension as
    drafted and accepted.
    """

    tokens: list[int]
    q: torch.Tensor | None
    state: DraftState
    policy_time: float = 0.0
    forwards: int = 0
    branches: list[list[int]] = field(default_factory=list)
    #: per branch, how many main-draft tokens it follows (empty: every branch follows all ``γ``)
    anchors: list[int] = field(default_factory=list)
    extension: list[int] = field(default_factory=list)
    branch: int = -1
    #: the row of the verification's logits that gave the round's last committed token, when a branch extended
    #: the round (:meth:`accept_branch`; -1: none did, the row is ``n``)
    bonus_row: int = -1
    #: seconds of the drafter's own bookkeeping in this proposal (a phrase pool's lookups and learning)
    pool_time: float = 0.0
    #: the drafter's estimate of the accepted tokens per branch token, passed to the generation's pricer that sizes
    #: the branches (:meth:`pacer.pricing.Pricer.branch_room`; ``None``: the pricer's own)
    branch_yield: float | None = None
    #: the branch tokens after ``d_γ`` the drafter sized itself with the generation's pricer (a phrase verified alone,
    #: a round's candidates): the loop scores them as they are (``None``: the loop asks the pricer, for a drafter
    #: that leaves its branches unsized)
    branch_total: int | None = None

    #: the most unread tokens a tree forward may carry: a tree's mask covers every token of the forward, so over a
    #: prompt's prefill it takes the masked attention over the whole span (a 5,256-token prefill took 50.4 s as a
    #: tree against 37.6 s as a chain on a 2-core Zen 5); beyond this only the first branch after ``d_γ`` is kept,
    #: as a chain
    TREE_PENDING = 16

    def anchor(self, j: int) -> int:
        """How many main-draft tokens branch ``j`` follows."""
        return self.anchors[j] if self.anchors else len(self.tokens)

    def tree_inputs(self, pending: list[int], room: int, total: int | None = None,
                    siblings: bool = True) -> tuple[list[int], Tree | None]:
        """Target input ``pending + d_1..d_γ + branches`` (each branch cut to ``room`` tokens, none if
        ``room <= 0``; the branches after ``d_γ`` together to ``total`` tokens, in their order - siblings are
        priced by the drafter; ``siblings=False``: only the branches after ``d_γ``, for a backend that scores no
        other tree) and, with branches, its :class:`Tree`."""
        γ = len(self.tokens)
        kept = [(b[:room], self.anchor(j)) for j, b in enumerate(self.branches) if b and room > 0
                and (siblings or self.anchor(j) == γ)]
        if total is not None:
            cut, left = [], total
            for b, a in kept:
                if a == γ:
                    b = b[: max(left, 0)]
                    left -= len(b)
                if b:
                    cut.append((b, a))
            kept = cut
        if len(pending) > self.TREE_PENDING:
            kept = [(b, a) for b, a in kept if a == γ][:1]  # the first branch after d_γ alone, as a chain
        self.branches, self.anchors = [b for b, _ in kept], [a for _, a in kept]
        ids = pending + self.tokens
        if not self.branches:
            return ids, None
        if len(kept) == 1 and kept[0][1] == γ:  # one branch after d_γ: a causal chain, no tree mask needed
            return ids + kept[0][0], None
        main, n = len(ids), len(ids) + sum(len(b) for b in self.branches)
        attend = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # host data: the backend moves it
        attend[:main, :main] = torch.ones(main, main, dtype=torch.bool, device="cpu").tril()  # a causal main chain
        depth = list(range(main))
        for b, a in kept:
            o, k, seen = len(ids), len(b), len(pending) + a
            attend[o : o + k, :seen] = True  # a branch sees the pending tokens and d_1..d_a ...
            attend[o : o + k, o : o + k] = torch.ones(k, k, dtype=torch.bool, device="cpu").tril()  # ... its prefix
            depth += range(seen, seen + k)
            ids = ids + b
        return ids, Tree(attend, tuple(depth))

    def accept_branch(self, logits: torch.Tensor, start: int, n: int, x: int) -> int:
        """Greedy, ``n`` draft tokens accepted, ``x`` the target's token after ``d_n``; ``logits`` of the whole
        tree forward, branch rows from ``start``. Sets ``extension`` to the longest matching prefix of a branch
        anchored at ``n`` and returns the target's token after it (``x`` when no branch matches); ``bonus_row``: the
        row of ``logits`` that gave that token where a branch matched."""
        am = argmax(logits[start:])
        best, bonus, o = 0, x, 0
        for j, b in enumerate(self.branches):
            m, nxt = 0, x
            while self.anchor(j) == n and m < len(b) and b[m] == nxt:
                nxt = am[o + m]
                m += 1
            if m > best:
                best, bonus, self.branch, self.bonus_row = m, nxt, j, start + o + m - 1
            o += len(b)
        self.extension = self.branches[self.branch][:best] if best else []
        return bonus

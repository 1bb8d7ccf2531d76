"""One round's proposal, :class:`Draft`, and its verification as a token tree (Ouroboros candidate branches)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..policies.base import DraftState
from .backend import Tree


@dataclass
class Draft:
    """One round's proposal: ``tokens`` (``d_1..d_γ``), ``q`` (``[γ, V]``, sampling only), the policy state
    and the number of draft forwards it took.

    ``branches`` (greedy only, e.g. Ouroboros candidate phrases): alternative continuations after ``d_γ``
    that the target verifies in the same forward as ``d_1..d_γ``, as a tree: a branch token attends to the
    cache, the main chain and its own branch prefix, with positions going on after ``d_γ``
    (:meth:`tree_inputs`). If all ``γ`` draft tokens are accepted, the longest matching branch prefix becomes
    ``extension`` (:meth:`accept_branch`) and is committed after ``d_γ``. The target's cache is cropped to the
    main draft as usual; extension tokens are re-fed with the next round's forward. The policy only ever sees
    the main draft (``state``, ``γ``, ``n``); the round's stats count the extension as drafted and accepted.
    """

    tokens: list[int]
    q: torch.Tensor | None
    state: DraftState
    policy_time: float = 0.0
    forwards: int = 0
    branches: list[list[int]] = field(default_factory=list)
    extension: list[int] = field(default_factory=list)
    branch: int = -1
    #: seconds of the drafter's own bookkeeping in this proposal (a phrase pool's lookups and learning)
    pool_time: float = 0.0

    def tree_inputs(self, pending: list[int], room: int, total: int | None = None) -> tuple[list[int], Tree | None]:
        """Target input ``pending + d_1..d_γ + branches`` (each branch cut to ``room`` tokens, none if
        ``room <= 0``; all branches together to ``total`` tokens) and, with branches, its :class:`Tree`."""
        self.branches = [b[:room] for b in self.branches if b] if room > 0 else []
        if total is not None:
            kept, left = [], total
            for b in self.branches:
                if left <= 0:
                    break
                kept.append(b[:left])
                left -= len(kept[-1])
            self.branches = kept
        ids = pending + self.tokens
        if not self.branches:
            return ids, None
        main, n = len(ids), len(ids) + sum(len(b) for b in self.branches)
        attend = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # host data: the backend moves it
        attend[:, :main] = True  # every branch sees the whole main chain ...
        attend[:main, :main] = torch.ones(main, main, dtype=torch.bool, device="cpu").tril()  # ... which is causal
        depth = list(range(main))
        for b in self.branches:
            o, k = len(ids), len(b)
            attend[o : o + k, o : o + k] = torch.ones(k, k, dtype=torch.bool, device="cpu").tril()  # and its own prefix
            depth += range(main, main + k)
            ids = ids + b
        return ids, Tree(attend, tuple(depth))

    def accept_branch(self, logits: torch.Tensor, start: int, x: int) -> int:
        """Greedy, all ``γ`` accepted, ``x`` the target's token after ``d_γ``; ``logits`` of the whole tree
        forward, branch rows from ``start``. Sets ``extension`` to the longest matching branch prefix and
        returns the target's token after it (``x`` when no branch matches)."""
        am = logits[start:].argmax(-1).tolist()
        best, bonus, o = 0, x, 0
        for j, b in enumerate(self.branches):
            m, nxt = 0, x
            while m < len(b) and b[m] == nxt:
                nxt = am[o + m]
                m += 1
            if m > best:
                best, bonus, self.branch = m, nxt, j
            o += len(b)
        self.extension = self.branches[self.branch][:best] if best else []
        return bonus

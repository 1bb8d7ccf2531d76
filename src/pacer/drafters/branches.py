"""What a round verifies beside the draft (greedy): candidate branches and siblings, scored by the target in the
same forward as a token tree (:class:`pacer.decoding.tree.Draft`).

* **candidates** - continuations of the drafted context attached after ``d_γ`` (first the rest of a phrase the draft
  agreed with but the length rule cut; then the generation's own text where it has earned it, then pool
  continuations with distinct first tokens), each at most ``candidate_len`` tokens; where all ``γ`` draft tokens
  are accepted the longest matching branch extends the round;
* **siblings** - the draft's second choice beside a draft token, scored where the pricer says it pays
  (:meth:`pacer.pricing.Pricer.sibling_room`) at the hit rate the drafter learnt (:class:`SiblingRate`);
* **pool rounds** - a round whose draft model drafts nothing may still verify the pool's continuations of the
  committed text after the pending token, where the pricer prices them as paying (``branch_room(0)``).

Everything fits within ``tree_size`` tokens a verification (siblings take their room first).
"""

from __future__ import annotations

from ..decoding import Draft
from ..pricing import Pricer
from ..rounds import DraftState
from .pool import Key, PhrasePool
from .sources import SourceChoice

#: a candidate branch found in the generation's own text (:class:`pacer.drafters.sources.LookupIndex`), not the pool
LOOKUP = "lookup"
#: per branch scored, where it came from: a pool entry, :data:`LOOKUP`, or ``None`` (a phrase the draft agreed with)
Origin = tuple[Key, Key] | str | None


class SiblingRate:
    """How often the draft's second choice is the target's token where the target rejected its first choice,
    against the draft's own estimate of that, ``second / (1 - q)`` (optimistic: the draft's runner-up is not the
    target's): ``ratio`` (the hits over the estimates summed, shrunk towards ``PRIOR`` with ``WEIGHT`` estimated
    hits) scales the estimates a cost rule prices siblings with. Learnt from every greedy round with a rejection,
    whether a sibling was scored there or not, for the drafter's life (as its phrase pool)."""

    PRIOR, WEIGHT = 1.0, 2.0

    def __init__(self) -> None:
        self.estimated = self.hits = 0.0
        self.observations = 0

    @property
    def ratio(self) -> float:
        return (self.hits + self.PRIOR * self.WEIGHT) / (self.estimated + self.WEIGHT)

    def hits_of(self, raw: list[float]) -> list[float]:
        """The learnt chance per position that the sibling is the target's token, from the draft's estimates."""
        r = self.ratio
        return [min(1.0, r * h) for h in raw]

    def update(self, raw: float, hit: bool) -> None:
        self.estimated += raw
        self.hits += hit
        self.observations += 1


def sibling_estimates(st: DraftState) -> list[float]:
    """The draft's estimate per drafted position ``i`` that its second choice is the target's token, given that
    the target rejects its first: ``second_prob[i] / (1 - prob[i])``."""
    return [min(1.0, st.second_prob[i] / max(1.0 - st.prob[i], 1e-6)) for i in range(len(st.second_token))]


class Branches:
    """Builds a round's branches (see the module docstring): ``candidates`` continuations (0: none) of at most
    ``candidate_len`` tokens, at most ``siblings`` siblings, within ``tree_size`` tokens a verification (``None``:
    no cap); ``choice``: where the drafter chooses sources, whose evidence leads and prices the branches."""

    def __init__(self, pool: PhrasePool, candidates: int, candidate_len: int, siblings: int,
                 tree_size: int | None, choice: SourceChoice | None) -> None:
        self.pool, self.candidates, self.candidate_len = pool, candidates, candidate_len
        self.siblings, self.tree_size, self.choice = siblings, tree_size, choice
        self.sibling_rate = SiblingRate()

    def after_draft(self, tokens: list[int], draft: Draft, pricer: Pricer, leftover: list[int]) -> list[Origin]:
        """Candidate continuations after ``d_γ`` (``leftover`` first: drafted tokens the length rule cut) and
        siblings where ``pricer`` prices them as paying, set on ``draft``; returns each branch's origin (siblings
        are last and have none)."""
        ctx = tokens + draft.tokens
        γ = len(draft.tokens)
        left = self.tree_size - 1 - γ if self.tree_size else 1 << 30  # 1: the pending token
        st = draft.state
        sib: list[int] = []
        if self.siblings and len(st.second_token) == γ:
            hits = self.sibling_rate.hits_of(sibling_estimates(st))
            sib = sorted(pricer.sibling_room(st, hits)[: min(self.siblings, max(left, 0))])
        left -= len(sib)
        found: list[tuple[Origin, list[int]]] = []
        if leftover and self.candidates:
            found.append((None, leftover))
        firsts = {b[0] for _, b in found}
        if self.candidates > len(found):
            found += [(kc, list(kc[1])) for kc in self.pool.lookup(ctx, self.candidates - len(found), firsts)]
        kind = next((("pool", len(kc[0])) for kc, _ in found if kc is not None), None)
        if self.choice is not None and self.candidates and not leftover:
            ev = self.choice.evidence
            k, cont = self.choice.index.find(ctx)  # the generation's own text, the prompt first, where it earned it
            if cont and (kind is None or ev.accept(("lookup", k), 1)[0] >= ev.accept(kind, 1)[0]):
                found = [(LOOKUP, list(cont))] + [f for f in found if f[1][0] != cont[0]]
                found, kind = found[: self.candidates], ("lookup", k)
        branches, keys = self.fit(found, left)
        if self.choice is not None and keys and keys[0] is not None and kind is not None:
            draft.branch_yield = self.choice.evidence.branch_yield(kind, self.candidate_len)  # this generation's
        # siblings last: where the loop drops them (a backend without such trees), the others keep their index
        draft.branches = branches + [[st.second_token[i]] for i in sib]
        draft.anchors = [γ] * len(branches) + sib
        return keys

    def for_pool_round(self, tokens: list[int], draft: Draft) -> list[Origin]:
        """A round whose draft model drafts nothing, where the pricer prices pool continuations as paying: up to
        ``candidates`` continuations of the committed text from the pool, verified after the pending token (one
        alone is a chain), set on ``draft``; returns their pool entries. No draft forward."""
        left = self.tree_size - 1 if self.tree_size else 1 << 30
        branches, keys = self.fit([(kc, kc[1]) for kc in self.pool.lookup(tokens, self.candidates)], left)
        draft.branches, draft.anchors = branches, [0] * len(branches)
        return keys

    def pool_yield(self, tokens: list[int]) -> float | None:
        """This generation's evidence of what the pool's continuation of ``tokens`` yields per token scored
        (``None``: not choosing sources, the pricer's own yield)."""
        if self.choice is None:
            return None
        found = self.pool.lookup(tokens, 1)
        kind = ("pool", len(found[0][0])) if found else ("pool", 1)
        return self.choice.evidence.branch_yield(kind, self.candidate_len)

    def fit(self, found: list, left: int) -> tuple[list[list[int]], list[Origin]]:
        """The ``(origin, tokens)`` continuations in ``found``, each cut to ``candidate_len`` and all together to
        ``left`` tokens: ``(branches, their origins)``."""
        branches: list[list[int]] = []
        keys: list[Origin] = []
        for kc, b in found:
            b = list(b[: min(self.candidate_len, left)])
            if b:
                branches.append(b)
                keys.append(kc)
                left -= len(b)
        return branches, keys

"""Ouroboros-style phrase drafting: the draft model checks phrases from a pool in one forward, a round may verify a
phrase alone, and candidate branches and siblings are verified beside the draft.

Its parts, each in its own home:

* the **phrase pool** (:mod:`pacer.drafters.pool`): n-grams of the prompt, the output, the target's tokens past a
  rejection and the draft's own guesses, shared across generations (warm start);
* the **sources and their evidence** (:mod:`pacer.drafters.sources`): per round, the draft model or a phrase
  verified alone (a *phrase round*), by what each source earned in this generation and the pricer's rates;
* the **branches** (:mod:`pacer.drafters.branches`): candidate continuations after ``d_γ``, siblings, and the pool's
  continuations in a round that drafts nothing;
* this **drafter** (:class:`PhraseDrafter`), which drafts phrase by phrase, with its options in one object
  (:class:`PhraseOptions`).

**Phrase-by-phrase drafting** (greedy). When the pool has a continuation for the current draft context, the draft
checks the whole phrase in one forward (on a CPU a forward over 8 tokens costs about one over 1), keeps the prefix
that equals its own argmax plus its own next token, and asks the policy before each kept token exactly as
token-by-token drafting would (features - ``prob``, ``top_prob``, ``entropy``, hidden states - come from the forward
that checked the token; ``phrase=True`` marks pool tokens). The drafted tokens are therefore the draft's own greedy
tokens: only the number of draft forwards changes. Without a phrase it drafts one token per forward. How much of a
phrase to check is priced by the generation's pricer (:meth:`pacer.pricing.Pricer.phrase_room`) from how often the
draft agreed with phrases of the same *kind* of entry (its source and key length;
:meth:`pacer.drafters.pool.PhrasePool.agreement`).

**Sampling mode**: phrase drafting would only be lossless with ``q`` the distribution each token was drawn from;
this drafter keeps it simple and correct - with ``temperature > 0`` it drafts token by token exactly like
:class:`~pacer.drafters.token.TokenDrafter` (same random draws, so the same output as ``sd`` for a seed) and
proposes no branches. The pool still learns from the prompt and output.

A round that drafts nothing does no pool work at all, unless the pricer prices a pool round as paying.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..decoding import Draft, ModelBackend, Proposal
from ..errors import PacerError
from ..pricing import UNPRICED, Pricer
from ..rounds import DraftState
from ..sampling import argmax
from .branches import LOOKUP, Branches, Origin, sibling_estimates
from .pool import SOURCES, PhrasePool, learn_committed, rejection_phrase, shared_pool
from .sources import LOOKUP_LEN, SourceChoice
from .token import TokenDrafter


@dataclass(frozen=True)
class PhraseOptions:
    """The phrase drafter's options (registered in :mod:`pacer.methods.phrase`: ``Decoder.generate(options=...)``
    keys, ``pacer bench`` keys, CLI flags), checked once here.

    ``ngram`` phrase (continuation) length; ``pool_size`` pool capacity in entries; ``candidates`` candidate
    branches per round (0: none); ``candidate_len`` longest branch (default ``ngram``); ``key_len`` longest key;
    ``sources`` the pool sources used (a subset of ``prompt,output,verify,lookahead``; a comma string works);
    ``warm_start`` share the pool across generations; ``pool_file`` load/save the pool; ``phrases`` draft phrase by
    phrase (False: token by token, e.g. to measure candidates alone); ``pool_tag`` keeps one method's warm pool from
    another's; ``tree_size`` most tokens one verification may score with the branches (``None``/0: no cap): a target
    forward costs about the same for 1..8-10 tokens on a CPU and clearly more beyond; ``siblings`` most sibling
    branches per round; ``choose`` (greedy, under a cost model) per round the draft model, a phrase verified alone or
    both, by predicted payoff (:mod:`pacer.drafters.sources`); ``lookup_len`` the longest phrase a round verifies
    alone."""

    ngram: int = 6
    pool_size: int = 20000
    candidates: int = 2
    candidate_len: int | None = None
    key_len: int = 2
    sources: str | tuple[str, ...] | list[str] = SOURCES
    warm_start: bool = True
    pool_file: str | Path | None = None
    phrases: bool = True
    pool_tag: str = ""
    tree_size: int | None = 10
    siblings: int = 0
    choose: bool = True
    lookup_len: int = LOOKUP_LEN

    def __post_init__(self) -> None:
        sources = self.sources
        if isinstance(sources, str):
            sources = tuple(s.strip() for s in sources.replace("+", ",").split(",") if s.strip())
        if bad := [s for s in sources if s not in SOURCES]:
            raise PacerError(f"unknown phrase source(s) {', '.join(bad)}; choose from {', '.join(SOURCES)}")
        object.__setattr__(self, "sources", tuple(sources))
        if self.candidate_len is None:
            object.__setattr__(self, "candidate_len", self.ngram)
        if self.candidates < 0 or self.candidate_len < 1 or self.siblings < 0 or self.lookup_len < 1:
            raise PacerError(f"candidates and siblings must be >= 0 (got {self.candidates}, {self.siblings}), "
                             f"candidate_len and lookup_len >= 1")
        object.__setattr__(self, "tree_size", int(self.tree_size) if self.tree_size else None)


class PhraseTally:
    """What a phrase drafter did in a generation (:meth:`report`: ``GenerationResult.extra["drafter"]``)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.phrase_hits: Counter = Counter()  # draft phrases with >= 1 kept token, by the entry's source
        self.candidate_hits: Counter = Counter()  # accepted branches, by source (``leftover``: cut phrase)

    def phrase_checked(self, kept: int, hit: str | None) -> None:
        """A phrase the draft checked in a forward: ``kept`` of its tokens drafted; ``hit``: the pool entry's
        source where the draft agreed with its first token."""
        self.counts["phrase_forwards"] += 1
        self.counts["phrase_tokens"] += kept
        if hit is not None:
            self.phrase_hits[hit] += 1

    def observe(self, draft: Draft, phrase_round: bool, origins: list[Origin], pool: PhrasePool) -> None:
        """What a verified round's phrases and branches did (``origins``: each branch's, a pool entry touched where
        it was accepted)."""
        c = self.counts
        if phrase_round:  # a phrase verified alone (SourceChoice)
            c["phrase_round_tokens"] += sum(len(b) for b in draft.branches)
            c["phrase_round_accepted"] += len(draft.extension)
            if draft.extension and origins and origins[0] is not None:
                self.candidate_hits[pool.touch(*origins[0])] += 1
        elif not draft.tokens:  # a round of pool continuations alone (Branches.for_pool_round)
            if draft.branches:
                c["pool_rounds"] += 1
                c["pool_tokens"] += sum(len(b) for b in draft.branches)
                c["pool_accepted_tokens"] += len(draft.extension)
                if draft.extension and 0 <= draft.branch < len(origins):
                    self.candidate_hits[pool.touch(*origins[draft.branch])] += 1
        elif draft.branches:
            c["candidate_rounds"] += 1
            c["candidates"] += len(draft.branches)
            c["candidate_tokens"] += sum(len(b) for b in draft.branches)
            if draft.extension and draft.anchor(draft.branch) < len(draft.tokens):
                c["siblings_accepted"] += 1
            elif draft.extension:
                c["candidate_accepted_rounds"] += 1
                c["candidate_accepted_tokens"] += len(draft.extension)
                item = origins[draft.branch] if 0 <= draft.branch < len(origins) else None
                self.candidate_hits["leftover" if item is None else item if item == LOOKUP
                                    else pool.touch(*item)] += 1

    def report(self, pool: PhrasePool, branches: Branches, sources: tuple[str, ...]) -> dict:
        c = self.counts
        return {
            "rounds": c["rounds"],
            "draft_tokens": c["draft_tokens"],
            "draft_forwards": c["draft_forwards"],
            "phrase_forwards": c["phrase_forwards"],
            "phrase_hits": sum(self.phrase_hits.values()),
            "phrase_tokens": c["phrase_tokens"],
            "tokens_per_draft_forward": round(c["draft_tokens"] / max(c["draft_forwards"], 1), 3),
            "candidate_rounds": c["candidate_rounds"],
            "candidates_proposed": c["candidates"],
            "candidate_tokens_proposed": c["candidate_tokens"],
            "candidate_accepted_rounds": c["candidate_accepted_rounds"],
            "candidate_accepted_tokens": c["candidate_accepted_tokens"],
            "candidate_acceptance": round(c["candidate_accepted_rounds"] / c["candidate_rounds"], 4)
            if c["candidate_rounds"] else 0.0,
            "phrase_hits_by_source": dict(self.phrase_hits),
            "candidate_hits_by_source": dict(self.candidate_hits),
            "phrase_rounds": c["phrase_rounds"],
            "phrase_round_tokens": c["phrase_round_tokens"],
            "phrase_round_accepted": c["phrase_round_accepted"],
            "pool_rounds": c["pool_rounds"],
            "pool_tokens_proposed": c["pool_tokens"],
            "pool_accepted_tokens": c["pool_accepted_tokens"],
            "siblings_proposed": c["siblings"],
            "siblings_accepted": c["siblings_accepted"],
            "sibling_hit_ratio": round(branches.sibling_rate.ratio, 4),
            "sibling_observations": branches.sibling_rate.observations,
            "pool_size": len(pool),
            "pool_capacity": pool.capacity,
            "pool_by_source": pool.counts(),
            "pool_added_by_source": {s: pool.added.get(s, 0) for s in SOURCES},
            "sources": sorted(sources),
        }


class PhraseDrafter(TokenDrafter):
    """Ouroboros drafter (see the module docstring) over the draft ``backend``, with ``options``."""

    reads_target_argmax = True  # the target's text past a rejection is a phrase (rejection_phrase)

    def __init__(self, backend: ModelBackend, vocab: int, options: PhraseOptions | None = None) -> None:
        super().__init__(backend, vocab)
        o = self.options = options or PhraseOptions()
        if o.siblings:  # a sibling is the draft's second choice, priced from q(d_i) and the second's probability
            self.needs = frozenset({"prob", "second_prob", "second_token"})
        self.pool = shared_pool(backend.identity, o.ngram, o.pool_size, o.key_len,
                                f"{o.pool_tag}|{','.join(sorted(o.sources))}") if o.warm_start \
            else PhrasePool(o.ngram, o.pool_size, o.key_len)
        self.pool_file = Path(o.pool_file) if o.pool_file else None
        if self.pool_file is not None:  # it is saved after the generation: refuse a path that cannot be written now
            from ..io import check_out_file

            check_out_file(self.pool_file, "pool_file")
        if self.pool_file is not None and self.pool_file.exists() and len(self.pool) == 0:
            self.pool.load(self.pool_file, vocab)
        self.choice = SourceChoice(self.pool, o.lookup_len)
        self.branches = Branches(self.pool, o.candidates, o.candidate_len, o.siblings, o.tree_size,
                                 self.choice if o.choose else None)
        self.reset_round_state()

    def reset_round_state(self) -> None:
        self.tally = PhraseTally()
        self._leftover: list[int] = []  # drafted tokens the draft agreed with but the length rule cut
        self._last: Draft | None = None
        self._origins: list[Origin] = []  # per branch scored, where it came from
        self._seen = 0  # committed tokens the pool has learnt
        self._phrase_round = False

    # ----------------------------------------------------------------------------------------------- pool
    def _learn(self, seq: list[int], source: str, **kw) -> None:
        if source in self.options.sources:
            self.pool.add_sequence(seq, source, **kw)

    def _sync(self, tokens: list[int]) -> None:
        """Add the tokens committed since the last proposal (the prompt at the first one)."""
        self._seen = learn_committed(self.pool, tokens, self._seen, self._learn)

    # ------------------------------------------------------------------------------------------ interface
    def reset(self) -> None:
        super().reset()
        self.pool.generation += 1
        self.choice.new_generation()
        self.reset_round_state()

    def propose(self, tokens, policy, budget, sampling, gen, remaining: int = 0, pricer: Pricer = UNPRICED) -> Draft:
        """Per round: a phrase verified alone where the pricer says it beats a draft round, else the draft model
        drafts (phrase by phrase, greedy) with branches where they pay; a round that drafts nothing does no pool
        work and proposes no branches, unless a pool round pays (the pool catches up with the committed tokens at
        the next round that needs it: :func:`~pacer.drafters.pool.learn_committed` is incremental)."""
        o, c = self.options, self.tally.counts
        self._pool_seconds = 0.0
        self._phrase_round = False
        if sampling.greedy and o.choose and budget > 0:
            found = self._timed(self.choice.choose, tokens, pricer, budget, max(0, len(tokens) - self.backend.length
                                                                                  - 1), remaining, self._sync)
            if found is not None:
                self._phrase_round = True
                c["rounds"] += 1
                c["phrase_rounds"] += 1
                draft = Draft([], None, DraftState(), branches=[found[0]], anchors=[0])
                draft.branch_total = len(found[0])
                self._origins, self._leftover = [found[1]], []
                return self._finish(draft)
        if not sampling.greedy or not o.phrases:
            draft = super().propose(tokens, policy, budget, sampling, gen, remaining, pricer)
            if draft.tokens:
                self._timed(self._sync, tokens)
        else:
            draft = self._propose_phrases(tokens, policy, budget, pricer, remaining)
        c["rounds"] += 1
        c["draft_tokens"] += len(draft.tokens)
        c["draft_forwards"] += draft.forwards
        if sampling.greedy and (o.candidates or o.siblings) and draft.tokens:
            self._origins = self._timed(self.branches.after_draft, tokens, draft, pricer, self._leftover)
            c["siblings"] += len(draft.branches) - len(self._origins)
            self._leftover = []
        elif sampling.greedy and o.candidates and not draft.tokens and budget > 0 \
                and pricer.branch_room(0, self.branches.pool_yield(tokens)) > 0:
            self._timed(self._sync, tokens)
            self._origins = self._timed(self.branches.for_pool_round, tokens, draft)
            self._leftover = []
            draft.branch_yield = self.branches.pool_yield(tokens)
        if draft.branches and draft.branch_total is None:  # sized here, once: the loop scores them as they are
            draft.branch_total = pricer.branch_room(len(draft.tokens), draft.branch_yield)
        return self._finish(draft)

    def _finish(self, draft: Draft) -> Draft:
        draft.pool_time = self._pool_seconds
        self._last = draft
        return draft

    def _timed(self, fn, *args, **kw):
        """``fn(*args, **kw)``, its seconds counted as pool work (``Draft.pool_time``)."""
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self._pool_seconds += time.perf_counter() - t

    def _propose_phrases(self, tokens, policy, budget, pricer: Pricer, remaining: int = 0) -> Draft:
        p = Proposal(policy, budget, len(tokens) - self.backend.length - 1, remaining, needs=self.needs,  # greedy
                     pricer=pricer)
        self._leftover = []
        synced = False
        while p.ask():
            if not synced:  # the first token of the round pays: the pool learns what was committed since
                self._timed(self._sync, tokens)
                synced = True
            ctx = tokens + p.state.tokens
            pending = p.feed_apart(self.backend, ctx[self.backend.length :])
            room = budget - p.n  # tokens this forward may still add (its phrase tokens + the draft's own)
            found = self._timed(self.pool.lookup, ctx, 1) if room > 1 else []
            key, phrase = found[0] if found else ((), ())
            kind = self.pool.kind(key, phrase) if found else None
            phrase = list(phrase[: self.pool.check_len(pricer, len(pending), min(room - 1, len(phrase)), kind)])
            start = self.backend.length + len(pending)  # cache length once pending is in
            # read before the next forward: the logits may be a view of the backend's memory
            logits, hidden = self.backend.forward_view(pending + phrase, hidden=p.layers is not None,
                                                       keep=len(phrase) + 1)
            p.forwards += 1
            # row j predicts the token after phrase[:j]; greedy over the scored ids alone (TokenDrafter.scored_ids)
            ids = self.scored_ids()
            rows = (logits[:, ids] if ids is not None else self.align(logits)).float()
            if not phrase:  # no phrase checked: the draft's own token, its argmax found with its features
                p.add(None, None, hidden, len(pending) - 1, ids=ids, logits=rows[0])
                continue
            kept, k, new, guess = self._check_phrase(p, phrase, kind, rows, ids, hidden, len(pending))
            self.backend.crop(start + min(kept, k))  # keep only kept phrase tokens in the cache
            self._count_phrase(key, found[0][1], ctx, phrase, guess, kept, k)
            if kept < len(new):
                self._leftover = new[kept:]  # agreed by the draft but cut by the policy / budget
                break
        return p.draft()

    def _check_phrase(self, p: Proposal, phrase: list[int], kind, rows, ids, hidden,
                      fed: int) -> tuple[int, int, list[int], list[int]]:
        """The draft's verdict on a checked ``phrase``: its argmax ``guess`` at every row agrees with the phrase's
        first ``k`` tokens, and its own greedy tokens ``new`` (those ``k`` and its next one) are added while the
        policy goes on (``kept`` of them)."""
        at = argmax(rows)
        guess = at if ids is None else ids[at].tolist()
        k = 0
        while k < len(phrase) and phrase[k] == guess[k]:
            k += 1
        self.pool.learn_agreement(len(phrase), k, kind)
        new = phrase[:k] + [guess[k]]  # the draft's own greedy tokens
        kept = 0
        for j, x in enumerate(new):
            if j and not p.ask(free=True):
                break
            p.add(None, x, hidden, fed - 1 + j, phrase=j < k, index=at[j] if ids is not None else None, ids=ids,
                  logits=rows[j])
            kept += 1
        return kept, k, new, guess

    def _count_phrase(self, key, cont, ctx: list[int], phrase: list[int], guess: list[int], kept: int,
                      k: int) -> None:
        """Tally a checked phrase, and learn the draft's Jacobi iterate where it disagreed (its argmax at every
        position from the first disagreement on)."""
        self.tally.phrase_checked(min(kept, k), self.pool.touch(key, cont) if k else None)
        if k < len(phrase):
            tail = (ctx + phrase[:k])[-self.pool.key_len :]
            self._timed(self._learn, tail + guess[k:], "lookahead", first_cont=len(tail), partial=True)

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        draft, n = self._last, accepted
        if draft is None:
            return
        self.tally.observe(draft, self._phrase_round, self._origins, self.pool)
        if self._phrase_round or not draft.tokens:  # a phrase verified alone, or pool continuations alone
            return
        if (found := rejection_phrase(tokens, draft.tokens, target_argmax, n, self.pool.key_len)) is not None:
            self._learn(found[0], "verify", first_cont=found[1], partial=True)
        st = draft.state
        if self.options.siblings and st.temperature == 0 and n < len(st.second_token) and n < len(target_argmax):
            self.branches.sibling_rate.update(sibling_estimates(st)[n], target_argmax[n] == st.second_token[n])

    def finish(self) -> None:
        if self.pool_file is not None:
            self.pool.save(self.pool_file, self.vocab)

    def report(self) -> dict:
        return self.tally.report(self.pool, self.branches, self.options.sources)

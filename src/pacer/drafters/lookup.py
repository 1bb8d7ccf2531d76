"""Prompt-lookup drafting (the ``lookup`` method) - no draft model. The draft is the continuation of the longest n-gram
of the prompt and the output so far (and of the target's own tokens after a rejection) that ends like the text does.

A looked-up token costs no draft forward (``next_is_free``), only its place in the verification, so it can pay
where a draft model cannot: on a CPU whose forward costs grow with every scored token, a free token pays once it is
accepted more often than ``(c_t(2) - c_t(1)) / c_t(1)`` (0.61 on an AVX2-only AMD EPYC Zen 3: 213 and 343 ms), which a
long n-gram match in code or in a quoted text often is. The cost-aware rule decides on the match's confidence
(:attr:`pacer.policies.base.DraftState.confidence`: higher for a longer matched key), calibrated from the verifier's
verdicts.

Lossless in both modes: greedy, the target checks every token; sampling, the proposal is deterministic
(``q`` one-hot at the looked-up token), and rejection sampling with any ``q`` keeps the target's distribution.
"""

from __future__ import annotations

import torch

from ..decoding import Draft, Drafter, Proposal
from ..pricing import UNPRICED
from .pool import PhrasePool, learn_committed, rejection_phrase

#: the lookup's confidence that a token of a continuation found with a key of this many tokens is right: a prior
#: that the cost-aware rule's calibrator corrects from the verdicts it sees
KEY_CONFIDENCE = {1: 0.35, 2: 0.6, 3: 0.75, 4: 0.85}


class LookupDrafter(Drafter):
    """Drafts continuations of matching n-grams from a pool of this generation's text (prompt, output, the target's
    tokens after a rejection); ``vocab`` is the target's vocabulary size (the width of ``q``), ``device`` the
    target's (where ``q`` is made: sampling verifies it against the target's ``p`` there)."""

    def __init__(self, vocab: int, ngram: int = 8, key_len: int = 3, device: torch.device | str = "cpu") -> None:
        self.vocab, self.ngram, self.key_len, self.device = vocab, ngram, key_len, torch.device(device)
        self.reset()

    def reset(self) -> None:
        self.pool = PhrasePool(self.ngram, 1 << 16, self.key_len)
        self._seen = 0
        self._last: Draft | None = None

    def propose(self, tokens, policy, budget, sampling, gen, remaining: int = 0, pricer=UNPRICED) -> Draft:
        self._seen = learn_committed(self.pool, tokens, self._seen, self.pool.add_sequence)
        # no draft model: nothing to catch up
        p = Proposal(policy, budget, remaining=remaining, temperature=sampling.temperature, pricer=pricer)
        ctx = list(tokens)
        while p.n < budget:
            found = self.pool.lookup(ctx, 1)
            if not found:
                break
            key, cont = found[0]
            conf = KEY_CONFIDENCE.get(len(key), max(KEY_CONFIDENCE.values()))
            for x in cont:
                if not p.ask(free=True, confidence=conf):
                    self._last = p.draft()
                    return self._last
                q = None
                if p.features or not sampling.greedy:  # a one-hot q: needed to sample, or for a policy's features
                    q = torch.zeros(self.vocab, device=self.device)
                    q[x] = 1.0
                p.add(q, x, None, 0, phrase=True, keep_q=not sampling.greedy, confidence=conf)
                ctx.append(x)
        self._last = p.draft()
        return self._last

    reads_target_argmax = True  # the target's text past a rejection is a phrase (rejection_phrase)

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        """After a rejection the target's own greedy tokens continue the text: a phrase for later lookups."""
        if self._last is None:
            return
        found = rejection_phrase(tokens, self._last.tokens, target_argmax, accepted, self.key_len)
        if found is not None:
            self.pool.add_sequence(found[0], "verify", first_cont=found[1], partial=True)

"""Token-by-token drafting (classic speculative decoding): one draft forward per drafted token."""

from __future__ import annotations

import torch

from ..decoding import Draft, Drafter, ModelBackend, Proposal
from ..pricing import UNPRICED
from ..sampling import pick, warp


class TokenDrafter(Drafter):
    """Drafts one token per draft forward (classic SD). ``vocab`` is the target's vocabulary size: draft logits are
    truncated or padded to it so that ``q`` and ``p`` live on the same support."""

    #: the per-token draft features the drafter reads itself (beside the policy's; see :class:`Proposal`)
    needs: frozenset[str] = frozenset()

    def __init__(self, backend: ModelBackend, vocab: int) -> None:
        self.backend = backend
        self.vocab = vocab

    def reset(self) -> None:
        self.backend.reset()

    def align(self, logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        if v > self.vocab:
            return logits[..., : self.vocab]
        if v < self.vocab:
            pad = logits.new_full((*logits.shape[:-1], self.vocab - v), float("-inf"))
            return torch.cat([logits, pad], -1)
        return logits

    def propose(self, tokens, policy, budget, sampling, gen, remaining: int = 0, pricer=UNPRICED) -> Draft:
        pending = tokens[self.backend.length :]
        p = Proposal(policy, budget, len(pending) - 1, remaining, sampling.temperature, self.needs, pricer)
        while p.ask():
            pending = p.feed_apart(self.backend, pending)  # a prompt's rows apart where they would be scored
            # read at once (a kept q is a new tensor): the logits may be a view of the backend's memory
            logits, hidden = self.backend.forward_view(pending, hidden=p.layers is not None, keep=1)
            p.forwards += 1
            ids = self.scored_ids() if sampling.greedy else None  # after the forward: a prompt adds its ids
            if ids is not None:  # greedy over the scored ids alone (see scored_ids)
                x = p.add(None, None, hidden, -1, ids=ids, logits=logits[-1, ids].float())
            elif sampling.greedy:  # the argmax and the features from the logits in one read: no probability row
                x = p.add(None, None, hidden, -1, logits=self.align(logits[-1]).float())
            else:
                q = warp(self.align(logits[-1]), sampling)
                x = pick(q, sampling, gen)
                p.add(q, x, hidden, -1, keep_q=not sampling.greedy)
            pending = [x]
        return p.draft()

    def scored_ids(self) -> torch.Tensor | None:
        """The vocabulary ids a reduced draft head scores now (within the target's vocabulary), or ``None`` for
        the full one. Every other id has probability 0, so a greedy pick and its features (probability, top two,
        entropy) over these alone equal the full row's, at a fraction of the work: 32,768 of 151,936 ids on the
        default pair (the softmax, log and top-2 of a full row cost about 1 ms a drafted token on a 2-core CPU)."""
        ids = self.backend.scored_rows()
        if ids is None:
            return None
        return ids[ids < self.vocab] if int(ids[-1]) >= self.vocab else ids

    def rollback(self, keep: int) -> None:
        self.backend.crop(keep)

    def vocab_rows(self) -> torch.Tensor | None:
        return self.backend.rows

    @torch.inference_mode()
    def agreement(self, prompt: list[int], reference: list[int]) -> list[bool]:
        """One teacher-forced forward of the draft backend over ``prompt + reference``, scored exactly as drafting
        scores (a reduced vocabulary included); the cache is emptied afterwards (a generation starts anew)."""
        if not reference:
            return []
        self.backend.reset()
        rows = [self.backend.forward(prompt, keep=1)[0]]  # the prompt first, as a generation feeds it
        if len(reference) > 1:
            rows.append(self.backend.forward(reference[:-1])[0])
        self.backend.reset()
        logits = torch.cat(rows)
        pred = self.align(logits).argmax(-1).tolist()
        return [a == b for a, b in zip(pred, reference, strict=True)]

"""The one speculative decoding loop that every method shares, plus plain autoregressive decoding.

The first token comes out of the target's prefill alone (:func:`plain_step`: the prompt, one target
forward, the target's own token, committed and streamed at once), exactly as plain decoding's does; only then does
the draft read the prompt (and that token, in the same forward) and the rounds begin. A drafting method's time to
first token is therefore plain decoding's, and the draft's prefill is no extra forward: it reads the prompt in its
first draft forward, as before.

One round of :func:`speculative_generate` (``γ`` draft tokens, ``n`` accepted; see :mod:`pacer.sampling`):

1. **propose** - the drafter drafts token by token (or phrase by phrase) and asks the draft-length policy after
   every token whether to go on; the loop caps ``γ`` by the policy's bounds and the remaining token budget.
2. **verify**  - one target forward over the tokens the target has not seen yet plus ``d_1..d_γ`` gives ``p``.
3. **accept**  - greedy: longest matching prefix plus the target's token; sampling: rejection sampling, token by
   token or the block jointly (``SamplingConfig.verify``).
4. **roll back** - both KV caches are cropped to the accepted length (a length pointer, no copies).
5. **commit**  - ``d_1..d_n`` and the target's token are appended one by one, so EOS, stop strings and
   ``max_new_tokens`` end the output exactly where plain decoding would, even inside a draft block.

The loop sees models only through :class:`~pacer.decoding.backend.ModelBackend` (``target``, and the drafter's
own), drafting only through :class:`~pacer.decoding.drafter.Drafter`, and the length decision only through
:class:`~pacer.policies.DraftPolicy`. The committed sequence is ``tokens``; a backend is fed ``tokens[length:]``.

On a GPU the loop stays on the host; what it reads back from the device is what its decisions need: a drafted
token and its features (:func:`~pacer.decoding.drafter.token_features`: one transfer), the verdict of a round
(the target's argmax, or the sampling rule's values) and nothing else. Those reads wait for the device, so the
round's timings (``RoundResult``, the stats) are true without an explicit synchronisation.
"""

from __future__ import annotations

import time

import torch

from ..policies.base import DraftPolicy
from ..pricing import UNPRICED, Pricer
from ..rounds import RoundResult
from ..sampling import (
    SamplingConfig,
    acceptance_probs,
    argmax,
    greedy_prefix,
    pick,
    target_state,
    verify_block,
    verify_greedy,
    verify_sampling,
    warp,
)
from .backend import ModelBackend
from .drafter import Drafter
from .meter import recording
from .output import Output
from .stats import GenerationStats


def autoregressive_generate(
    target: ModelBackend, prompt: list[int], out: Output, sampling: SamplingConfig, stats: GenerationStats
) -> list[int]:
    """Plain decoding: one target forward per token. The baseline every speedup is measured against."""
    gen = sampling.generator(target.device)  # sampling happens where the target's probabilities are
    target.reset()
    tokens = list(prompt)
    with recording(stats.calls):
        start = time.perf_counter()
        while not out.done:
            tokens += plain_step(target, tokens, out, sampling, gen, stats)
        stats.wall_time = time.perf_counter() - start
    return out.ids


def plain_step(target: ModelBackend, tokens: list[int], out: Output, sampling: SamplingConfig,
               gen: torch.Generator | None, stats: GenerationStats) -> list[int]:
    """One step of plain decoding: one target forward over the tokens it has not read, the target's own next token
    (greedy: the argmax of its logits, as verification takes it, no softmax; sampling: drawn with ``gen``),
    committed to ``out`` (and so streamed) at once, counted as a round that drafted nothing; returns what was
    committed."""
    t = time.perf_counter()
    logits, _ = target.forward_view(tokens[target.length :], keep=1)  # read at once: may be a view
    x = argmax(logits[-1].float()) if sampling.greedy else pick(warp(logits[-1], sampling), sampling, gen)
    stats.time_verify += time.perf_counter() - t
    stats.record_round(0, 0)
    return out.extend([x])


def speculative_generate(
    target: ModelBackend,
    drafter: Drafter,
    policy: DraftPolicy,
    prompt: list[int],
    out: Output,
    sampling: SamplingConfig,
    stats: GenerationStats,
    pricer: Pricer = UNPRICED,
) -> list[int]:
    """Speculative decoding with draft length chosen by ``policy`` (see the module docstring for the steps);
    ``pricer``: what a round costs and yields (:mod:`pacer.pricing`; the method factory's, the cost rule's own
    one), priced at each round's context and handed to the drafter with every ``propose``."""
    gen = sampling.generator(target.device)  # sampling happens where the target's probabilities are
    target.reset()
    drafter.reset()
    policy.reset()
    pricer.begin(sampling.greedy)
    tokens = list(prompt)
    with recording(stats.calls):  # every forward below is in stats.calls (the breakdown, the profile clock)
        start = time.perf_counter()
        if not out.done:  # the first token: the target's prefill alone, before the draft reads anything
            committed = plain_step(target, tokens, out, sampling, gen, stats)
            tokens += committed
            policy.prefilled(len(committed))
        while not out.done:
            # 1. propose: at most what the policy, the budget (the round's target token is always emitted) and
            #    the context allow
            budget = min(policy.max_draft, out.remaining - 1, target.context - len(tokens) - 1)
            pricer.set_context(len(tokens))  # the round is priced where it runs
            t0 = time.perf_counter()
            draft = drafter.propose(tokens, policy, max(budget, 0), sampling, gen, remaining=out.remaining,
                                    pricer=pricer)
            t1 = time.perf_counter()
            γ = len(draft.tokens)
            # 2. verify: one target forward over the unseen tokens and d_1..d_γ (greedy: plus candidate branches
            #    after d_γ or beside a draft token, as a tree, where they pay); p[i] is the target's distribution
            #    for d_{i+1} (p[γ]: bonus)
            pending = tokens[target.length :]
            room = min(out.remaining, target.context - len(tokens)) - 1 - γ \
                if sampling.greedy and (γ or draft.branches) else 0
            total = draft.branch_total if draft.branch_total is not None else \
                pricer.branch_room(γ, draft.branch_yield) if room > 0 else 0
            ids, tree = draft.tree_inputs(pending, room, total, siblings=target.sibling_branches)
            # forward_view: the scores are read within this round, before the target's next forward
            scores, t_hs = target.forward_view(ids, tree=tree, keep=len(ids) - len(pending) + 1,
                                               hidden=policy.needs_target_hidden)
            logits = scores[: γ + 1]  # row 0 is the last pending token's
            # 3. accept: greedy - longest matching prefix, then the longest matching branch anchored there,
            #    plus the target's token (block verification is this same rule there); sampling - token-level
            #    rejection sampling or block verification (sampling.verify), on the chain alone (room = 0: no
            #    branch is scored)
            if sampling.greedy:  # the target's greedy token after d_0..d_γ (up to the first rejection, where enough)
                t = argmax(logits) if drafter.reads_target_argmax else greedy_prefix(draft.tokens, logits)
                n, x = verify_greedy(draft.tokens, logits, t)
                x = draft.accept_branch(scores, γ + 1, n, x) if draft.branches else x
                p = None
            else:
                p = warp(logits, sampling)
                verify = verify_block if sampling.verify == "block" else verify_sampling
                n, x = verify(draft.tokens, draft.q, p, gen)
            # 4. roll back both caches to the accepted main-draft length (an extension is re-fed next round)
            keep = len(tokens) + n
            target.crop(keep)
            drafter.rollback(keep)
            t2 = time.perf_counter()
            if γ or draft.branches:  # a round that proposed nothing teaches a drafter nothing
                drafter.observe(tokens, t if sampling.greedy else argmax(
                    logits if drafter.reads_target_argmax else logits[: n + 1]), n)
            t3 = time.perf_counter()
            # 5. commit token by token (EOS / stop strings / max_new_tokens inside the block end the output exactly)
            committed = out.extend(draft.tokens[:n] + draft.extension + [x])
            tokens += committed
            stats.record_round(γ + len(draft.extension), n + len(draft.extension))
            stats.draft_forwards += draft.forwards
            soft = acceptance_probs(draft.tokens, draft.state.prob, p if p is not None else torch.softmax(logits, -1)) \
                if policy.needs_soft and γ else []
            t_ent, t_margin = target_state(logits[: n + 1]) if policy.needs_target_state else ([], [])
            # the final hidden state at the row whose distribution gave the last committed token (row n of scores,
            # or a matched branch's last row); a copy, not a view that keeps the whole forward's states alive
            t_hidden = t_hs[-1][len(pending) - 1 + (draft.bonus_row if draft.extension else n)].to(
                "cpu", torch.float32, copy=True) if t_hs is not None else None
            branched = sum(len(b) for b in draft.branches)
            result = RoundResult(
                drafted=γ, accepted=n, soft=soft, draft_seconds=t1 - t0 - draft.policy_time - draft.pool_time,
                verify_seconds=t2 - t1, scored=len(ids), draft_forwards=draft.forwards, committed=len(committed),
                branched=branched, extended=len(draft.extension), target_entropy=t_ent, target_margin=t_margin,
                target_hidden=t_hidden)
            pricer.learn(policy, draft.state, result)  # before the policy forgets the round (a layer's memo)
            policy.update(draft.state, result)
            t4 = time.perf_counter()
            stats.time_draft += t1 - t0 - draft.policy_time - draft.pool_time
            stats.time_pool += draft.pool_time + (t3 - t2)
            stats.time_policy += draft.policy_time + (t4 - t3)
            stats.time_verify += t2 - t1
        stats.wall_time = time.perf_counter() - start
    return out.ids

"""The one speculative decoding loop that every method shares, plus plain autoregressive decoding.

One round of :func:`speculative_generate` (``γ`` draft tokens, ``n`` accepted; see :mod:`pacer.sampling`):

1. **propose** - the drafter drafts token by token (or phrase by phrase) and asks the draft-length policy after
   every token whether to go on; the loop caps ``γ`` by the policy's bounds and the remaining token budget.
2. **verify**  - one target forward over the tokens the target has not seen yet plus ``d_1..d_γ`` gives ``p``.
3. **accept**  - greedy: longest matching prefix plus the target's token; sampling: rejection sampling.
4. **roll back** - both KV caches are cropped to the accepted length (a length pointer, no copies).
5. **commit**  - ``d_1..d_n`` and the target's token are appended one by one, so EOS, stop strings and
   ``max_new_tokens`` end the output exactly where plain decoding would, even inside a draft block.

Caches: :class:`CachedModel` keeps a model's ``DynamicCache`` and the number of tokens in it (``length``). The
committed sequence is ``tokens``; before each forward a model is fed ``tokens[length:]`` (what it has not seen).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .errors import PacerError
from .policies import DraftPolicy, DraftState, RoundResult
from .sampling import SamplingConfig, acceptance_probs, pick, verify_greedy, verify_sampling, warp
from .stats import GenerationStats


class CachedModel:
    """A causal LM and its KV cache; ``length`` tokens are in the cache."""

    def __init__(self, model: torch.nn.Module, rows: torch.Tensor | None = None) -> None:
        self.model = model
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.rows: torch.Tensor | None = None
        if rows is not None:
            self.restrict_head(rows)
        self.reset()

    def restrict_head(self, rows: torch.Tensor) -> None:
        """Compute logits only for the vocabulary ids ``rows`` (``[S]``, sorted); every other id gets ``-inf``.

        The LM head is then ``S x H`` instead of ``V x H`` (see :mod:`pacer.draftvocab`). Only for a draft model:
        a target must score the whole vocabulary."""
        head = self.model.get_output_embeddings()
        cfg = self.model.config
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(cfg, attr, None) not in (None, 0, 1, 1.0):
                raise PacerError(f"--draft-vocab: this draft model transforms its logits ({attr}); use the full "
                                 f"vocabulary (--draft-vocab 0)")
        rows = torch.as_tensor(rows, dtype=torch.long)
        V = int(head.weight.shape[0])
        if rows.ndim != 1 or len(rows) == 0 or int(rows.min()) < 0 or int(rows.max()) >= V:
            raise PacerError(f"--draft-vocab: token ids must lie in [0, {V}) (the draft's vocabulary)")
        self.rows = rows.sort().values
        self._w = head.weight.detach()[self.rows].contiguous()
        self._b = head.bias.detach()[self.rows] if getattr(head, "bias", None) is not None else None
        self._vocab = V
        self._kept = torch.zeros(V, dtype=torch.bool)
        self._kept[self.rows] = True
        self._extra: torch.Tensor | None = None

    def add_rows(self, ids: Sequence[int]) -> None:
        """Also score ``ids`` (e.g. the prompt's tokens, which a continuation often repeats) until :meth:`reset`."""
        new = torch.tensor(sorted(set(ids)), dtype=torch.long)
        new = new[(new >= 0) & (new < self._vocab)]
        new = new[~self._kept[new]]
        if len(new) == 0:
            return
        self._kept[new] = True
        self._extra = new if self._extra is None else torch.cat([self._extra, new])
        head = self.model.get_output_embeddings()
        self._w_extra = head.weight.detach()[self._extra].contiguous()
        self._b_extra = head.bias.detach()[self._extra] if self._b is not None else None

    def scored_rows(self) -> torch.Tensor | None:
        """Every vocabulary id the restricted head scores now (``None``: the full vocabulary)."""
        if self.rows is None:
            return None
        return self.rows if self._extra is None else torch.cat([self.rows, self._extra]).sort().values

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        if self.rows is not None and self._extra is not None:
            self._kept[self._extra] = False
            self._extra = None

    @torch.inference_mode()
    def forward(
        self,
        ids: Sequence[int],
        hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        keep: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Run ``ids`` after the cached tokens; returns float32 logits of the last ``keep`` positions
        (``[keep, V]``; all ``len(ids)`` when ``keep`` is 0) and, if asked, the hidden states (a tuple over layers
        of ``[len(ids), H]``). Keeping only the rows a caller reads spares the LM head over the prompt: on a
        1.5B model with a 150k vocabulary that is ~0.5 GFLOP per prompt token."""
        kwargs = {"logits_to_keep": keep} if keep else {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.rows is not None:
            return self._forward_restricted(ids, hidden, keep, kwargs)
        out = self.model(
            input_ids=torch.tensor([list(ids)], dtype=torch.long),
            cache=self.cache,
            use_cache=True,
            output_hidden_states=hidden,
            **kwargs,
        )
        self.length += len(ids)
        hs = tuple(h[0] for h in out.hidden_states) if hidden else None
        return out.logits[0].float(), hs

    def _forward_restricted(self, ids, hidden, keep, kwargs):
        """:meth:`forward` with the LM head restricted to ``rows``: the decoder stack, then ``S x H`` logits
        scattered into a ``-inf`` row of the full vocabulary (same shapes and hidden states as the full head)."""
        kwargs.pop("logits_to_keep", None)
        if self.length == 0:  # a new sequence: its prompt's tokens join the scored rows
            self.add_rows(ids)
        out = self.model.get_decoder()(
            input_ids=torch.tensor([list(ids)], dtype=torch.long),
            cache=self.cache,
            use_cache=True,
            output_hidden_states=hidden,
            **kwargs,
        )
        self.length += len(ids)
        h = out.last_hidden_state[0]
        h = h[-keep:] if keep else h
        sub = h @ self._w.T
        if self._b is not None:
            sub = sub + self._b
        logits = torch.full((h.shape[0], self._vocab), float("-inf"))
        logits[:, self.rows] = sub.float()
        if self._extra is not None:
            extra = h @ self._w_extra.T
            logits[:, self._extra] = (extra + self._b_extra if self._b_extra is not None else extra).float()
        hs = tuple(x[0] for x in out.hidden_states) if hidden else None
        return logits, hs

    def crop(self, length: int) -> None:
        """Drop every cached token past ``length``."""
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


@dataclass
class Draft:
    """One round's proposal: ``tokens`` (``d_1..d_γ``), ``q`` (``[γ, V]``, sampling only), the policy state
    and the number of draft forwards it took.

    ``branches`` (greedy only, e.g. Ouroboros candidate phrases): alternative continuations after ``d_γ``
    that the target verifies in the same forward as ``d_1..d_γ``, as a tree: a branch token attends to the
    cache, the main chain and its own branch prefix, with position ids going on after ``d_γ``
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

    def tree_inputs(self, pending: list[int], past: int, room: int, dtype: torch.dtype, total: int | None = None):
        """Target input ``pending + d_1..d_γ + branches`` (each branch cut to ``room`` tokens, none if
        ``room <= 0``; all branches together to ``total`` tokens) and, with branches, the 4D float mask
        ``(1, 1, new, past + new)`` (0 where attended, ``-inf`` elsewhere) and ``position_ids`` ``(1, new)``."""
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
            return ids, None, None
        main, total = len(ids), len(ids) + sum(len(b) for b in self.branches)
        allow = torch.zeros(total, past + total, dtype=torch.bool)
        allow[:, : past + main] = True
        allow[:main, past : past + main] = torch.ones(main, main, dtype=torch.bool).tril()
        pos = list(range(past, past + main))
        for b in self.branches:
            o, k = len(ids), len(b)
            allow[o : o + k, past + o : past + o + k] = torch.ones(k, k, dtype=torch.bool).tril()
            pos += range(past + main, past + main + k)
            ids = ids + b
        mask = torch.zeros(allow.shape, dtype=dtype).masked_fill_(~allow, float("-inf"))
        return ids, mask[None, None], torch.tensor([pos])

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


class Drafter:
    """Proposes draft tokens (the interface every drafting scheme implements)."""

    def reset(self) -> None: ...

    def propose(
        self,
        tokens: list[int],
        policy: DraftPolicy,
        budget: int,
        sampling: SamplingConfig,
        gen: torch.Generator,
        produced: int,
    ) -> Draft:
        raise NotImplementedError

    def rollback(self, keep: int) -> None:
        """The committed sequence now has ``keep`` tokens that the drafter may have cached; drop the rest."""

    def vocab_rows(self) -> torch.Tensor | None:
        """The draft vocabulary rows the drafter proposes from (``None``: the full vocabulary)."""
        return None

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        """After verification: ``target_argmax[i]`` (``0 <= i <= γ``) is the target's greedy token after
        ``tokens + d_1..d_i`` (``γ + 1`` entries; branch rows are not included), ``accepted`` is ``n``. Phrase
        pools learn from it; the default does nothing."""


def token_features(q: torch.Tensor, x: int, state: DraftState) -> None:
    """Append the cheap per-token features of draft token ``x`` drawn from ``q`` to ``state``."""
    state.tokens.append(x)
    state.prob.append(float(q[x]))
    state.top_prob.append(float(q.max()))
    logq = torch.log(q.clamp_min(1e-30))
    state.entropy.append(float(-(q * logq).sum()))


class TokenDrafter(Drafter):
    """Drafts one token per draft forward (classic SD). ``vocab`` is the target's vocabulary size: draft logits are
    truncated or padded to it so that ``q`` and ``p`` live on the same support."""

    def __init__(self, draft_model: torch.nn.Module, vocab: int, draft_vocab: torch.Tensor | None = None) -> None:
        self.model = CachedModel(draft_model, draft_vocab)
        self.vocab = vocab

    def reset(self) -> None:
        self.model.reset()

    def align(self, logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        if v > self.vocab:
            return logits[..., : self.vocab]
        if v < self.vocab:
            pad = logits.new_full((*logits.shape[:-1], self.vocab - v), float("-inf"))
            return torch.cat([logits, pad], -1)
        return logits

    def propose(self, tokens, policy, budget, sampling, gen, produced) -> Draft:
        state = DraftState(produced=produced)
        qs: list[torch.Tensor] = []
        pending = tokens[self.model.length :]
        layers = policy.hidden_layers
        policy_time = 0.0
        forwards = 0
        while state.n < budget:
            if state.n >= policy.min_draft:
                t = time.perf_counter()
                go = policy.should_continue(state)
                policy_time += time.perf_counter() - t
                if not go:
                    break
            logits, hidden = self.model.forward(pending, hidden=layers is not None, keep=1)
            forwards += 1
            q = warp(self.align(logits[-1]), sampling)
            x = pick(q, sampling, gen)
            token_features(q, x, state)
            state.phrase.append(False)
            if layers is not None:
                state.hidden.append(torch.cat([hidden[i][-1] for i in layers]).float())
            if not sampling.greedy:
                qs.append(q)
            pending = [x]
        return Draft(state.tokens, torch.stack(qs) if qs else None, state, policy_time, forwards)

    def rollback(self, keep: int) -> None:
        self.model.crop(keep)

    def vocab_rows(self) -> torch.Tensor | None:
        return self.model.rows


class Output:
    """Committed output: appends tokens one by one and stops exactly at EOS, a stop string or ``max_new_tokens``."""

    def __init__(
        self,
        max_new_tokens: int,
        eos: set[int],
        stop_strings: Sequence[str] = (),
        tokenizer=None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.ids: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        self.on_tokens = on_tokens
        self.finish_reason = ""
        if self.stop_strings and tokenizer is None:
            raise PacerError("stop strings need a tokenizer")

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.ids)

    def extend(self, new: list[int]) -> list[int]:
        """Append tokens until a stop condition holds; returns the tokens actually appended."""
        taken = []
        for x in new:
            if self.done:
                break
            self.ids.append(x)
            taken.append(x)
            if x in self.eos:
                self.finish_reason = "eos"
            elif self.stop_strings and any(s in self.tokenizer.decode(self.ids) for s in self.stop_strings):
                self.finish_reason = "stop"
            elif len(self.ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        if taken and self.on_tokens:
            self.on_tokens(taken)
        return taken


def autoregressive_generate(
    target: CachedModel, prompt: list[int], out: Output, sampling: SamplingConfig, stats: GenerationStats
) -> list[int]:
    """Plain decoding: one target forward per token. The baseline every speedup is measured against."""
    gen = sampling.generator()
    target.reset()
    tokens = list(prompt)
    start = time.perf_counter()
    while not out.done:
        t = time.perf_counter()
        logits, _ = target.forward(tokens[target.length :], keep=1)
        x = pick(warp(logits[-1], sampling), sampling, gen)
        stats.time_verify += time.perf_counter() - t
        stats.record_round(0, 0)
        tokens += out.extend([x])
    stats.wall_time = time.perf_counter() - start
    return out.ids


def speculative_generate(
    target: CachedModel,
    drafter: Drafter,
    policy: DraftPolicy,
    prompt: list[int],
    out: Output,
    sampling: SamplingConfig,
    stats: GenerationStats,
) -> list[int]:
    """Speculative decoding with draft length chosen by ``policy`` (see the module docstring for the steps)."""
    gen = sampling.generator()
    target.reset()
    drafter.reset()
    policy.reset()
    tokens = list(prompt)
    start = time.perf_counter()
    while not out.done:
        # 1. propose: at most what the policy, the budget (the round's target token is always emitted) and the
        #    context allow
        budget = min(policy.max_draft, out.remaining - 1, target.context - len(tokens) - 1)
        t0 = time.perf_counter()
        draft = drafter.propose(tokens, policy, max(budget, 0), sampling, gen, produced=len(out.ids))
        t1 = time.perf_counter()
        γ = len(draft.tokens)
        # 2. verify: one target forward over the unseen tokens and d_1..d_γ (greedy: plus candidate branches
        #    after d_γ, as a tree); p[i] is the target's distribution for d_{i+1} (p[γ]: the bonus token)
        pending = tokens[target.length :]
        room = min(out.remaining, target.context - len(tokens)) - 1 - γ if sampling.greedy else 0
        ids, mask, pos = draft.tree_inputs(pending, target.length, room, target.model.dtype, policy.branch_room(γ))
        tree, _ = target.forward(ids, attention_mask=mask, position_ids=pos, keep=len(ids) - len(pending) + 1)
        logits = tree[: γ + 1]  # tree row 0 is the last pending token's
        # 3. accept: greedy - longest matching prefix, then (all γ matched) the longest matching branch,
        #    plus the target's token; sampling - rejection sampling
        if sampling.greedy:
            n, x = verify_greedy(draft.tokens, logits)
            x = draft.accept_branch(tree, γ + 1, x) if n == γ and draft.branches else x
            p = None
        else:
            p = warp(logits, sampling)
            n, x = verify_sampling(draft.tokens, draft.q, p, gen)
        # 4. roll back both caches to the accepted main-draft length (an extension is re-fed next round)
        keep = len(tokens) + n
        target.crop(keep)
        drafter.rollback(keep)
        t2 = time.perf_counter()
        drafter.observe(tokens, logits.argmax(-1).tolist(), n)
        # 5. commit token by token (EOS / stop strings / max_new_tokens inside the block end the output exactly)
        tokens += out.extend(draft.tokens[:n] + draft.extension + [x])
        stats.record_round(γ + len(draft.extension), n + len(draft.extension))
        stats.draft_forwards += draft.forwards
        soft = acceptance_probs(draft.tokens, draft.state.prob, p if p is not None else torch.softmax(logits, -1)) \
            if policy.needs_soft else []
        policy.update(draft.state, RoundResult(γ, n, soft, t1 - t0 - draft.policy_time, t2 - t1, len(ids),
                                                 draft.forwards))
        t3 = time.perf_counter()
        stats.time_draft += t1 - t0 - draft.policy_time
        stats.time_policy += draft.policy_time + (t3 - t2)
        stats.time_verify += t2 - t1
    stats.wall_time = time.perf_counter() - start
    return out.ids


@torch.inference_mode()
def oracle_agreement(draft_model: torch.nn.Module, prompt: list[int], reference: list[int],
                     rows: torch.Tensor | None = None) -> list[bool]:
    """For each generated position ``j``: does the draft's greedy token, given the prompt and ``reference[:j]``,
    equal ``reference[j]``? One teacher-forced draft forward; feeds :class:`pacer.policies.OraclePolicy`.
    ``rows``: the drafter's reduced vocabulary (its greedy token is the best among them)."""
    if not reference:
        return []
    ids = torch.tensor([prompt + reference[:-1]], dtype=torch.long)
    logits = draft_model(input_ids=ids).logits[0, len(prompt) - 1 :]
    if rows is not None:  # the restricted head also scores the prompt's tokens (CachedModel.add_rows)
        rows = torch.unique(torch.cat([rows, torch.tensor(prompt, dtype=torch.long)]))
        rows = rows[rows < logits.shape[-1]]
    pred = (rows[logits[:, rows].argmax(-1)] if rows is not None else logits.argmax(-1)).tolist()
    return [a == b for a, b in zip(pred, reference, strict=True)]


@dataclass
class Divergence:
    """Where two greedy outputs ``a`` (plain decoding) and ``b`` first differ, and how close the target's logits
    were there when the common prefix is scored plainly (one forward).

    ``index``: first differing position; ``a``/``b``: the two tokens there (-1: that output had ended).
    ``top2_gap``: best minus second-best logit. ``gap``: best logit minus the lower of the logits of ``a`` and
    ``b`` (how far the worse of the two tokens is from being the argmax; the top-2 gap when one output ended).
    ``resolution``: the spacing of the model dtype's numbers at the best logit's magnitude (bf16 keeps 8
    significant bits: 0.125 for logits in [16, 32), 0.25 in [32, 64)); the model emits its logits in that dtype.
    """

    index: int
    a: int
    b: int
    top2_gap: float
    gap: float = float("nan")
    resolution: float = 0.0

    TIE_STEPS = 2  # how many resolution steps apart two logits may be and still count as tied

    @property
    def near_tie(self) -> bool:
        """Both differing tokens are within ``TIE_STEPS`` dtype resolution steps of the best logit: scoring a
        token inside a block instead of alone (other matrix kernels, other rounding) can then flip the argmax.
        A differing token further away than that is a real losslessness failure."""
        return self.steps <= self.TIE_STEPS

    @property
    def steps(self) -> float:
        """``gap`` (the top-2 gap when one output ended) in dtype resolution steps (inf when the dtype has none)."""
        gap = self.top2_gap if math.isnan(self.gap) else self.gap
        return gap / self.resolution if self.resolution > 0 else (0.0 if gap == 0 else math.inf)

    def describe(self) -> str:
        """One line: the gap, in logits and in resolution steps, and the verdict."""
        verdict = "a near-tie" if self.near_tie else "NOT a near-tie"
        return (f"logit gap {self.gap if not math.isnan(self.gap) else self.top2_gap:.4f} = {self.steps:.1f} "
                f"resolution steps of {self.resolution:g}: {verdict}")


def dtype_resolution(x: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype``'s numbers at magnitude ``|x|`` (one unit in the last place)."""
    if not dtype.is_floating_point:
        return 0.0
    e = math.floor(math.log2(abs(x))) if x else 0
    return float(torch.finfo(dtype).eps) * 2.0**e


@torch.inference_mode()
def first_divergence(
    target_model: torch.nn.Module, prompt: list[int], a: list[int], b: list[int]
) -> Divergence | None:
    """``None`` when ``a == b``; else the first differing index with the target's logit gaps there."""
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    x, y = (a[i] if i < len(a) else -1), (b[i] if i < len(b) else -1)  # -1: that output had ended
    logits = target_model(input_ids=torch.tensor([prompt + a[:i]])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    best = float(top[0])
    gap = best - min(float(logits[x]), float(logits[y])) if x >= 0 and y >= 0 else float("nan")
    return Divergence(i, x, y, best - float(top[1]), gap, dtype_resolution(best, target_model.dtype))


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict(), **self.extra}

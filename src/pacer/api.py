"""The Python API: :class:`Decoder` keeps a loaded pair for many calls; :func:`generate` is the one-shot form.

Example::

    from pacer import Decoder
    dec = Decoder.from_pretrained()                      # the default offline pair, bf16, all cores
    res = dec.generate("def quicksort(arr):", method="pacer", max_new_tokens=64)
    print(res.text, res.stats.tokens_per_s, res.stats.tau)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from . import methods, models
from .calibration import Calibration
from .costs import Costs
from .decoding import (
    Drafter,
    GenerationResult,
    ModelBackend,
    Output,
    autoregressive_generate,
    speculative_generate,
)
from .decoding.stats import GenerationStats
from .drafters.token import TokenDrafter
from .errors import ContextError, InvalidType, InvalidValue, PacerError
from .pair import LoadSpec, Pair
from .policies.base import DraftPolicy
from .policies.cost_aware import CostAwarePolicy, CostMemory
from .request import MethodRequest, check_history, check_prompt_ids, check_stop
from .sampling import SamplingConfig


class Decoder:
    """A target model, an optional draft model and their tokenizer (a :class:`~pacer.pair.Pair`), loaded once for
    many generations, with what the methods keep between them (costs, draft vocabularies, learned policies)."""

    def __init__(self, target: models.LoadedModel | Pair, draft: models.LoadedModel | None = None,
                 threads: int | None = None, draft_vocab: int | str | Sequence[int] | None = "auto",
                 costs: Costs | None = None, progress: bool = True, draft_quant: str = "none",
                 quantize: str = "none", device: str | torch.device | None = "auto") -> None:
        """``target``: a loaded :class:`~pacer.pair.Pair`, or a target model (with ``draft``, ``threads``,
        ``device``, ``quantize`` and ``draft_quant``, see :class:`~pacer.pair.Pair` and :mod:`pacer.devices`).

        ``draft_vocab``: the default reduced draft vocabulary of every drafting method (see
        :mod:`pacer.draftvocab`): ``"auto"`` (the default) 32,768 tokens when the draft's vocabulary is large
        enough for that to pay, else the full one; ``None``/0 the full vocabulary; an int ``S`` the ``S`` most
        frequent tokens of the held-out corpus; or explicit token ids.

        ``costs``: the forward costs the cost-aware rule decides on (:mod:`pacer.costs`); by default they are
        measured on this machine once and cached (:mod:`pacer.calibration`), the first time a method needs them.

        ``draft_quant``: ``"int8"`` runs the draft's linear layers int8 weight-only (:mod:`pacer.quantize`; lossless:
        the draft only proposes), ``"auto"`` does so where it measures faster on this machine (measured once, cached),
        ``"none"`` keeps the draft's dtype. ``quantize="int8"`` quantizes the target: a *different target*, whose
        plain decoding is the baseline then (opt-in, never the default); the draft still follows ``draft_quant`` (the
        draft only proposes: whichever drafts faster is right; on an AVX2-only EPYC the bf16 draft did, 62 against
        84 ms a token)."""
        self.pair = target if isinstance(target, Pair) else Pair(target, draft, threads, device, quantize,
                                                                  draft_quant)
        self.draft_vocab = draft_vocab
        self.progress = progress
        self._calibrations: dict[int | None, Calibration] = {}
        if costs is not None:
            self._calibrations[None] = Calibration(costs, source="given")
        self._given_costs = costs is not None
        self._cost_memory: dict[str, CostMemory] = {}
        self._draft_rows: dict[int | str, torch.Tensor | None] = {}
        p = self.pair
        self.device, self.threads, self.backend, self.target = p.device, p.threads, p.backend, p.target
        self.target_info, self.draft_info, self.tokenizer, self.vocab, self.eos = (
            p.target_info, p.draft_info, p.tokenizer, p.vocab, p.eos)
        self._preverifiers: dict[str, object] = {}

    @classmethod
    def from_pretrained(cls, target: str = "default-target", draft: str | None = "default-draft",
                        dtype: str = "auto", threads: int | None = None, progress: bool = True,
                        draft_vocab: int | str | Sequence[int] | None = "auto", draft_quant: str = "auto",
                        quantize: str = "none", backend: str = "auto",
                        device: str | torch.device | None = "auto") -> Decoder:
        """Load a pair: ``default-target``/``default-draft``, HF model folders or ``.gguf`` files (see
        :class:`~pacer.pair.LoadSpec`: every setting is checked before anything loads; ``backend``:
        ``transformers``, ``llamacpp`` or another registered one, :mod:`pacer.backends`, or ``auto``;
        ``dtype="auto"``: the transformers weights' dtype measured faster on this machine)."""
        return cls.load(LoadSpec(target, draft, backend, dtype, threads, device, draft_quant, quantize, draft_vocab,
                                 progress))

    @classmethod
    def load(cls, spec: LoadSpec, costs: Costs | None = None) -> Decoder:
        """The decoder of a :class:`~pacer.pair.LoadSpec` (resolved and checked, then loaded)."""
        return cls(spec.load(), draft_vocab=spec.draft_vocab, costs=costs, progress=spec.progress)

    def draft_backend(self, rows: torch.Tensor | None = None) -> ModelBackend:
        """A fresh backend (its own cache) on the draft model, scoring vocabulary ``rows`` (``None``: all)."""
        return self.pair.draft_backend(rows)

    def calibration(self, rows: torch.Tensor | None = None, refresh: bool = False) -> Calibration:
        """This machine's costs for this pair with draft vocabulary ``rows`` (cached; see
        :mod:`pacer.calibration`). Costs given to the constructor are used for every vocabulary."""
        if self._given_costs:
            return self._calibrations[None]
        key = None if rows is None else len(rows)
        if refresh or key not in self._calibrations:
            from .calibration import load_or_measure

            cal = load_or_measure(self.pair, rows, refresh=refresh, progress=self.progress)
            for note in cal.notes:
                print(f"pacer: note: {note}", file=sys.stderr)
            self._calibrations[key] = cal
        return self._calibrations[key]

    def use_profile(self, profile) -> list[str]:
        """Decide with another machine's measured costs (a :class:`pacer.profiles.Profile` of this pair and
        backend; refused otherwise): the cost-aware rule takes the profile's curve (not refined by this
        machine's timings). Returns notes on softer differences (the draft's dtype or vocabulary)."""
        from .profiles import pair_of

        rows = self.draft_rows(self.draft_vocab) if self.draft_info is not None else None
        notes = profile.check_pair(*pair_of(self.pair, rows))
        self._calibrations = {None: Calibration(profile.costs(), source=f"profile {profile.name}")}
        self._given_costs = True
        self.profile = profile
        return notes

    profile = None  #: the cost profile the rule decides with (``use_profile``), or ``None``: this machine's

    def draft_rows(self, draft_vocab: int | str | Sequence[int] | torch.Tensor | None) -> torch.Tensor | None:
        """The draft's kept vocabulary rows for a ``draft_vocab`` setting (``None`` for the full vocabulary)."""
        if draft_vocab == "auto":  # resolved once per decoder; a failure is said once and remembered
            if "auto" not in self._draft_rows:
                from .draftvocab import auto_size

                size, rows = auto_size(self.pair), None
                try:
                    rows = self.draft_rows(size) if size else None
                except PacerError as e:  # e.g. the corpus is not installed: draft from the full vocabulary
                    import sys

                    print(f"pacer: note: drafting from the full vocabulary ({e})", file=sys.stderr)
                self._draft_rows["auto"] = rows
            return self._draft_rows["auto"]
        if isinstance(draft_vocab, str):
            raise PacerError(f"draft_vocab must be auto or a number of tokens, got {draft_vocab!r}")
        if draft_vocab is None or (isinstance(draft_vocab, int) and draft_vocab == 0):
            return None
        if isinstance(draft_vocab, bool):
            raise PacerError(f"draft_vocab must be a number of tokens, got {draft_vocab!r}")
        if isinstance(draft_vocab, int):
            from .draftvocab import load_or_build

            if draft_vocab not in self._draft_rows:
                self._draft_rows[draft_vocab] = load_or_build(self.pair, draft_vocab)
            return self._draft_rows[draft_vocab]
        return torch.as_tensor(list(draft_vocab), dtype=torch.long, device="cpu")

    # ------------------------------------------------------------------------------------------------ inputs
    def encode(self, prompt: str | Sequence[int], chat: bool = False, history: Sequence[dict] = ()) -> list[int]:
        """Token ids of ``prompt`` (a string, or token ids: integers below the models' vocabulary, checked);
        ``chat`` applies the chat template to a string, after ``history`` (earlier ``{"role", "content"}``
        messages)."""
        if not isinstance(prompt, str):
            vocab = min(self.vocab, self.draft_info.vocab_size) if self.draft_info is not None else self.vocab
            ids = check_prompt_ids(prompt, vocab)
        else:
            if not prompt.strip():
                raise PacerError("the prompt is empty; pass some text")
            if self.tokenizer is None:
                raise PacerError("this model pair has no tokenizer; pass token ids instead of text")
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise PacerError("a chat prompt needs a chat template, and the target's tokenizer has none")
                msgs = [*check_history(history), {"role": "user", "content": prompt}]
                ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                         return_dict=False)
                if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                    ids = ids["input_ids"]
                ids = list(ids)
            else:
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        if not ids:
            raise PacerError("the prompt is empty; pass some text")
        if len(ids) >= self.target.context:
            raise ContextError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.target.context}; "
                f"shorten the prompt"
            )
        return ids

    # ------------------------------------------------------------------------------------- methods
    def make_policy(self, method: str | MethodRequest, rows: torch.Tensor | None = None,
                    **settings) -> DraftPolicy:
        """The draft-length policy of a :class:`~pacer.request.MethodRequest` (or of a method's name with its
        settings and options as keywords, :meth:`MethodRequest.of`), for draft vocabulary ``rows``.

        Under the cost-aware rule (:attr:`MethodRequest.aware`) the policy is wrapped in the rule of
        :mod:`pacer.policies.cost_aware` on this machine's costs for ``rows``: a rule's threshold gives way to it
        (an explicit one is kept), and ``min_draft`` defaults to 0, so a round where nothing pays is a plain
        decoding step. A literal rule (``gamma``, a threshold) of a method whose drafter adds priced work to a
        round (:attr:`~pacer.methods.registry.Method.extras`: Ouroboros' phrases and branches) keeps its length,
        and that work is priced on the same costs (``CostAwarePolicy(length=False)``) unless ``cost_aware`` is
        false."""
        req = MethodRequest.of(method, **settings)
        if not req.drafts:
            raise PacerError(f"method '{req.method}' drafts nothing and has no draft-length policy")
        aware = req.aware
        policy = req.record.policy(methods.Build(self.pair, req.policy_options, req.bounds, req.gamma, aware, rows))
        length = aware
        if not aware and not (req.cost_aware is None and req.record.extras):
            return policy
        cal = self.calibration(rows)
        costs = replace(cal.costs, policy_per_check=policy.check_seconds)
        # what the rule learned about this method on this pair carries over to its next generation (keyed by the
        # drafter's options too: what its branches yield is that drafter's; the vocabulary is in the rows' size)
        size = None if rows is None else len(rows)
        bounds = req.bounds
        drafter = sorted((k, v) for k, v in req.drafter_options.items() if k != "draft_vocab")
        key = "|".join(map(str, (req.method, sorted(req.policy_options.items()), drafter, bounds.get("min_draft"),
                                 bounds.get("max_draft"), size, req.gamma, length)))
        memory = self._cost_memory.setdefault(key, CostMemory())
        # costs given to the Decoder (or a profile's) are taken as they are; measured ones follow the loop's timings
        return CostAwarePolicy(policy, costs, source=cal.source,
                               refine=0.2 if cal.source in ("measured", "cache") else 0.0, memory=memory,
                               length=length)

    def make_drafter(self, method: str | MethodRequest, **settings) -> Drafter:
        """The drafter of a :class:`~pacer.request.MethodRequest` (or of a method's name with its options as
        keywords); ``draft_vocab`` (every method) overrides the decoder's reduced draft vocabulary."""
        req = MethodRequest.of(method, **settings)
        m = req.record
        if not m.drafts:
            raise PacerError(f"method '{req.method}' drafts nothing")
        if self.draft_info is None and m.needs_draft:
            raise PacerError(f"method '{req.method}' needs a draft model")
        options = dict(req.drafter_options)
        rows = self.draft_rows(options.pop("draft_vocab", self.draft_vocab)) if m.needs_draft else None
        if m.drafter is None:
            return TokenDrafter(self.draft_backend(rows), self.vocab)
        return m.drafter(methods.Build(self.pair, options, rows=rows))

    # ------------------------------------------------------------------------------------------- generation
    def generate(
        self,
        prompt: str | Sequence[int],
        method: str | MethodRequest = "sd",
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        gamma: int | None = None,
        min_draft: int | None = None,
        max_draft: int | None = None,
        stop: str | Sequence[str] = (),
        chat: bool = False,
        history: Sequence[dict] = (),
        on_tokens: Callable[[list[int]], None] | None = None,
        policy: DraftPolicy | None = None,
        drafter: Drafter | None = None,
        reference: list[int] | None = None,
        options: Mapping[str, object] | None = None,
        cost_aware: bool | None = None,
    ) -> GenerationResult:
        """Generate from ``prompt`` with ``method``: a :class:`~pacer.request.MethodRequest`, or a method's name
        (:func:`pacer.methods.names`) with ``gamma``, ``min_draft``, ``max_draft``, ``cost_aware`` and
        ``options`` (see :mod:`pacer.request`: ``gamma`` is the draft length of ``sd``/``ouroboros``, their cap when
        cost-aware, default 4; ``options`` the method's own, e.g. ``threshold``, ``ngram``, and ``draft_vocab``;
        the cost-aware rule is on unless ``gamma`` or a threshold is given). See :class:`GenerationStats`.

        ``policy`` / ``drafter``: use these instead of the method's. ``reference`` (the target's greedy output for
        this prompt) spares a policy that ``needs_reference`` (the oracle) its own plain-decoding run.

        ``stop``: a stop string or a list of them (one string is one stop string; an empty one is refused). Every
        argument is checked before the models run: a wrong type raises a ``TypeError``, a refused value a
        ``ValueError`` (both :class:`~pacer.errors.PacerError`, with a one-line message).
        """
        sampling = SamplingConfig() if sampling is None else sampling
        stop = check_stop(stop)
        if on_tokens is not None and not callable(on_tokens):
            raise InvalidType(f"on_tokens must be a function of the new token ids, got {on_tokens!r}")
        req = MethodRequest.of(method, gamma=gamma, min_draft=min_draft, max_draft=max_draft,
                               cost_aware=cost_aware, options=options)
        check_generation(req, max_new_tokens, sampling)
        method = req.method
        ids = self.encode(prompt, chat, history)
        budget = min(max_new_tokens, self.target.context - len(ids))
        stats = GenerationStats(method=method, prompt_tokens=len(ids))
        out = Output(budget, self.eos, stop, self.tokenizer, on_tokens)
        extra: dict = {}
        with torch.inference_mode():
            if not req.drafts:
                autoregressive_generate(self.target, ids, out, sampling, stats)
            else:
                drafter = drafter or self.make_drafter(req)
                policy = policy or self.make_policy(req, drafter.vocab_rows())
                policy.prepare(sampling.greedy)
                if policy.needs_reference:
                    if reference is None:
                        reference = self.generate(ids, "ar", max_new_tokens, sampling, stop=stop).token_ids
                    policy.set_reference(drafter.agreement(ids, reference))
                speculative_generate(self.target, drafter, policy, ids, out, sampling, stats)
                drafter.finish()
                if (rep := drafter.report()) is not None:
                    extra["drafter"] = rep
                extra.update(policy.report())
        stats.new_tokens = len(out.ids)
        # a budget cut short by the context window ends as "length" inside Output; report it as "context"
        cut = out.finish_reason == "length" and budget < max_new_tokens
        stats.finish_reason = "context" if cut else out.finish_reason
        text = self.decode(out.ids, stop)
        return GenerationResult(text, list(out.ids), stats, extra)

    def decode(self, ids: Sequence[int], stop: str | Sequence[str] = ()) -> str:
        """The text of ``ids``, cut before the first stop string (``stop``: one string or a list)."""
        stop = check_stop(stop)
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text


def generate(prompt: str, method: str | MethodRequest = "sd", target: str = "default-target",
             draft: str = "default-draft", dtype: str = "auto", threads: int | None = None, backend: str = "auto",
             **kwargs) -> GenerationResult:
    """One-shot: load the pair (the draft only where the method drafts with it), generate, return a
    :class:`GenerationResult` (text, token_ids, stats). ``kwargs``: :meth:`Decoder.generate`'s."""
    settings = {k: kwargs.pop(k) for k in ("gamma", "min_draft", "max_draft", "cost_aware", "options") if k in kwargs}
    request = MethodRequest.of(method, **settings)
    spec = LoadSpec(target, draft if request.loads_draft else None, backend, dtype, threads)
    return Decoder.load(spec).generate(prompt, request, **kwargs)


def check_generation(request: MethodRequest, max_new_tokens: int, sampling: SamplingConfig | None = None) -> None:
    """What a generation adds to its :class:`~pacer.request.MethodRequest` (checked in its constructor): the
    token budget and the sampling settings the method takes (the CLI and the server call it before loading)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise InvalidType(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if max_new_tokens <= 0:
        raise InvalidValue(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise InvalidType(f"sampling must be a pacer.SamplingConfig, got {sampling!r}")
    request.check_sampling(sampling)

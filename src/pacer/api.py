"""The Python API: :class:`Decoder` keeps a loaded pair for many calls; :func:`generate` is the one-shot form.

Example::

    from pacer import Decoder
    dec = Decoder.from_pretrained()                      # the default offline pair, bf16, all cores
    res = dec.generate("def quicksort(arr):", method="pacer", max_new_tokens=64)
    print(res.text, res.stats.tokens_per_s, res.stats.tau)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from . import models
from .costs import ContextCosts, Costs
from .decoding import Drafter, GenerationResult, Output, autoregressive_generate, speculative_generate
from .decoding.stats import GenerationStats
from .errors import InvalidType, InvalidValue
from .factory import MethodFactory
from .methods import DEFAULT_METHOD, resolve_default
from .methods.default import shipped_layer
from .pair import LoadSpec, Pair
from .policies.base import DraftPolicy
from .pricing import Pricer
from .prompt import check_prompt_ids, check_stop
from .request import GenerationRequest, MethodRequest
from .sampling import SamplingConfig


def _of(part: str, name: str) -> property:
    """A read-only attribute of a decoder's ``part`` (its pair or its method factory), read through, not copied."""
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``")


class Decoder:
    """A target model, an optional draft model and their tokenizer (a :class:`~pacer.pair.Pair`), loaded once for
    many generations, with what the methods keep between them (a :class:`~pacer.factory.MethodFactory`: costs,
    draft vocabularies, what the cost-aware rule learned)."""

    def __init__(self, target: models.LoadedModel | Pair, draft: models.LoadedModel | None = None,
                 threads: int | None = None, draft_vocab: int | str | Sequence[int] | None = "auto",
                 costs: Costs | ContextCosts | None = None, progress: bool = True, draft_quant: str = "none",
                 quantize: str = "none", device: str | torch.device | None = "auto") -> None:
        """``target``: a loaded :class:`~pacer.pair.Pair`, or a target model (with ``draft``, ``threads``,
        ``device``, ``quantize`` and ``draft_quant``, checked once by :meth:`~pacer.pair.LoadSpec.loaded`).

        ``draft_vocab``: the default reduced draft vocabulary of every drafting method (:mod:`pacer.draftvocab`):
        ``"auto"`` 32,768 tokens where the draft's vocabulary is large enough for that to pay, else the full one;
        ``None``/0 the full vocabulary; an int ``S`` the ``S`` most frequent tokens of the held-out corpus; or ids.
        ``costs``: the forward costs the cost-aware rule decides on (:mod:`pacer.costs`; a
        :class:`~pacer.costs.ContextCosts` prices each round at the context it runs at; by default measured on this
        machine once and cached, :mod:`pacer.calibration`). ``draft_quant``: ``"int8"`` runs the draft int8
        weight-only (:mod:`pacer.quantize`; lossless: the draft only proposes), ``"auto"`` where that measures
        faster here, ``"none"`` as loaded. ``quantize="int8"`` quantizes the target: a *different target*, whose
        plain decoding is the baseline then (opt-in)."""
        self.pair = target if isinstance(target, Pair) else Pair(target, draft, threads, device, quantize,
                                                                  draft_quant)
        self.methods = MethodFactory(self.pair, draft_vocab, costs, progress)

    device, threads, backend, record = (_of("pair", n) for n in ("device", "threads", "backend", "record"))
    target, target_info, draft_info = (_of("pair", n) for n in ("target", "target_info", "draft_info"))
    tokenizer, vocab, eos = (_of("pair", n) for n in ("tokenizer", "vocab", "eos"))
    draft_backend, encode, decode = (_of("pair", n) for n in ("draft_backend", "encode", "decode"))
    draft_vocab, progress, calibration = (_of("methods", n) for n in ("draft_vocab", "progress", "calibration"))
    use_profile, draft_rows = _of("methods", "use_profile"), _of("methods", "draft_rows")
    make_policy, make_drafter, make_pricer, pricer_of = (_of("methods", n) for n in ("make_policy", "make_drafter",
                                                                                       "make_pricer", "pricer_of"))

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
    def load(cls, spec: LoadSpec, costs: Costs | ContextCosts | None = None) -> Decoder:
        """The decoder of a :class:`~pacer.pair.LoadSpec` (resolved and checked once, then loaded)."""
        return cls(spec.load(), draft_vocab=spec.draft_vocab, costs=costs, progress=spec.progress)

    # ------------------------------------------------------------------------------------------- generation
    def _resolved(self, method: object, options: Mapping[str, object] | None) -> object:
        """``method``, or the default's layer-free sibling where it is the default's name and this pair has no
        pre-verifier (none shipped for its draft, no option ``path``): :func:`pacer.methods.resolve_default`."""
        if not (isinstance(method, str) and method == DEFAULT_METHOD) or "path" in (options or {}):
            return method
        d = self.pair.draft_info
        return resolve_default(method, d is not None and shipped_layer(d.backend, d.fingerprint))

    def generate(
        self,
        prompt: str | Sequence[int],
        method: str | MethodRequest | GenerationRequest = DEFAULT_METHOD,
        max_new_tokens: int | None = None,
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
        pricer: Pricer | None = None,
        reference: list[int] | None = None,
        options: Mapping[str, object] | None = None,
        cost_aware: bool | None = None,
    ) -> GenerationResult:
        """Generate from ``prompt`` with ``method`` (default :data:`pacer.methods.DEFAULT_METHOD`, its layer-free
        sibling where the pair has no pre-verifier: :func:`pacer.methods.resolve_default`): a
        :class:`~pacer.request.GenerationRequest` (checked already:
        nothing else may be given beside it), a :class:`~pacer.request.MethodRequest`, or a method's name
        (:func:`pacer.methods.names`) with ``gamma``, ``min_draft``, ``max_draft``, ``cost_aware`` and ``options``
        (:mod:`pacer.request`: ``gamma`` is the draft length of ``sd``/``ouroboros``, their cap when cost-aware,
        default 4; ``options`` the method's own, e.g. ``threshold``, ``ngram``, ``draft_vocab``; the cost-aware rule
        is on unless ``gamma`` or a threshold is given); ``max_new_tokens``: 128 by default; ``sampling``: a
        :class:`SamplingConfig` (temperature, top-k, top-p, seed and ``verify``, how a sampled round's draft is
        verified: ``"token"`` or ``"block"``), ``None`` greedy. ``policy`` /
        ``drafter`` / ``pricer`` (:mod:`pacer.pricing`; a policy not built by :meth:`make_policy` is unpriced unless
        its pricer is given): use these instead of the method's. ``reference`` (the
        target's greedy output for this prompt)
        spares a policy that ``needs_reference`` (the oracle) its own plain-decoding run. See
        :class:`GenerationStats`. ``stop``: a stop string or a list of them (one string is one stop string; an
        empty one is refused). Every argument is checked before the models run: a wrong type raises a
        ``TypeError``, a refused value a ``ValueError`` (both :class:`~pacer.errors.PacerError`, one line)."""
        stop = check_stop(stop)
        if on_tokens is not None and not callable(on_tokens):
            raise InvalidType(f"on_tokens must be a function of the new token ids, got {on_tokens!r}")
        if not isinstance(chat, bool):
            raise InvalidType(f"chat must be true or false, got {chat!r}")
        job = GenerationRequest.of(self._resolved(method, options), max_new_tokens, sampling, gamma=gamma,
                                   min_draft=min_draft, max_draft=max_draft, cost_aware=cost_aware, options=options)
        req, max_new_tokens = job.request, job.max_new_tokens
        reference = check_overrides(req, policy, drafter, reference, self.pair.vocab)
        sampling = SamplingConfig() if job.sampling is None else job.sampling
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
                rows, verify = drafter.vocab_rows(), "token" if sampling.greedy else sampling.verify
                policy = policy or self.make_policy(req, rows, verify)
                pricer = pricer or self.pricer_of(policy)  # the cost rule's, where the factory built one
                policy.prepare(sampling.greedy)
                if policy.needs_reference:
                    if reference is None:
                        reference = self.generate(ids, "ar", max_new_tokens, sampling, stop=stop).token_ids
                    policy.set_reference(drafter.agreement(ids, reference))
                speculative_generate(self.target, drafter, policy, ids, out, sampling, stats, pricer)
                drafter.finish()
                if (rep := drafter.report()) is not None:
                    extra["drafter"] = rep
                extra.update(pricer.summary())  # a literal rule's priced extras (the cost rule reports its own)
                extra.update(policy.report())
        stats.new_tokens = len(out.ids)
        # a budget cut short by the context window ends as "length" inside Output; report it as "context"
        cut = out.finish_reason == "length" and budget < max_new_tokens
        stats.finish_reason = "context" if cut else out.finish_reason
        text = self.decode(out.ids, stop)
        return GenerationResult(text, list(out.ids), stats, extra)


def check_overrides(req: MethodRequest, policy: object, drafter: object, reference: object,
                    vocab: int) -> list[int] | None:
    """:meth:`Decoder.generate`'s ``policy``, ``drafter`` (each of its type, for a method that drafts) and
    ``reference`` (token ids of the pair's vocabulary) checked; returns the reference as a list."""
    for name, value, kind in (("policy", policy, DraftPolicy), ("drafter", drafter, Drafter)):
        if value is not None and not isinstance(value, kind):
            raise InvalidType(f"{name} must be a {kind.__module__}.{kind.__name__} (or None: the method's own), got "
                              f"{type(value).__name__}")
    if (policy is not None or drafter is not None) and not req.drafts:
        raise InvalidValue(f"method '{req.method}' drafts nothing: a policy or drafter would not be used; pass a "
                           f"drafting method")
    if reference is None:
        return None
    try:  # the target's greedy token ids for this prompt (what the oracle drafts against)
        return check_prompt_ids(reference, vocab)
    except (InvalidType, InvalidValue) as e:
        raise type(e)(f"reference (the target's greedy token ids): {e}") from None


def generate(prompt: str, method: str | MethodRequest = DEFAULT_METHOD, target: str = "default-target",
             draft: str = "default-draft", dtype: str = "auto", threads: int | None = None, backend: str = "auto",
             **kwargs) -> GenerationResult:
    """One-shot: check the request, load the pair (the draft only where the method drafts with it), generate, return
    a :class:`GenerationResult` (text, token_ids, stats). ``kwargs``: :meth:`Decoder.generate`'s."""
    settings = {k: kwargs.pop(k) for k in ("gamma", "min_draft", "max_draft", "cost_aware", "options") if k in kwargs}
    job = GenerationRequest.of(method, kwargs.pop("max_new_tokens", None), kwargs.pop("sampling", None), **settings)
    spec = LoadSpec(target, draft if job.request.loads_draft else None, backend, dtype, threads)
    dec = Decoder.load(spec)
    if (resolved := dec._resolved(method, settings.get("options"))) != method:  # the default, without its layer
        job = GenerationRequest.of(resolved, job.max_new_tokens, job.sampling, **settings)
    return dec.generate(prompt, job, **kwargs)

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

from . import devices, methods, models
from .calibration import Calibration
from .costs import CostAwarePolicy, CostMemory, Costs
from .decoding import (
    Drafter,
    GenerationResult,
    ModelBackend,
    Output,
    TokenDrafter,
    autoregressive_generate,
    speculative_generate,
)
from .decoding.meter import DRAFT, TARGET, metered
from .errors import ContextError, PacerError
from .policies import DraftPolicy
from .sampling import SamplingConfig
from .stats import GenerationStats

END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>")


class Decoder:
    """A target model, an optional draft model and their tokenizer, loaded once for many generations."""

    def __init__(self, target: models.LoadedModel, draft: models.LoadedModel | None = None,
                 threads: int | None = None, draft_vocab: int | str | Sequence[int] | None = "auto",
                 costs: Costs | None = None, progress: bool = True, draft_quant: str = "none",
                 quantize: str = "none", device: str | torch.device | None = "auto") -> None:
        """``draft_vocab``: the default reduced draft vocabulary of every drafting method (see
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
        84 ms a token).

        ``device``: ``auto`` (CUDA when available, else the CPU), ``cpu`` or ``cuda`` (see :mod:`pacer.devices`);
        the ``transformers`` models are moved there (in place)."""
        from . import quantize as q

        q.check_kind(quantize)
        if draft_quant != "auto":
            q.check_kind(draft_quant)
        check_quantize(target.backend, quantize, draft_quant)
        self.device = devices.place(target, draft, device, quantize, draft_quant)
        self.threads = models.set_threads(threads)
        self.draft_vocab = draft_vocab
        self.progress = progress
        self._calibrations: dict[int | None, Calibration] = {}
        if costs is not None:
            self._calibrations[None] = Calibration(costs, source="given")
        self._given_costs = costs is not None
        self._cost_memory: dict[str, CostMemory] = {}
        self._draft_rows: dict[int | str, torch.Tensor | None] = {}
        self.target_info = target
        self.draft_info = draft
        self.tokenizer = target.tokenizer
        if draft is not None and target.tokenizer is not None and draft.tokenizer is not None:
            models.check_same_tokenizer(target.tokenizer, draft.tokenizer)
        if quantize == "int8":
            q.quantize_int8(target.model)
        if draft is not None and draft_quant == "int8":
            q.quantize_int8(draft.model)
        elif draft is not None and draft_quant == "auto" and draft.backend == "transformers":
            from .calibration import choose_draft_quant

            if choose_draft_quant(draft) == "int8":
                q.quantize_int8(draft.model)
        self.backend = target.backend
        self.target: ModelBackend = metered(target.open(), TARGET)  # its forwards go to a generation's ledger
        self.vocab = target.vocab_size
        self.eos = models.eos_ids(target)
        if self.tokenizer is not None:
            vocab = self.tokenizer.get_vocab()
            self.eos.update(vocab[t] for t in END_TOKENS if t in vocab)
        self._preverifiers: dict[str, object] = {}

    @classmethod
    def from_pretrained(cls, target: str = "default-target", draft: str | None = "default-draft",
                        dtype: str = "auto", threads: int | None = None, progress: bool = True,
                        draft_vocab: int | str | Sequence[int] | None = "auto", draft_quant: str = "auto",
                        quantize: str = "none", backend: str = "auto",
                        device: str | torch.device | None = "auto") -> Decoder:
        """Load a pair: ``default-target``/``default-draft``, HF model folders or ``.gguf`` files (see
        :meth:`__init__` for ``draft_quant``, by default ``"auto"`` here, and ``quantize``). ``backend``:
        ``transformers`` (PyTorch), ``llamacpp`` (GGUF files run by llama.cpp, see :data:`pacer.models.BACKENDS`;
        ``dtype`` does not apply there) or ``auto`` (llama.cpp for a GGUF pair when llama-cpp-python is installed,
        :func:`pacer.models.resolve_backend`; on a CUDA ``device``, transformers). ``device``: see :mod:`pacer.devices`
        (checked before anything loads). ``dtype="auto"``: the transformers backend's weights in the dtype
        :func:`pacer.machine.choose_dtype` measures faster on this machine."""
        from .quantize import check_kind

        check_kind(quantize)
        if draft_quant != "auto":
            check_kind(draft_quant)
        backend = models.resolve_backend(devices.backend_for(backend, device), target, draft,
                                         quantize=quantize, draft_vocab=draft_vocab)
        models.check_backend(backend, target, draft)
        check_quantize(backend, quantize, draft_quant)
        dev = devices.check_device(device, backend, quantize, draft_quant)
        models.set_threads(threads)
        if dtype == "auto":  # the transformers backend's weights dtype, measured on this machine
            from .machine import choose_dtype

            dtype = choose_dtype(dev, progress=progress)[0] if backend == "transformers" else "bfloat16"
        t = models.load_model(target, dtype, progress=progress, backend=backend)
        d = models.load_model(draft, dtype, progress=progress, backend=backend) if draft else None
        return cls(t, d, threads, draft_vocab, progress=progress, draft_quant=draft_quant, quantize=quantize,
                   device=device)

    def calibration(self, rows: torch.Tensor | None = None, refresh: bool = False) -> Calibration:
        """This machine's costs for this pair with draft vocabulary ``rows`` (cached; see
        :mod:`pacer.calibration`). Costs given to the constructor are used for every vocabulary."""
        if self._given_costs:
            return self._calibrations[None]
        key = None if rows is None else len(rows)
        if refresh or key not in self._calibrations:
            from .calibration import load_or_measure

            cal = load_or_measure(self, rows, refresh=refresh, progress=self.progress)
            for note in cal.notes:
                print(f"pacer: note: {note}", file=sys.stderr)
            self._calibrations[key] = cal
        return self._calibrations[key]

    def use_profile(self, profile) -> list[str]:
        """Decide with another machine's measured costs (a :class:`pacer.profiles.Profile` of this pair and
        backend; refused otherwise): the cost-aware rule takes the profile's curve (not refined by this
        machine's timings). Returns notes on softer differences (the draft's dtype or vocabulary)."""
        from .profiles import pair_of

        notes = profile.check_pair(*pair_of(self))
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

                size, rows = auto_size(self), None
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
                self._draft_rows[draft_vocab] = load_or_build(self, draft_vocab)
            return self._draft_rows[draft_vocab]
        return torch.as_tensor(list(draft_vocab), dtype=torch.long, device="cpu")

    # ------------------------------------------------------------------------------------------------ inputs
    def encode(self, prompt: str | Sequence[int], chat: bool = False, history: Sequence[dict] = ()) -> list[int]:
        """Token ids of ``prompt`` (a string, or ids passed through); ``chat`` applies the chat template."""
        if not isinstance(prompt, str):
            ids = [int(i) for i in prompt]
        else:
            if not prompt.strip():
                raise PacerError("the prompt is empty; pass some text")
            if self.tokenizer is None:
                raise PacerError("this model pair has no tokenizer; pass token ids instead of text")
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise PacerError("a chat prompt needs a chat template, and the target's tokenizer has none")
                msgs = [*history, {"role": "user", "content": prompt}]
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
    def draft_backend(self, rows: torch.Tensor | None = None) -> ModelBackend:
        """A fresh backend (its own cache) on the draft model, scoring vocabulary ``rows`` (``None``: all)."""
        if self.draft_info is None:
            raise PacerError("this method needs a draft model")
        return metered(self.draft_info.open(rows), DRAFT)

    def make_policy(self, method: str, gamma: int | None = None, min_draft: int | None = None,
                    max_draft: int | None = None, cost_aware: bool | None = None,
                    rows: torch.Tensor | None = None, **opts) -> DraftPolicy:
        """The draft-length policy behind ``method`` with its policy options (e.g. ``threshold``).

        ``cost_aware`` (``None``: unless ``gamma`` or an option that pins a literal rule, such as a threshold, is
        given): wrap the policy in the cost-aware rule of :mod:`pacer.costs` on this machine's costs for draft
        vocabulary ``rows``. Then a rule's threshold gives way to the cost rule (an explicit one is kept), and
        ``min_draft`` defaults to 0, so a round where nothing pays is a plain decoding step."""
        m = methods.get(method)
        if not m.drafts:
            raise PacerError(f"method '{method}' drafts nothing and has no draft-length policy")
        policy_opts, drafter_opts = m.split(opts)
        if drafter_opts:
            raise PacerError(f"method '{method}': {', '.join(drafter_opts)} are drafter options (make_drafter)")
        explicit = gamma is not None or m.explicit(policy_opts)
        aware = (not explicit) if cost_aware is None else bool(cost_aware)
        if aware and min_draft is None:
            min_draft = 0
        bounds = {k: v for k, v in (("min_draft", min_draft), ("max_draft", max_draft)) if v is not None}
        policy = m.policy(methods.Build(self, policy_opts, bounds, gamma, aware, rows))
        if not aware:
            return policy
        cal = self.calibration(rows)
        costs = replace(cal.costs, policy_per_check=policy.check_seconds)
        # what the rule learned about this method on this pair carries over to its next generation
        size = None if rows is None else len(rows)
        key = "|".join(map(str, (method, sorted(policy_opts.items()), min_draft, max_draft, size)))
        memory = self._cost_memory.setdefault(key, CostMemory())
        # costs given to the Decoder (or a profile's) are taken as they are; measured ones follow the loop's timings
        return CostAwarePolicy(policy, costs, source=cal.source,
                               refine=0.2 if cal.source in ("measured", "cache") else 0.0, memory=memory)

    def make_drafter(self, method: str, **opts) -> Drafter:
        """The drafter of ``method`` with its drafter options; ``draft_vocab`` (every method) overrides the
        decoder's reduced draft vocabulary for this drafter."""
        m = methods.get(method)
        if not m.drafts:
            raise PacerError(f"method '{method}' drafts nothing")
        if self.draft_info is None and m.needs_draft:
            raise PacerError(f"method '{method}' needs a draft model")
        policy_opts, drafter_opts = m.split(opts)
        if policy_opts:
            raise PacerError(f"method '{method}': {', '.join(policy_opts)} are policy options (make_policy)")
        rows = self.draft_rows(drafter_opts.pop("draft_vocab", self.draft_vocab)) if m.needs_draft else None
        if m.drafter is None:
            return TokenDrafter(self.draft_backend(rows), self.vocab)
        return m.drafter(methods.Build(self, drafter_opts, rows=rows))

    # ------------------------------------------------------------------------------------------- generation
    def generate(
        self,
        prompt: str | Sequence[int],
        method: str = "sd",
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        gamma: int | None = None,
        min_draft: int | None = None,
        max_draft: int | None = None,
        stop: Sequence[str] = (),
        chat: bool = False,
        history: Sequence[dict] = (),
        on_tokens: Callable[[list[int]], None] | None = None,
        policy: DraftPolicy | None = None,
        drafter: Drafter | None = None,
        reference: list[int] | None = None,
        options: Mapping[str, object] | None = None,
        cost_aware: bool | None = None,
    ) -> GenerationResult:
        """Generate from ``prompt`` with ``method`` (a name in :func:`pacer.methods.names`); see
        :class:`GenerationStats`.

        ``gamma``: the draft length of ``sd``/``ouroboros`` (their cap when cost-aware; default 4), the initial
        length of ``heuristic``. ``options``: the method's own options (:attr:`pacer.methods.Method.options`, e.g.
        ``threshold``, ``ngram``) and ``draft_vocab``. ``cost_aware``: see :meth:`make_policy` (default: on unless
        ``gamma`` or a threshold is given). ``policy`` / ``drafter``: use these instead of the method's.
        ``reference`` (the target's greedy output for this prompt) spares a policy that ``needs_reference`` (the
        oracle) its own plain-decoding run.
        """
        sampling = sampling or SamplingConfig()
        m, policy_opts, drafter_opts = check_request(method, max_new_tokens, gamma, min_draft, max_draft, sampling,
                                                     options or {})
        ids = self.encode(prompt, chat, history)
        budget = min(max_new_tokens, self.target.context - len(ids))
        stats = GenerationStats(method=method, prompt_tokens=len(ids))
        out = Output(budget, self.eos, stop, self.tokenizer, on_tokens)
        extra: dict = {}
        with torch.inference_mode():
            if not m.drafts:
                autoregressive_generate(self.target, ids, out, sampling, stats)
            else:
                drafter = drafter or self.make_drafter(method, **drafter_opts)
                policy = policy or self.make_policy(method, gamma, min_draft, max_draft, cost_aware,
                                                    drafter.vocab_rows(), **policy_opts)
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

    def decode(self, ids: Sequence[int], stop: Sequence[str] = ()) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text


def generate(prompt: str, method: str = "sd", target: str = "default-target", draft: str = "default-draft",
             dtype: str = "auto", threads: int | None = None, backend: str = "auto",
             **kwargs) -> GenerationResult:
    """One-shot: load the pair, generate, return a :class:`GenerationResult` (text, token_ids, stats)."""
    return Decoder.from_pretrained(target, draft if methods.get(method).loads_draft else None, dtype, threads,
                                   backend=backend).generate(prompt, method, **kwargs)


def check_quantize(backend: str, quantize: str, draft_quant: str) -> None:
    """pacer's int8 weight-only quantization is a ``transformers``-backend feature (a GGUF file brings its own)."""
    if backend != "transformers" and (quantize != "none" or draft_quant not in ("none", "auto")):
        raise PacerError(f"--quantize/--draft-quant apply to the transformers backend; the {backend} backend runs "
                         f"the GGUF file's own quantization (pass a quantized GGUF instead)")


def check_request(method: str, max_new_tokens: int, gamma: int | None = None, min_draft: int | None = None,
                  max_draft: int | None = None, sampling: SamplingConfig | None = None,
                  options: Mapping[str, object] = ()) -> tuple[methods.Method, dict, dict]:
    """Every argument of a generation checked before anything runs (the CLI calls it before loading models);
    returns the method's record and its checked options split into (policy, drafter) ones. One place per concept:
    the bounds, the sampling settings, the method's options."""
    m = methods.get(method)
    if max_new_tokens <= 0:
        raise PacerError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for o, v in zip(methods.COMMON, (gamma, min_draft, max_draft), strict=False):
        if v is not None:
            o.check(v, method)
    if min_draft is not None and max_draft is not None and min_draft > max_draft:
        raise PacerError(f"min_draft ({min_draft}) must not exceed max_draft ({max_draft})")
    if m.greedy_only and sampling is not None and not sampling.greedy:
        raise PacerError(f"the {method} method is defined for greedy decoding only (temperature 0)")
    return (m, *m.split(dict(options)))

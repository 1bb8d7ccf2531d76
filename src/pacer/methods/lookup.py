"""``lookup``: prompt-lookup drafting (:mod:`pacer.drafters.lookup`), no draft model, with the fixed rule whose
survival score is the lookup's confidence (:class:`pacer.policies.rules.LookupPolicy`)."""

from __future__ import annotations

from ..drafters.lookup import LookupDrafter
from ..policies.rules import LookupPolicy
from .registry import MAX_KEY, MAX_PHRASE, Build, Method, Option, register


def _policy(b: Build) -> LookupPolicy:
    return LookupPolicy(gamma=8 if b.gamma is None else b.gamma, **b.bounds)


def _drafter(b: Build) -> LookupDrafter:
    return LookupDrafter(b.pair.vocab, **b.options, device=b.pair.target.device)


register(Method("lookup", "prompt lookup: drafts the continuation of the longest matching n-gram of the prompt and "
                "output (no draft model; drafted tokens cost no forward)", _policy, _drafter,
                options=(Option("ngram", int, "ouroboros / lookup: phrase length (default 6 / 8)", to="drafter",
                                minimum=1, maximum=MAX_PHRASE),
                         Option("key_len", int, "ouroboros / lookup: longest n-gram key (default 2 / 3)",
                                to="drafter", minimum=1, maximum=MAX_KEY)),
                needs_draft=False))

"""The default method: one constant every entry point reads (``pacer generate``, ``pacer demo``, ``pacer serve``,
the OpenAI server's requests, :meth:`pacer.Decoder.generate`, :func:`pacer.generate`); ``--method`` (or the
``method`` argument) overrides it.

:data:`DEFAULT_METHOD` is PACER under the cost rule: it drafts with the draft model where that pays on this machine's
measured costs and decodes plainly wherever no draft pays (the steep llama.cpp curve of few CPU cores), so it is
never slower than plain decoding by more than its bookkeeping. Phrase drafting (``pacer+ouroboros``) is not the
default: on llama.cpp its phrase rounds cost more than the rule prices them (the held-out report
``docs/bench/readme/llamacpp-zen4``). It decides with PACER's trained layer; a pair without one (a draft the shipped
checkpoints were not trained for, and no ``--preverifier``) runs its layer-free sibling, :data:`WITHOUT_LAYER`,
under the same cost rule (:func:`resolve_default`), so that the default never fails for want of a checkpoint."""

from __future__ import annotations

#: the method every entry point runs unless told otherwise
DEFAULT_METHOD = "pacer"
#: the method with PACER's layer -> the same drafter under the fixed rule (the cost-aware rule decides its length)
WITHOUT_LAYER = {"pacer": "sd", "pacer+ouroboros": "ouroboros"}


def resolve_default(method: str, has_layer: bool) -> str:
    """``method``, or its layer-free sibling where it is :data:`DEFAULT_METHOD` and the pair has no pre-verifier
    (``has_layer``: a shipped checkpoint trained for this draft, or one given as the option ``path``)."""
    return method if has_layer or method != DEFAULT_METHOD else WITHOUT_LAYER.get(method, method)


def shipped_layer(backend: str, draft_fingerprint: str | None) -> bool:
    """Whether a shipped ``pacer`` checkpoint of ``backend`` was trained for the draft of ``draft_fingerprint``."""
    from ..errors import PacerError
    from ..policies.learned import default_checkpoint, read_config

    try:
        cfg, _ = read_config(default_checkpoint("pacer", backend), whole=False)
    except (PacerError, OSError):
        return False
    return draft_fingerprint is not None and cfg.get("draft_fingerprint") == draft_fingerprint

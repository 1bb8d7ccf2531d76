"""The default method: one constant every entry point reads (``pacer generate``, ``pacer demo``, ``pacer serve``,
the OpenAI server's requests, :meth:`pacer.Decoder.generate`, :func:`pacer.generate`); ``--method`` (or the
``method`` argument) overrides it.

:data:`DEFAULT_METHOD` is the cost-aware method that decodes plainly wherever no draft pays on this machine's
measured costs and drafts phrases where text repeats. It decides with PACER's trained layer; a pair without one
(a draft the shipped checkpoints were not trained for, and no ``--preverifier``) runs its layer-free sibling,
:data:`WITHOUT_LAYER`, under the same cost-aware rule (:func:`resolve_default`), so that the default never fails for
want of a checkpoint."""

from __future__ import annotations

#: the method every entry point runs unless told otherwise
DEFAULT_METHOD = "pacer+ouroboros"
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

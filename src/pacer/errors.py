"""The one error type the CLI turns into a one-line message and exit status 2 (and the server into HTTP 400)."""


class PacerError(Exception):
    """Bad input or an unusable file: the message says what is wrong and what to do."""


class ContextError(PacerError):
    """A prompt longer than the model's context (a benchmark skips such a question instead of stopping)."""


class InvalidValue(PacerError, ValueError):
    """An argument of the right type whose value is refused (out of range, empty, unknown): a ``ValueError`` for a
    Python caller, a one-line error (exit 2, HTTP 400) for the command line and the server."""


class InvalidType(PacerError, TypeError):
    """An argument of the wrong type: a ``TypeError`` for a Python caller, a one-line error (exit 2, HTTP 400) for
    the command line and the server."""


class NonFiniteLogits(PacerError):
    """A model's forward gave logits that are NaN or ``+inf`` (or a row with nothing scored): no token can be chosen
    from them, so decoding stops instead of emitting arbitrary ids (:func:`pacer.decoding.backend.finite`)."""

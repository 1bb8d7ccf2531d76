"""The one error type the CLI turns into a one-line message and exit status 2."""


class PacerError(Exception):
    """Bad input or an unusable file: the message says what is wrong and what to do."""


class ContextError(PacerError):
    """A prompt longer than the model's context (a benchmark skips such a question instead of stopping)."""

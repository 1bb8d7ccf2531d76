"""The one error type the CLI turns into a one-line message and exit status 2."""


class PacerError(Exception):
    """Bad input or an unusable file: the message says what is wrong and what to do."""

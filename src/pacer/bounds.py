"""The range of every whole-number setting pacer reads from a command line or a configuration, checked where it is
parsed: a size that allocates, loops or is computed up front (a training width, a shard of prompts, benchmark
passes, a phrase length) has a maximum as well as a minimum, and a value outside is a one-line error naming the
bound, before any model loads.

:class:`Count` is the one declaration: an ``argparse`` type for a command-line flag (``type=Count("--repeats", 1,
MAX_REPEATS)``) and, through :meth:`Count.check`, the check of a setting read from elsewhere (the vLLM proposer's
settings). A method option declares its range on :class:`pacer.methods.Option` (``minimum`` / ``maximum``) and gets
its flag's :class:`Count` from :meth:`Count.of`."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from .errors import PacerError

#: the most new tokens a generation, a benchmark turn or a collection prompt may ask for (no model pacer runs has a
#: longer context)
MAX_NEW_TOKENS = 1 << 20
#: the longest context a measurement may ask for (a forward there holds that many cached tokens)
MAX_CONTEXT = 1 << 20
#: top-k's largest meaningful value is the vocabulary (the largest vocabularies hold about 262,144 tokens)
MAX_TOP_K = 1 << 22
#: the seeds a generator takes (:class:`pacer.sampling.SamplingConfig`)
MIN_SEED, MAX_SEED = -(1 << 63), (1 << 64) - 1
#: intra-op threads (more than any machine has cores)
MAX_THREADS = 4096
#: questions per dataset, prompts of a collection, prompts skipped (the packaged sets hold a few thousand)
MAX_PROMPTS = 1 << 20
#: passes of a benchmark over its questions (each pass is a full benchmark; a spread needs a handful)
MAX_REPEATS = 1000
#: prompts per collection shard (a shard is held in memory until written)
MAX_SHARD = 4096
#: training epochs
MAX_EPOCHS = 100_000
#: the width and rank of a pre-verification layer (the shipped ones are 64 and 8; the weights grow as their square)
MAX_WIDTH = 4096
#: requests that may wait in the server's queue
MAX_QUEUE = 1 << 16
#: a TCP port
MAX_PORT = 65535
#: the longest phrase, n-gram key and candidate a phrase option may ask for (the defaults are 2-16 tokens; the pools
#: hold an entry per key length and position, each with its continuation, so these sizes bound their memory)
MAX_PHRASE, MAX_KEY = 64, 16
#: the largest phrase pool (entries, each a key and its continuation: at most about 100 MB)
MAX_POOL = 200_000


class BoundError(PacerError):
    """A whole number outside its setting's range (or not a whole number). Not a ``ValueError``: ``argparse`` would
    turn one into "invalid value" and drop the message; this one reaches the command line's one-line error."""


@dataclass(frozen=True)
class Count:
    """A whole-number setting ``name`` (a flag, ``--repeats``, or a setting's name) in ``minimum..maximum``; ``why``
    says what the maximum is (shown in the error)."""

    name: str
    minimum: int
    maximum: int
    why: str = "the most pacer takes"

    @classmethod
    def of(cls, option: Any) -> Count:
        """The flag of a method option (:class:`pacer.methods.Option` of type ``int``), with its declared range."""
        return cls(option.cli_flag, int(option.minimum), int(option.maximum))

    def __call__(self, text: str) -> int:
        """The value of a command-line flag (argparse's ``type``)."""
        try:
            value = int(str(text).strip(), 10)
        except ValueError:
            raise BoundError(f"{self.name} takes a whole number in {self.minimum}..{self.maximum}, got {text!r}") \
                from None
        return self.check(value)

    def check(self, value: Any, where: str = "") -> int:
        """``value`` as an ``int`` when it is a whole number (not a bool, a float or a string) within range, else a
        one-line :class:`BoundError` naming the bound (``where``: where the setting is set, added to the message)."""
        said = f"; set {where}" if where else ""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise BoundError(f"{self.name} takes a whole number in {self.minimum}..{self.maximum}, got "
                             f"{_show(value)}{said}")
        value = int(value)
        if value < self.minimum:
            raise BoundError(f"{self.name} must be >= {self.minimum}, got {value}{said}")
        if value > self.maximum:
            raise BoundError(f"{self.name} must be <= {self.maximum} ({self.why}), got {value}{said}")
        return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def non_finite(tensors: Any) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` (a mapping of names to tensors, or a module's
    ``named_parameters()``) holding a NaN or an infinity, else ``None``: weights that would score every draft token
    NaN (a comparison with NaN is false, so a rule would silently stop or go on) are refused where they are made and
    where they are loaded."""
    import torch

    items = tensors.items() if hasattr(tensors, "items") else tensors
    for name, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None

"""The committed output of a generation (:class:`Output`) and what a generation returns (:class:`GenerationResult`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import PacerError
from .stats import GenerationStats


class Output:
    """Committed output: appends tokens one by one and stops exactly at EOS, a stop string or ``max_new_tokens``."""

    def __init__(
        self,
        max_new_tokens: int,
        eos: set[int],
        stop_strings: Sequence[str] = (),
        tokenizer=None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.ids: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        self.on_tokens = on_tokens
        self.finish_reason = ""
        if self.stop_strings and tokenizer is None:
            raise PacerError("stop strings need a tokenizer")

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.ids)

    def extend(self, new: list[int]) -> list[int]:
        """Append tokens until a stop condition holds; returns the tokens actually appended."""
        taken = []
        for x in new:
            if self.done:
                break
            self.ids.append(x)
            taken.append(x)
            if x in self.eos:
                self.finish_reason = "eos"
            elif self.stop_strings and any(s in self.tokenizer.decode(self.ids) for s in self.stop_strings):
                self.finish_reason = "stop"
            elif len(self.ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        if taken and self.on_tokens:
            self.on_tokens(taken)
        return taken


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict(), **self.extra}

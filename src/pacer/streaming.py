"""Text as tokens are committed: what may be shown of a generation so far, so that the pieces joined equal the
final text (used by ``pacer generate`` and ``pacer serve``'s streaming)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


class TextStreamer:
    """Writes text as tokens are committed, holding back incomplete UTF-8 sequences and anything that may
    begin a stop string; :meth:`finish` writes the rest, so the written text equals the result's ``text``.
    ``stream``: anything with ``write`` and ``flush`` (``None``: standard output at write time)."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), stream=None) -> None:
        self.tok = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.printed = 0
        self.stream = stream  # None: sys.stdout at write time (so redirections made later are honoured)

    def _write(self, text: str) -> None:
        out = self.stream or sys.stdout
        out.write(text)
        out.flush()

    def __call__(self, new: list[int]) -> None:
        self.ids += new
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        end = len(text)
        for s in self.stop:
            if s in text:
                end = min(end, text.index(s))
            else:  # hold back a suffix that may grow into this stop string
                end = min(end, next((len(text) - j for j in range(len(s) - 1, 0, -1) if text.endswith(s[:j])),
                                    len(text)))
        while end > self.printed and text[end - 1] == "\ufffd":  # an incomplete UTF-8 sequence so far
            end -= 1
        if end > self.printed:
            self._write(text[self.printed : end])
            self.printed = end

    def finish(self, text: str) -> None:
        """Print what is still held back of the final ``text``."""
        self._write(text[self.printed :])
        self.printed = len(text)

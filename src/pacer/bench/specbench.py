"""Answers in Spec-Bench's files: one JSONL per method, as its ``evaluation/speed.py`` reads them.

A Spec-Bench answer line holds ``question_id``, ``category``, ``answer_id``, ``model_id``, ``tstamp`` and
``choices[0]`` with per-turn ``turns`` (text), ``new_tokens``, ``wall_time``, ``decoding_steps`` and one flat list
``accept_lengths`` (tokens per target call, ``n_t + 1``, over all turns). ``speed.py`` takes a method's file and the
baseline's (``ar``) file: tokens/s per answer is ``Σ new_tokens / Σ wall_time``, the baseline's tokens are counted
by re-tokenizing its text, **minus one per turn** for a BOS token - on a model without BOS (Qwen) that undercounts
the baseline's tokens and inflates every speedup by about ``1 / mean tokens per turn`` (~1-2% at 64-128 tokens).
GSM8K questions carry Spec-Bench's category ``math_reasoning``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..io import atomic_write_text
from .metrics import per_turn_accept_lengths

FIELDS = ("turns", "new_tokens", "wall_time", "decoding_steps")


def specbench_line(rec: dict) -> dict:
    c = rec["choices"][0]
    choice = {"index": 0, **{k: c[k] for k in FIELDS if k in c},
              "accept_lengths": [a for t in per_turn_accept_lengths(rec) for a in t]}
    return {"question_id": rec["question_id"], "category": rec["category"], "answer_id": rec.get("answer_id"),
            "model_id": rec["method"], "tstamp": rec.get("tstamp"), "choices": [choice]}


def file_name(method: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", method) + ".jsonl"


def export(records: list[dict], folder: Path) -> list[Path]:
    """Write ``records`` as Spec-Bench answer files under ``folder`` (each atomically, and only once every file's
    lines are made: a record that cannot be exported leaves nothing written); returns the files."""
    repeats = sorted({int(r.get("repeat", 0)) for r in records})
    texts: dict[Path, str] = {}
    for rep in repeats:
        base = Path(folder) if len(repeats) == 1 else Path(folder) / f"run_{rep + 1}"
        methods = list(dict.fromkeys(r["method"] for r in records if int(r.get("repeat", 0)) == rep))
        for m in methods:
            lines = [specbench_line(r) for r in records if r["method"] == m and int(r.get("repeat", 0)) == rep]
            texts[base / file_name(m)] = "".join(json.dumps(x) + "\n" for x in lines)
    made = []
    try:
        for path, text in texts.items():
            new = not path.exists()
            atomic_write_text(path, text)
            if new:
                made.append(path)
    except OSError:  # a full disk, say: no partial export is left (the files this export made are removed)
        for path in made:
            path.unlink(missing_ok=True)
        raise
    return list(texts)

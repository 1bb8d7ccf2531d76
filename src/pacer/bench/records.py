"""The answers file: one JSON object per finished (question, method, repeat), appended with flush + fsync.

A kill can leave at most a torn *last* line; :func:`read_answers` skips it and :func:`repair` drops it
(rewriting the file atomically) before new lines are appended, so the next record never glues onto a torn
one. A bad line anywhere else means the file was edited by hand or damaged: that is an error naming the
line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import PacerError
from ..io import atomic_write_text


def record_key(rec: dict) -> tuple[str, str, str, int]:
    return (str(rec["dataset"]), str(rec["question_id"]), str(rec["method"]), int(rec.get("repeat", 0)))


def read_answers(path: Path) -> tuple[list[dict], bool]:
    """``(records, torn)``: every complete record; ``torn`` is True when a torn last line was skipped."""
    path = Path(path)
    if not path.exists():
        return [], False
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    records: list[dict] = []
    torn = False
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = no == len(lines)  # no newline after it: the write did not finish
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
            record_key(rec)
        except (ValueError, KeyError, TypeError) as e:
            if last:
                torn = True
                continue
            raise PacerError(f"{path}:{no}: damaged answer record ({e}); remove that line to resume") \
                from None
        if last:  # a complete JSON object without its newline still counts as torn (kill between the two)
            torn = True
        records.append(rec)
    return records, torn


def repair(path: Path) -> list[dict]:
    """Read the answers and, if the last line is torn, rewrite the file without it (atomically)."""
    records, torn = read_answers(path)
    if torn:
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return records


def append(path: Path, rec: dict) -> None:
    """Append one record as a line and make it durable (flush + fsync) before returning."""
    line = json.dumps(rec) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())

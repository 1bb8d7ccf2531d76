"""The answers file: one JSON object per finished (question, method, repeat), appended with flush + fsync.

A kill can leave at most a torn *last* line; :func:`read_answers` skips it and :func:`repair` drops it
(rewriting the file atomically) before new lines are appended, so the next record never glues onto a torn
one. A bad line anywhere else means the file was edited by hand or damaged: that is an error naming the
line.

:func:`read_answers` is the one checked reader of the file: every record's fields are of the type and shape the
report, ``--reprice``, ``--recheck-lossless`` and the Spec-Bench export read (:func:`check_record`); each record
carries the sha256 of the rest of itself (``sha256``, :func:`sign`: a per-line checksum, so that a run appending
line by line keeps the file valid), which must match, and a run whose ``run.json`` says its records are signed
(``answers_signed``) has no record without one; no key appears twice; and no record's ``lossless`` verdict is taken
on trust: it is recomputed from the token ids against ``ar``'s (:func:`check_verdicts`), which also covers the
records of runs made before the checksum existed. A record edited by hand is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import PacerError
from ..io import BadJson, atomic_write_text, loads_json, read_bytes

#: the label of the baseline every output is compared with, and of the anchor (another backend's plain decoding,
#: not compared): :mod:`pacer.bench.methods`
AR, ANCHOR = "ar", "ar@llamacpp"


#: the field holding a record's checksum
DIGEST = "sha256"


class BadRecord(PacerError):
    """An answer record that cannot be read as pacer wrote it; the message names the field."""


def digest(rec: dict) -> str:
    """The sha256 of a record without its own checksum (canonical JSON)."""
    return hashlib.sha256(json.dumps({k: v for k, v in rec.items() if k != DIGEST}, sort_keys=True).encode()) \
        .hexdigest()


def sign(rec: dict) -> dict:
    """``rec`` with the checksum of its content (every record pacer writes carries one)."""
    rec[DIGEST] = digest(rec)
    return rec


def record_key(rec: dict) -> tuple[str, str, str, int]:
    return (str(rec["dataset"]), str(rec["question_id"]), str(rec["method"]), int(rec.get("repeat", 0)))


def _show(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v: Any, least: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


#: the most seconds a record's turn or forward may hold (a turn of 11 days is no measurement; a larger figure, 1e308
#: say, would make a clock's overhead, wall time minus the forwards' seconds, hugely negative)
MAX_SECONDS = 1e6


def _is_seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS


def _per_turn(c: dict, key: str, turns: int, ok, what: str, required: bool = False) -> None:
    """``c[key]``: one entry per turn, each passing ``ok``."""
    if key not in c and not required:
        return
    v = c.get(key)
    if not isinstance(v, list) or len(v) != turns or not all(ok(x) for x in v):
        ref = "turns" if "turns" in c else "token_ids"
        raise BadRecord(f"choices[0].{key} is {'missing' if key not in c else _show(v)} (want {what}, one per turn: "
                        f"{turns} as choices[0].{ref} has)")


def _ints(v: Any, least: int = 0) -> bool:
    return isinstance(v, list) and all(_is_int(x, least) for x in v)


def _call(x: Any) -> bool:
    """One recorded forward: ``[role, k, context, tree, seconds(, rows)]`` (``Call.to_list``)."""
    return (isinstance(x, list) and len(x) in (5, 6) and x[0] in ("t", "d") and _is_int(x[1], 1)
            and _is_int(x[2]) and (isinstance(x[3], bool) or x[3] in (0, 1)) and _is_seconds(x[4])
            and (len(x) == 5 or _is_int(x[5])))


def check_record(rec: Any) -> dict:
    """``rec`` if it is an answer record as :func:`pacer.bench.runner.make_record` writes it (the fields the readers
    index, of their types, one entry per turn, each turn's ``new_tokens`` its token ids' count), else
    :class:`BadRecord` naming the field."""
    if not isinstance(rec, dict):
        raise BadRecord(f"it is {_show(rec)}, not an object")
    for key in ("dataset", "method", "category"):
        if not isinstance(rec.get(key), str) or not rec[key]:
            raise BadRecord(f"{key} is {'missing' if key not in rec else _show(rec[key])} (want a string)")
    if not isinstance(rec.get("question_id"), str | int) or isinstance(rec.get("question_id"), bool):
        raise BadRecord(f"question_id is {_show(rec.get('question_id'))} (want a string)")
    if not _is_int(rec.get("repeat", 0)):
        raise BadRecord(f"repeat is {_show(rec.get('repeat'))} (want an integer >= 0)")
    for key in ("answer_id", "model_id", "question_sha256", DIGEST):
        if key in rec and not isinstance(rec[key], str):
            raise BadRecord(f"{key} is {_show(rec[key])} (want a string)")
    if not isinstance(rec.get("lossless"), bool | None) or not isinstance(rec.get("divergence"), dict | None):
        raise BadRecord(f"lossless/divergence are {_show(rec.get('lossless'))}/{_show(rec.get('divergence'))} "
                        f"(want true, false or null / an object or null)")
    choices = rec.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadRecord(f"choices is {'missing' if 'choices' not in rec else _show(choices)} (want a list of one "
                        f"object per answer)")
    c = choices[0]
    # the turns: their texts where kept (Spec-Bench's field), else the token ids
    ref = c.get("turns", c.get("token_ids"))
    if not isinstance(ref, list) or not ref:
        key = "turns" if "turns" in c else "token_ids"
        raise BadRecord(f"choices[0].{key} is {'missing' if key not in c else _show(ref)} (want one entry per "
                        f"turn)")
    n = len(ref)
    _per_turn(c, "wall_time", n, _is_seconds, f"seconds, at most {MAX_SECONDS:g}", True)
    _per_turn(c, "token_ids", n, _ints, "lists of token ids", True)
    _per_turn(c, "new_tokens", n, _is_int, "token counts", True)
    if [len(t) for t in c["token_ids"]] != c["new_tokens"]:
        raise BadRecord(f"choices[0].new_tokens {_show(c['new_tokens'])} do not count its token ids "
                        f"({[len(t) for t in c['token_ids']]})")
    for key in c:
        if key.endswith("_time") and key != "wall_time":  # a clock's seconds (profile_time, own_time)
            _per_turn(c, key, n, lambda x: isinstance(x, int | float) and not isinstance(x, bool)
                      and math.isfinite(x), "seconds")
    acc = c.get("accept_lengths")
    if not isinstance(acc, list) or not (_ints(acc, 1) or all(_ints(t, 1) for t in acc)):
        raise BadRecord(f"choices[0].accept_lengths is {_show(acc)} (want tokens per target call)")
    _per_turn(c, "accept_lengths_per_turn", n, lambda x: _ints(x, 1), "lists of tokens per target call")
    _per_turn(c, "draft_lengths", n, _ints, "lists of draft lengths")
    for key in ("target_calls", "draft_forwards", "decoding_steps"):
        _per_turn(c, key, n, _is_int, "counts")
    _per_turn(c, "turns", n, lambda x: isinstance(x, str), "texts")
    _per_turn(c, "finish_reason", n, lambda x: isinstance(x, str), "strings")
    _per_turn(c, "calls", n, lambda t: isinstance(t, list) and all(_call(x) for x in t),
              f"lists of [role, k, context, tree, seconds <= {MAX_SECONDS:g}, rows] forwards")
    for t, (calls, wall) in enumerate(zip(c.get("calls") or [], c["wall_time"], strict=False)):
        # the forwards ran within the turn's wall time (each figure rounded to a microsecond)
        if (spent := sum(x[4] for x in calls)) > wall + 1e-6 * (len(calls) + 1):
            raise BadRecord(f"choices[0].calls of turn {t + 1} take {spent:.6g} s, more than its wall_time "
                            f"{wall:.6g} s (the forwards run within it)")
    _per_turn(c, "breakdown", n, lambda b: isinstance(b, dict) and all(_is_seconds(v) for v in b.values()),
              "objects of seconds")
    _per_turn(c, "drafter", n, lambda d: isinstance(d, dict | None), "objects")
    return rec


def first_difference(ids: list[list[int]], ar_ids: list[list[int]]) -> tuple[int, int] | None:
    """``(turn, index)`` of the first token where an output differs from ``ar``'s (turn by turn, as
    :func:`pacer.bench.runner.check_lossless` compares them), ``None`` where it does not."""
    for t, (a, b) in enumerate(zip(ids, ar_ids, strict=False)):
        if a != b:
            return t, next((i for i, (x, y) in enumerate(zip(b, a, strict=False)) if x != y), min(len(a), len(b)))
    return None


def check_verdicts(records: list[dict], greedy: bool | None = None) -> str | None:
    """Why the ``lossless`` verdicts of ``records`` cannot be what pacer wrote (``None``: they can): each verdict
    is recomputed from the record's token ids against ``ar``'s for the same question and repeat (and a ``false``
    one's divergence must name the first differing turn and token). ``greedy``: the run decoded greedily, so every
    output but ``ar``'s and the anchor's has a verdict (``False``: sampled, so none has; ``None``: not known)."""
    ar = {(r["dataset"], str(r["question_id"]), r.get("repeat", 0)): r for r in records if r["method"] == AR}
    for i, r in enumerate(records):
        v = r.get("lossless")
        name = f"record {i + 1} ({r['method']} on {r['dataset']}/{r['question_id']}, repeat {r.get('repeat', 0)})"
        base = ar.get((r["dataset"], str(r["question_id"]), r.get("repeat", 0)))
        if v is None:
            if greedy and r["method"] not in (AR, ANCHOR) and base is not None:
                return f"{name} has no lossless verdict in a greedy run"
            continue
        if r["method"] in (AR, ANCHOR) or greedy is False:
            return f"{name} has a lossless verdict, which {'a sampled run' if greedy is False else 'it'} never has"
        if base is None:
            return f"{name} has a lossless verdict but no ar record to be compared with"
        diff = first_difference(r["choices"][0]["token_ids"], base["choices"][0]["token_ids"])
        if v != (diff is None):
            return (f"{name} says lossless: {json.dumps(v)}, but its token ids "
                    + ("equal ar's" if diff is None else f"differ from ar's at turn {diff[0] + 1}, token {diff[1]}"))
        d = r.get("divergence")
        if diff is not None and (not isinstance(d, dict) or d.get("turn", diff[0]) != diff[0]
                                 or d.get("index", diff[1]) != diff[1]):
            return f"{name}'s divergence {_show(d)} is not where its token ids first differ from ar's {list(diff)}"
        if diff is None and d is not None:
            return f"{name} is lossless but records a divergence"
    return None


def read_answers(path: Path, greedy: bool | None = None, signed: bool = False) -> tuple[list[dict], bool]:
    """``(records, torn)``: every complete record, each checked (:func:`check_record`, its checksum; ``signed``:
    each must carry one) and the verdicts with them (:func:`check_verdicts`; ``greedy`` as there); ``torn`` is True
    when a torn last line was skipped."""
    path = Path(path)
    if not path.exists():
        return [], False
    text = read_bytes(path, "the answers file", "restore it or start a new --out").decode("utf-8", errors="replace")
    lines = text.split("\n")
    records: list[dict] = []
    seen: dict[tuple, int] = {}
    torn = False
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = no == len(lines)  # no newline after it: the write did not finish
        try:
            rec = check_record(loads_json(line, "the record", ""))
        except (BadJson, BadRecord) as e:
            if last:
                torn = True
                continue
            if isinstance(e, BadRecord):
                raise PacerError(f"{path}:{no}: damaged answer record: {e}; restore the file or remove that "
                                 f"line") from None
            raise PacerError(f"{path}:{no}: damaged answer record ({e.reason}); remove that line to resume") \
                from None
        want = rec.get(DIGEST)
        if (want is None and signed) or (want is not None and want != digest(rec)):
            raise PacerError(f"{path}:{no}: answer record changed by hand ("
                             + ("its sha256 does not match its content" if want else "no sha256, which every record "
                                "of this run carries") + "); restore the file or start a new --out")
        if record_key(rec) in seen:
            raise PacerError(f"{path}:{no}: answer record {'/'.join(map(str, record_key(rec)))} appears twice (line "
                             f"{seen[record_key(rec)]} too); restore the file or start a new --out")
        seen[record_key(rec)] = no
        if last:  # a complete JSON object without its newline still counts as torn (kill between the two)
            torn = True
        records.append(rec)
    if (why := check_verdicts(records, greedy)) is not None:
        raise PacerError(f"{path}: {why}: the file was changed by hand; restore it or start a new --out")
    return records, torn


def repair(path: Path, greedy: bool | None = None, signed: bool = False) -> list[dict]:
    """Read the answers (:func:`read_answers`) and, if the last line is torn, rewrite the file without it
    (atomically)."""
    records, torn = read_answers(path, greedy, signed)
    if torn:
        write_all(path, records)
    return records


def write_all(path: Path, records: list[dict]) -> None:
    """Write ``records`` as the answers file, atomically, each signed (:func:`sign`): a rewrite by pacer (a torn
    line dropped, a run re-priced or its divergences re-diagnosed) of records its reader accepted."""
    atomic_write_text(path, "".join(json.dumps(sign(r)) + "\n" for r in records))


def append(path: Path, rec: dict) -> None:
    """Append one record, signed (:func:`sign`), as a line and make it durable (flush + fsync) before returning."""
    line = json.dumps(sign(rec)) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        end = f.tell()
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        except OSError:  # a full disk, say: no part of the record is left behind
            f.truncate(end)
            raise

"""The priced oracle in ``pacer bench`` (:mod:`pacer.bench.oracle` defines it): a pass that records what each
drafter would propose at every position of plain decoding's output, and the report's columns that divide each
method's speedup by the oracle's.

**The pass** (:func:`record_oracle`, after the questions ran, greedy runs only): for every question answered by
``ar`` (repeat 0: a greedy continuation is the same in every repeat) and each of its turns, with the prompt ids as the
run built them, it finds ``L_draft`` (one teacher-forced draft forward over the prompt and ``ar``'s output, where the
run has a draft model: 2 draft forwards a turn, counted in ``draft_forwards``), ``L_lookup`` and ``L_phrase``
(pure text), prices
the oracle of every source set on the run's costs at each context (``--costs``' profile, else this machine's
calibration; no policy check: the oracle needs no policy) and appends one line per turn to ``oracle.jsonl``: the
positions' lengths, and per source set the oracle's and plain decoding's seconds and the oracle's rounds. A resumed
run records only the questions not there yet.

**A method's source set** (:func:`source_set`): ``draft`` (a draft model: ``sd``, the rules, ``pacer``, ...),
``lookup`` (pacer's ``lookup``), ``lookup@llamacpp:K`` (llama-cpp-python's prompt lookup of ``num_pred_tokens=K``:
its own candidates, :func:`peer_lengths`), ``draft+phrase`` (the
phrase drafters, which draft with the model and verify phrases of the text: ``phrase`` is the n-gram continuation
of the prompt and the output with the phrase pool's own n-gram and key lengths, at most its ``lookup_len`` tokens; its
warm pool and lookahead are not replayed); ``ar`` and the anchor have none.

**The report** (:func:`oracle_summary`): per question, the oracle's speedup ``s_o = W / (F + D · B / P)`` with
``ar``'s wall time ``W``, its first round ``F`` (the prefill, the same for every method) and the rest ``D``, and the
oracle's priced time ``B`` over plain decoding's ``P`` summed over the turns: the oracle's decoding, priced, scaled
onto ``ar``'s measured decoding; the method's speedup ``s_m`` (its tokens per second over ``ar``'s, as the report's
speedup); ``of_oracle = s_m / s_o``. Per group (overall, each kind): the means over the questions.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from .oracle import ContextCosts, Source, lookup_lengths, priced_oracle, run_lengths
from .peer import PEER

#: the file of the pass, in the run's folder
ORACLE_FILE = "oracle.jsonl"
#: the source sets the pass prices (:func:`source_set`)
SETS = {"draft": ("draft",), "lookup": ("lookup",), "draft+phrase": ("draft", "phrase")}


def source_set(label: str) -> str | None:
    """The source set of the method ``label`` (see the module docstring; ``None``: it drafts nothing)."""
    from .. import methods
    from .methods import ANCHOR, HF_ASSISTED

    name = label.split(":", 1)[0]
    if label == ANCHOR or name == "ar":
        return None
    if name == PEER:
        return peer_set(label)
    if name == "lookup":
        return "lookup"
    if name == HF_ASSISTED:
        return "draft"
    if name not in methods.names():
        return None
    m = methods.get(name)
    if not m.needs_draft:
        return "lookup"
    return "draft+phrase" if m.extras else "draft"


def peer_set(label: str) -> str:
    """The source set of a ``lookup@llamacpp`` method ``label``: its own, named by its ``num_pred_tokens``."""
    from .peer import DEFAULT_PRED_TOKENS, NUM_PRED_TOKENS

    opts = dict(p.split("=", 1) for p in label.split(":")[1:] if "=" in p)
    return f"{PEER}:{opts.get(NUM_PRED_TOKENS, DEFAULT_PRED_TOKENS)}"


def peer_lengths(prompt: list[int], reference: list[int], k: int) -> list[int]:
    """``L(i)`` of llama-cpp-python's prompt lookup with ``num_pred_tokens=k`` at every position of ``reference``:
    its own candidates after ``prompt + reference[:i]`` (``LlamaPromptLookupDecoding.find_candidate_pred_tokens``,
    its default n-gram size) compared with ``reference[i:]``."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    ngram = LlamaPromptLookupDecoding().max_ngram_size
    ids = np.array([*prompt, *reference], dtype=np.intc)
    out = []
    for i in range(len(reference)):
        n = 0
        for x in LlamaPromptLookupDecoding.find_candidate_pred_tokens(ids[: len(prompt) + i], ngram, k).tolist():
            if i + n >= len(reference) or x != reference[i + n]:
                break
            n += 1
        out.append(n)
    return out


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of an interrupted pass: that question is recorded again
        if isinstance(row, dict) and {"dataset", "question_id", "turn", "sets"} <= set(row):
            rows.append(row)
    return rows


def turn_row(prompt: list[int], reference: list[int], costs: ContextCosts,
             agree: list[bool] | None, peers: Sequence[str] = ()) -> dict:
    """One turn's line: the sources' lengths at every position and, per source set the run can price (``draft``
    only with the draft's agreement ``agree``; ``peers``: the ``lookup@llamacpp:K`` sets of the run's peers), the
    oracle's and plain decoding's seconds and its rounds by source."""
    from ..drafters.phrase import PhraseOptions

    phrase = PhraseOptions()
    sources = {"lookup": Source("lookup", tuple(lookup_lengths(prompt, reference)), free=True),
               "phrase": Source("phrase", tuple(lookup_lengths(prompt, reference, phrase.ngram, phrase.key_len,
                                                               phrase.lookup_len)), free=True)}
    if agree is not None:
        sources["draft"] = Source("draft", tuple(run_lengths(agree)))
    for name in peers:
        k = int(name.rsplit(":", 1)[1])
        sources[name] = Source(name, tuple(peer_lengths(prompt, reference, k)), free=True)
    sets = {}
    for name, parts in {**SETS, **{p: (p,) for p in peers}}.items():
        if all(p in sources for p in parts):
            path = priced_oracle(len(prompt), len(reference), [sources[p] for p in parts], costs)
            used: dict[str, int] = {}
            for _, src, _n in path.rounds:
                used[src] = used.get(src, 0) + 1
            sets[name] = {"seconds": path.seconds, "plain_seconds": path.plain_seconds, "rounds": used,
                          "tokens_per_round": len(reference) / max(1, len(path.rounds))}
    return {"prompt_tokens": len(prompt), "tokens": len(reference),
            "lengths": {k: list(s.agree) for k, s in sources.items()}, "sets": sets,
            "draft_forwards": 0 if agree is None else (2 if len(reference) > 1 else 1)}


def record_oracle(dec, questions: list, records: list[dict], costs: ContextCosts, out: Path,
                  log: Callable[[str], None] = print) -> int:
    """The pass of the module docstring over ``records`` (the run's) into ``out/oracle.jsonl``; returns the turns
    it recorded now."""
    from .runner import recorded_turns

    path = out / ORACLE_FILE
    done = {(r["dataset"], str(r["question_id"])) for r in _read(path)}
    by_key = {(q.dataset, str(q.question_id)): q for q in questions}
    drafter = dec.make_drafter("sd") if dec.draft_info is not None else None
    peers = sorted({peer_set(r["method"]) for r in records if r["method"].split(":", 1)[0] == PEER})
    made = 0
    for rec in records:
        key = (str(rec["dataset"]), str(rec["question_id"]))
        if rec["method"] != "ar" or int(rec.get("repeat", 0)) != 0 or key in done or key not in by_key:
            continue
        lines = []
        for t, turn in enumerate(recorded_turns(dec, by_key[key], rec)):
            ref = list(turn.token_ids)
            agree = drafter.agreement(turn.prompt_ids, ref) if drafter is not None and ref else None
            lines.append({"dataset": key[0], "question_id": key[1], "turn": t,
                          **turn_row(turn.prompt_ids, ref, costs, agree, peers)})
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
        done.add(key)
        made += len(lines)
    if made:
        log(f"pacer bench: priced oracle: {made} turn(s) recorded in {path}")
    return made


def _question_oracle(rows: list[dict], name: str) -> float | None:
    """``B / P`` of a question's turns for source set ``name`` (``None``: not priced)."""
    if not rows or any(name not in r["sets"] for r in rows):
        return None
    plain = sum(r["sets"][name]["plain_seconds"] for r in rows)
    return sum(r["sets"][name]["seconds"] for r in rows) / plain if plain > 0 else None


def oracle_summary(records: list[dict], methods: list[str], out: Path) -> dict | None:
    """The oracle's speedup and each method's share of it, per question and per group (the module docstring);
    ``None`` where the run has no ``oracle.jsonl``."""
    from .metrics import first_round_split, group_names, in_group, record_tokens_per_s, seconds

    rows = _read(out / ORACLE_FILE)
    if not rows:
        return None
    turns: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        turns.setdefault((str(r["dataset"]), str(r["question_id"])), []).append(r)
    ar = {(str(r["dataset"]), str(r["question_id"]), int(r.get("repeat", 0))): r for r in records
          if r["method"] == "ar"}
    questions = []
    for r in records:
        name = source_set(r["method"])
        key = (str(r["dataset"]), str(r["question_id"]))
        base = ar.get((*key, int(r.get("repeat", 0))))
        if name is None or base is None or r["method"] not in methods:
            continue
        ratio = _question_oracle(turns.get(key, []), name)
        split = first_round_split(base)
        wall, mine, theirs = seconds(base), record_tokens_per_s(r), record_tokens_per_s(base)
        if ratio is None or split is None or not wall or not theirs:
            continue
        s_o = wall / (split[0] + split[1] * ratio)
        s_m = mine / theirs
        questions.append({"dataset": key[0], "question_id": key[1], "category": r["category"],
                          "repeat": int(r.get("repeat", 0)), "method": r["method"], "sources": name,
                          "oracle_speedup": s_o, "speedup": s_m, "of_oracle": s_m / s_o})
    groups: dict[str, dict[str, dict]] = {}
    for g in group_names(records):
        for m in methods:
            mine = [q for q in questions if q["method"] == m and in_group(q, g)]
            if mine:
                groups.setdefault(g, {})[m] = {
                    "sources": mine[0]["sources"], "questions": len(mine),
                    "oracle_speedup": statistics.fmean(q["oracle_speedup"] for q in mine),
                    "of_oracle": statistics.fmean(q["of_oracle"] for q in mine),
                    "of_oracle_min": min(q["of_oracle"] for q in mine)}
    counts = {"turns": len(rows), "draft_forwards": sum(int(r.get("draft_forwards", 0)) for r in rows)}
    return {"groups": groups, "questions": questions, "pass": counts}


def oracle_markdown(oracle: dict) -> list[str]:
    """The report's section on the priced oracle."""
    def _f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    L = ["## Priced oracle\n",
         "The fastest rounds any policy could choose with each method's drafters on this run's costs at each "
         "context, knowing plain decoding's output (`pacer.bench.oracle`): *oracle* is its speedup over `ar` "
         "(its priced decoding scaled onto `ar`'s measured decoding, `ar`'s prefill kept), *of oracle* the "
         "method's speedup as a fraction of it (mean over questions; *min*: the lowest question). "
         f"The pass read {oracle['pass']['turns']} turn(s) with {oracle['pass']['draft_forwards']} draft "
         f"forward(s).\n",
         "| group | method | sources | questions | oracle | of oracle | min |", "|---|---|---|---|---|---|---|"]
    for g, ms in oracle["groups"].items():
        for m, s in ms.items():
            L.append(f"| {g} | {m} | {s['sources']} | {s['questions']} | {_f(s['oracle_speedup'])}x | "
                     f"{_f(s['of_oracle'])} | {_f(s['of_oracle_min'])} |")
    L += ["", "Per question:\n", "| question | kind | method | speedup | oracle | of oracle |",
          "|---|---|---|---|---|---|"]
    for q in oracle["questions"]:
        L.append(f"| {q['dataset']}/{q['question_id']} | {q['category']} | {q['method']} | {_f(q['speedup'])}x | "
                 f"{_f(q['oracle_speedup'])}x | {_f(q['of_oracle'])} |")
    L.append("")
    return L


"""The benchmark loop: warm-up, interleaved methods per question, one durable record per finished run, resume.

Order: for each repeat, for each question, ``ar`` runs first (it is the baseline and gives the token ids the
oracle drafts against and every other method is compared with), then the other methods in an order rotated by
one position per question of the same dataset (and per repeat), so slow drift of the machine hits every method
alike on every set. Each method runs all turns of a question in a row (the second turn sees that method's own first
answer).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ContextError, PacerError
from ..sampling import SamplingConfig
from . import records as rec_io
from .data import Question
from .hf import hf_assisted_generate
from .methods import HF_ASSISTED, MethodSpec
from .peer import PEER


@dataclass
class TurnOut:
    token_ids: list[int]
    text: str
    wall_time: float
    accept_lengths: list[int]  # tokens per target call (accepted draft tokens + 1), Spec-Bench's convention
    draft_lengths: list[int]
    target_calls: int
    draft_forwards: int
    finish_reason: str
    prompt_ids: list[int] = field(default_factory=list)
    calls: list = field(default_factory=list)  # the forwards (pacer.decoding.meter.Call); none for hf-assisted
    parts: dict = field(default_factory=dict)  # the wall time's breakdown (GenerationStats.breakdown)
    drafter: dict | None = None  # the drafter's report (GenerationResult.extra["drafter"]), where it gives one


def run_turn(dec, spec: MethodSpec, ids: list[int], max_new_tokens: int,
             reference: list[int] | None = None, sampling: SamplingConfig | None = None) -> TurnOut:
    """One generation of ``spec`` from prompt ids ``ids``: greedy, or with ``sampling`` (a seeded draw).
    ``reference`` feeds the oracle."""
    if spec.name == HF_ASSISTED:
        r = hf_assisted_generate(dec, ids, max_new_tokens, spec.opts)
        return TurnOut(r.token_ids, dec.decode(r.token_ids), r.wall_time, [n + 1 for n in r.accepted_counts],
                       r.draft_lengths, r.target_calls, r.draft_forwards, r.finish_reason, list(ids))
    if spec.name == PEER:  # dec is the peer's model (pacer.bench.peer.LlamaLookupPeer)
        out, wall, reason = dec.generate(ids, max_new_tokens, **spec.opts)
        return TurnOut(out, dec.dec.decode(out), wall, [], [], 0, 0, reason, list(ids))
    kwargs: dict = {}
    if reference is not None:  # read by a policy that needs it (the oracle), ignored by the others
        kwargs["reference"] = reference
    if sampling is not None:
        kwargs["sampling"] = spec.sampling(sampling)
    res = dec.generate(ids, spec.request(), max_new_tokens, **kwargs)
    st = res.stats
    return TurnOut(list(res.token_ids), res.text, st.wall_time, [n + 1 for n in st.accepted_counts],
                   list(st.draft_lengths), st.target_calls, st.draft_forwards, st.finish_reason, list(ids),
                   list(st.calls), st.breakdown(), res.extra.get("drafter"))


def turn_sampling(sampling: SamplingConfig | None, q: Question, repeat: int, turn: int) -> SamplingConfig | None:
    """The sampling of one turn: ``sampling`` (its temperature, its verification rule) with a seed of its own per
    (question, repeat, turn), the same for every method (each method draws from the same target distribution with
    the same seed)."""
    if sampling is None:
        return None
    return replace(sampling, seed=zlib.crc32(f"{sampling.seed}/{q.dataset}/{q.question_id}/{repeat}/{turn}".encode()))


def run_question(dec, spec: MethodSpec, q: Question, max_new_tokens: int,
                 references: list[list[int]] | None = None, sampling: SamplingConfig | None = None,
                 repeat: int = 0) -> list[TurnOut]:
    """All turns of ``q``; the history of turn ``t`` holds this method's own earlier answers. With ``sampling``
    each turn is a seeded draw (:func:`turn_sampling`)."""
    history: list[dict] = []
    outs: list[TurnOut] = []
    for t, prompt in enumerate(q.turns):
        ids = dec.encode(prompt, chat=q.chat, history=history)
        ref = None
        # the reference is ar's answer to the same conversation only while this method's answers equal ar's
        if references is not None and t < len(references) and all(
                o.token_ids == references[i] for i, o in enumerate(outs)):
            ref = references[t]
        outs.append(run_turn(dec, spec, ids, max_new_tokens, ref, turn_sampling(sampling, q, repeat, t)))
        history += [{"role": "user", "content": prompt}, {"role": "assistant", "content": outs[-1].text}]
    return outs


def recorded_turns(dec, q: Question, rec: dict) -> list[TurnOut]:
    """The turns of an answer record rebuilt with their prompt ids as :func:`run_question` built them (turn ``t``
    sees the method's own earlier answers); timings are not kept."""
    ch = rec["choices"][0]
    history: list[dict] = []
    outs = []
    for t, (prompt, text, ids) in enumerate(zip(q.turns, ch["turns"], ch["token_ids"], strict=False)):
        outs.append(TurnOut(list(ids), text, ch["wall_time"][t], [], [], 0, 0, "",
                            dec.encode(prompt, chat=q.chat, history=history)))
        history += [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
    return outs


def check_lossless(dec, outs: list[TurnOut], ar_ids: list[list[int]]) -> tuple[bool, dict | None]:
    """Compare with ``ar``'s token ids turn by turn; at the first differing turn, locate the first differing
    token and the target's top-2 logit gap there (plain scoring of the same prefix)."""
    from ..decoding import first_divergence

    for t, (o, ref) in enumerate(zip(outs, ar_ids, strict=False)):
        if o.token_ids == ref:
            continue
        dv = first_divergence(dec.target, o.prompt_ids, ref, o.token_ids)
        if dv is None:  # cannot happen (ids differ); keep the record honest anyway
            continue
        gap = None if math.isnan(dv.top2_gap) else round(dv.top2_gap, 5)
        return False, {"turn": t, "index": dv.index, "ar_token": dv.a, "token": dv.b, "top2_gap": gap,
                       "gap": None if math.isnan(dv.gap) else round(dv.gap, 5),
                       "resolution": dv.resolution, "noise": round(dv.noise, 5),
                       "near_tie": bool(gap is not None and dv.near_tie),
                       "describe": dv.describe(),
                       "ar_tokens": len(ref), "tokens": len(o.token_ids)}
    return True, None


def question_sha256(q: Question) -> str:
    """What a record answered: the exact turns and whether they went through the chat template."""
    return hashlib.sha256(json.dumps({"turns": list(q.turns), "chat": q.chat}).encode()).hexdigest()


def make_record(q: Question, spec: MethodSpec, repeat: int, outs: list[TurnOut]) -> dict:
    """One answer in Spec-Bench's shape (``choices[0]`` holds per-turn lists) plus our extra fields."""
    return {
        "question_id": q.question_id,
        "question_sha256": question_sha256(q),
        "category": q.category,
        "dataset": q.dataset,
        "answer_id": f"{spec.label}/{q.key}/{repeat}",
        "model_id": spec.label,
        "method": spec.label,
        "repeat": repeat,
        "tstamp": time.time(),
        "choices": [{
            "index": 0,
            "turns": [o.text for o in outs],
            "decoding_steps": [o.target_calls for o in outs],
            "new_tokens": [len(o.token_ids) for o in outs],
            "wall_time": [round(o.wall_time, 6) for o in outs],
            # Spec-Bench's shape: one flat list over the turns (its evaluation/speed.py averages it)
            "accept_lengths": [a for o in outs for a in o.accept_lengths],
            "accept_lengths_per_turn": [o.accept_lengths for o in outs],
            "draft_lengths": [o.draft_lengths for o in outs],
            "target_calls": [o.target_calls for o in outs],
            "draft_forwards": [o.draft_forwards for o in outs],
            "finish_reason": [o.finish_reason for o in outs],
            "token_ids": [o.token_ids for o in outs],
            # every forward ([role, k, context, tree, seconds, rows]) and the wall time's parts, per turn
            "calls": [[c.to_list() for c in o.calls] for o in outs],
            "breakdown": [{k: round(v, 6) for k, v in o.parts.items()} for o in outs],
            **({"drafter": [o.drafter for o in outs]} if any(o.drafter for o in outs) else {}),
        }],
        "lossless": None,
        "divergence": None,
    }


def rotated(others: list[MethodSpec], shift: int) -> list[MethodSpec]:
    if not others:
        return []
    k = shift % len(others)
    return others[k:] + others[:k]


def order_shifts(questions: list[Question]) -> list[int]:
    """The rotation of the other methods for each question: its position among the questions of its own dataset.
    (By its position in the whole list, datasets interleaved a-b-c-d-a-b-... and an even number of other methods
    would give every question of a set the same order: a set's figures would carry a position effect.)"""
    seen: dict[str, int] = {}
    shifts = []
    for q in questions:
        shifts.append(seen.get(q.dataset, 0))
        seen[q.dataset] = shifts[-1] + 1
    return shifts


def warm_up(dec, specs: list[MethodSpec], questions: Question | list[Question], max_new_tokens: int,
            skip_failing: bool, log=print, decoders: dict | None = None) -> list[MethodSpec]:
    """One short untimed generation per method (loads lazy parts, fills caches) on the first of ``questions`` whose
    first turn fits the context (one that does not is skipped here as the run skips it); a failing method is an
    error, or is dropped with a warning under ``skip_failing``. ``decoders``: label -> the decoder that runs it (the
    anchor's llama.cpp one), else ``dec``."""
    keep = []
    questions = [questions] if isinstance(questions, Question) else list(questions)
    for spec in specs:
        try:
            for q in questions:
                one = Question(q.dataset, q.question_id, q.category, q.turns[:1], q.chat)
                try:
                    run_question((decoders or {}).get(spec.label, dec), spec, one, min(8, max_new_tokens))
                    break
                except ContextError:
                    continue  # longer than the context: the run skips it; warm up on the next
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a colleague's method must become one clear line
            first = str(e).splitlines()[0] if str(e) else ""
            msg = f"method '{spec.label}' failed in the warm-up: {type(e).__name__}: {first}"
            if skip_failing and not spec.is_ar:
                log(f"pacer bench: warning: {msg}; dropped (--skip-failing)")
                continue
            hint = "" if spec.is_ar else "; drop it from --methods or pass --skip-failing"
            raise PacerError(msg + hint) from e
        keep.append(spec)
    return keep


class Bench:
    """Runs ``specs`` on ``questions`` into ``out/answers.jsonl`` (see the module docstring)."""

    def __init__(self, dec, specs: list[MethodSpec], questions: list[Question], out: Path,
                 max_new_tokens: int, repeats: int = 1, progress: bool = True,
                 sampling: SamplingConfig | None = None, clocks: dict | None = None,
                 decoders: dict | None = None, signed: bool = False) -> None:
        """``clocks``: name -> :class:`pacer.profiles.Profile`; each record gets ``NAME_time`` per turn, its
        forwards priced with that profile plus its own overhead (``profile``: the ``--costs`` profile, ``own``:
        this machine's calibration, which validates the pricing against the wall clock)."""
        self.dec = dec
        self.clocks = clocks or {}
        self.decoders = decoders or {}  # label -> the decoder that runs it (the anchor's llama.cpp one)
        self.sampling = sampling  # None: greedy, and every output is checked against ar's token by token
        self.specs = specs
        self.questions = questions
        self.out = out
        self.path = out / "answers.jsonl"
        self.max_new_tokens = max_new_tokens
        self.repeats = repeats
        self.progress = progress
        self.records = rec_io.repair(self.path, sampling is None, signed)  # signed: see records.read_answers
        self.done = {rec_io.record_key(r): r for r in self.records}
        want = {(q.dataset, q.question_id): question_sha256(q) for q in questions}
        for r in self.records:  # records made before question_sha256 existed cannot be checked
            k, h = (str(r["dataset"]), str(r["question_id"])), r.get("question_sha256")
            if h is not None and k in want and h != want[k]:
                raise PacerError(f"--resume: question {k[0]}/{k[1]} is not the one answered in {self.path} (its "
                                 f"text or chat form changed); use another --out")
        self.flagged = 0
        self.skipped: list[dict] = []  # anchor runs its backend could not make (said in the report)

    def key(self, q: Question, spec: MethodSpec, repeat: int) -> tuple[str, str, str, int]:
        return (q.dataset, q.question_id, spec.label, repeat)

    def units(self) -> tuple[int, int]:
        total = self.repeats * len(self.questions) * len(self.specs)
        finished = sum(1 for r in range(self.repeats) for q in self.questions for s in self.specs
                       if self.key(q, s, r) in self.done)
        return total, finished

    def _write(self, q: Question, spec: MethodSpec, repeat: int, outs: list[TurnOut], ar: dict | None,
               say) -> dict:
        rec = make_record(q, spec, repeat, outs)
        # hf-assisted runs outside the loop, the anchor on another backend: neither is priced with a profile
        if outs and all(o.calls for o in outs) and not spec.is_anchor:
            from ..profiles import clock

            for name, prof in self.clocks.items():
                rec["choices"][0][f"{name}_time"] = [round(clock(prof, o.wall_time, o.calls), 6) for o in outs]
        # a sampled output is a draw, the anchor another backend's output: neither is checked against ar
        if ar is not None and not spec.is_ar and not spec.is_anchor and self.sampling is None:
            ok, div = check_lossless(self.dec, outs, ar["choices"][0]["token_ids"])
            rec["lossless"], rec["divergence"] = ok, div
            if not ok:
                self.flagged += 1
                say(f"pacer bench: LOSSLESSNESS WARNING: {spec.label} differs from ar on {q.key} turn "
                    f"{div['turn'] + 1} at token {div['index']} (target {div['describe']})")
        rec_io.append(self.path, rec)
        self.done[rec_io.record_key(rec)] = rec
        self.records.append(rec)
        return rec

    def run(self) -> None:
        from tqdm import tqdm

        total, finished = self.units()
        bar = tqdm(total=total, initial=finished, file=sys.stderr, disable=not self.progress, unit="run",
                   dynamic_ncols=True, desc="bench")
        say = bar.write if self.progress else (lambda s: print(s, file=sys.stderr))
        ar_spec, others = self.specs[0], self.specs[1:]
        try:
            shifts = order_shifts(self.questions)
            for repeat in range(self.repeats):
                for qi, q in enumerate(self.questions):
                    ar = self.done.get(self.key(q, ar_spec, repeat))
                    order = [ar_spec, *rotated(others, shifts[qi] + repeat)]
                    for spec in order:
                        if self.key(q, spec, repeat) in self.done:
                            continue
                        bar.set_postfix_str(f"{q.key} {spec.label}"[:60])
                        refs = ar["choices"][0]["token_ids"] if ar is not None else None
                        try:
                            outs = run_question(self.decoders.get(spec.label, self.dec), spec, q,
                                                self.max_new_tokens, refs, self.sampling, repeat)
                        except PacerError as e:
                            too_long = isinstance(e, ContextError)
                            if not (spec.is_anchor or (spec.is_ar and too_long)):
                                raise
                            # the anchor runs on another backend (a shorter llama.cpp context, say), and a question
                            # longer than the model's context cannot be answered by any method: said, not fatal
                            label = spec.label if spec.is_anchor else "every method"
                            self.skipped.append({"question": q.key, "method": label, "repeat": repeat, "why": str(e),
                                                 "runs": 1 if spec.is_anchor else len(order)})
                            say(f"pacer bench: note: {label} skipped on {q.key}: {e}")
                            bar.update(1 if spec.is_anchor else len(order))
                            if spec.is_anchor:
                                continue
                            break
                        except KeyboardInterrupt:
                            raise
                        except Exception as e:  # noqa: BLE001
                            raise PacerError(f"method '{spec.label}' failed on {q.key} (repeat {repeat}): "
                                             f"{type(e).__name__}: {e}") from e
                        rec = self._write(q, spec, repeat, outs, ar, say)
                        if spec.is_ar:
                            ar = rec
                        bar.update(1)
        finally:
            bar.close()

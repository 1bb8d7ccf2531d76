"""Benchmark metrics, computed from answer records alone (so a report can be rebuilt without the models).

Definitions (per method ``m``, over a group ``G`` of questions - all, one dataset, or one category):

* **tokens/s of a record** - its new tokens over its wall time, summed over the question's turns.
* **speedup** (Spec-Bench's definition) - mean over questions of ``m``'s tokens/s divided by the mean over
  the same questions of ``ar``'s tokens/s, computed per repeat on the questions where both finished;
  reported as the mean over repeats, with the standard deviation, minimum and maximum over repeats as the
  spread.
* **median ratio** - the median over (question, repeat) of ``tokens/s(m) / tokens/s(ar)``.
* **τ** - tokens per target call, pooled over all rounds: ``Σ accept_lengths / rounds``, where a record's
  ``accept_lengths`` follow Spec-Bench (tokens a target call produced, bonus token included: ``n_t + 1``).
* **acceptance rate** - accepted over drafted tokens, pooled: ``Σ (accept_lengths - 1) / Σ draft_lengths``.
* **lossless** - records whose token ids equal ``ar``'s for every turn (same question and repeat).
* **clock** - whose seconds a record's tokens/s divides by: ``wall`` (measured here), ``profile`` (the profile
  clock of ``--costs``: every forward priced with another machine's measured costs plus this run's own overhead,
  :mod:`pacer.profiles`) or ``own`` (the same with this machine's calibration: ``own / wall`` checks the
  pricing). A run with ``--costs`` reports the profile clock as ``speedup``/``tokens_per_s`` and keeps the wall
  clock's as ``wall_speedup``/``wall_tokens_per_s``.
* **TTFT** (time to first token, vLLM's name) - a turn's first round: its forwards up to and including the first
  target forward (the prefill, which gives the first token; in records made while a drafting method's draft read
  the prompt and drafted before the prefill, those draft forwards too),
  their measured seconds on the wall clock, priced on another clock; the mean over turns. The loop's own time in
  that round (a fraction of a millisecond) is counted with the decode part.
* **TPOT** (time per output token) - the rest of the turns' time on the clock over the tokens committed after the
  first round, pooled. vLLM divides by the output tokens less one; a drafting method's first round may commit
  several tokens, and those are left out here. **decode speedup** - Spec-Bench's speedup on these tokens alone:
  mean over questions of a method's decode tokens/s (``1 / TPOT`` of the record) over the same mean of ``ar``'s;
  with prompts that are long against the answers it is the steady-state speedup that the overall one dilutes.
* **breakdown** - seconds per round of each part of the wall time (target prefill, chain and tree forwards, draft
  forwards, draft catch-up, policy, pool, rest: :func:`pacer.decoding.meter.breakdown`); **overhead per round**
  - policy + pool + rest per round (what is not a forward).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable

from ..decoding.meter import first_round_end

OVERALL = "overall"


def turns(rec: dict) -> dict:
    return rec["choices"][0]


def seconds(rec: dict, clock: str = "wall") -> float | None:
    """A record's seconds on ``clock`` (``None``: not priced on it)."""
    c = turns(rec)
    t = c.get("wall_time" if clock == "wall" else f"{clock}_time")
    return None if t is None else sum(t)


def record_tokens_per_s(rec: dict, clock: str = "wall") -> float:
    t = seconds(rec, clock)
    return sum(turns(rec)["new_tokens"]) / t if t else 0.0


def per_turn_accept_lengths(rec: dict) -> list[list[int]]:
    """A record's ``accept_lengths`` per turn: ``accept_lengths_per_turn``, or (records written before the flat
    Spec-Bench list) ``accept_lengths`` when it holds one list per turn."""
    c = turns(rec)
    if "accept_lengths_per_turn" in c:
        return c["accept_lengths_per_turn"]
    acc = c["accept_lengths"]
    return acc if all(isinstance(t, list) for t in acc) else [acc]


def rounds_of(rec: dict) -> tuple[list[int], list[int]]:
    """Flattened ``(accept_lengths, draft_lengths)`` over the record's turns."""
    per_turn = per_turn_accept_lengths(rec)
    acc = [a for t in per_turn for a in t]
    dl = [g for t in turns(rec).get("draft_lengths", [[0] * len(x) for x in per_turn]) for g in t]
    return acc, dl


def first_round_calls(calls: list) -> int:
    """How many of a turn's recorded forwards (``[role, k, ...]`` lists, in order) are its first round's
    (:func:`pacer.decoding.meter.first_round_end`)."""
    return first_round_end(c[0] for c in calls)


def first_round_split(rec: dict, clock: str = "wall",
                      price: Callable[[list], float] | None = None) -> tuple[float, float, int, int] | None:
    """``(ttft, decode seconds, turns, decode tokens)`` of a record on ``clock``, summed over its turns (see the
    module docstring): the first round's forwards, measured (``wall``) or priced by ``price`` (a recorded call's
    seconds on the clock), and the rest of the turn's time on the clock. ``None`` where the record has no forwards
    recorded (a method outside pacer's loop) or the clock cannot price them."""
    c = turns(rec)
    calls, times = c.get("calls"), c.get("wall_time" if clock == "wall" else f"{clock}_time")
    if not calls or times is None or len(calls) != len(times) or not all(calls) or (clock != "wall" and price is None):
        return None
    first = per_turn_accept_lengths(rec)
    ttft = decode = 0.0
    tokens = 0
    for t, (turn_calls, seconds_t) in enumerate(zip(calls, times, strict=True)):
        head = turn_calls[: first_round_calls(turn_calls)]
        f = sum(float(x[4]) for x in head) if clock == "wall" else sum(price(x) for x in head)
        ttft += f
        decode += seconds_t - f
        made = c["new_tokens"][t]
        tokens += made - min(made, first[t][0] if t < len(first) and first[t] else 1)
    return ttft, decode, len(times), tokens


def _qkey(rec: dict) -> tuple[str, str]:
    return str(rec["dataset"]), str(rec["question_id"])


def group_names(records: list[dict]) -> list[str]:
    """``overall``, ``dataset:NAME`` (when several datasets), ``category:NAME``; in order of appearance."""
    datasets = list(dict.fromkeys(str(r["dataset"]) for r in records))
    cats = list(dict.fromkeys(str(r["category"]) for r in records))
    out = [OVERALL]
    if len(datasets) > 1:
        out += [f"dataset:{d}" for d in datasets]
    out += [f"category:{c}" for c in cats]
    return out


def in_group(rec: dict, group: str) -> bool:
    if group == OVERALL:
        return True
    kind, _, name = group.partition(":")
    return str(rec["dataset" if kind == "dataset" else "category"]) == name


def method_stats(records: list[dict], method: str, baseline: str = "ar", clock: str = "wall",
                 price: Callable[[list], float] | None = None) -> dict:
    """Aggregate ``method`` over ``records`` (already restricted to one group) on ``clock``; see the module
    docstring. ``price``: a recorded forward's seconds on ``clock`` (for TTFT and TPOT off the wall clock)."""
    mine = {(_qkey(r), int(r.get("repeat", 0))): r for r in records if r["method"] == method
            and seconds(r, clock) is not None}
    base = {(_qkey(r), int(r.get("repeat", 0))): r for r in records if r["method"] == baseline
            and seconds(r, clock) is not None}
    paired = sorted(k for k in mine if k in base)
    per_repeat: dict[int, list[tuple[float, float]]] = {}
    ratios = []
    for k in paired:
        a, b = record_tokens_per_s(mine[k], clock), record_tokens_per_s(base[k], clock)
        per_repeat.setdefault(k[1], []).append((a, b))
        if b > 0:
            ratios.append(a / b)
    splits = {k: first_round_split(r, clock, price) for k, r in mine.items()}
    base_splits = {k: first_round_split(base[k], clock, price) for k in paired}
    decode_pairs = [(s[3] / s[1], b[3] / b[1]) for k in paired if (s := splits[k]) and (b := base_splits[k])
                    and s[1] > 0 and b[1] > 0 and s[3] > 0 and b[3] > 0]
    split = [s for s in splits.values() if s is not None]
    speedups = []
    for pairs in per_repeat.values():
        ms = statistics.fmean(p[0] for p in pairs)
        bs = statistics.fmean(p[1] for p in pairs)
        if bs > 0:
            speedups.append(ms / bs)
    acc: list[int] = []
    dl: list[int] = []
    new_tokens = 0
    wall = on_clock = 0.0
    for r in mine.values():
        a, d = rounds_of(r)
        acc += a
        dl += d
        new_tokens += sum(turns(r)["new_tokens"])
        wall += seconds(r) or 0.0
        on_clock += seconds(r, clock) or 0.0
    checked = [r for r in mine.values() if r.get("lossless") is not None]
    out = {
        "records": len(mine),
        "questions": len({k[0] for k in mine}),
        "paired": len(paired),
        "tokens_per_s": statistics.fmean(record_tokens_per_s(r, clock) for r in mine.values()) if mine else None,
        "speedup": statistics.fmean(speedups) if speedups else None,
        "speedup_std": statistics.stdev(speedups) if len(speedups) > 1 else 0.0 if speedups else None,
        "speedup_min": min(speedups) if speedups else None,
        "speedup_max": max(speedups) if speedups else None,
        "speedup_per_repeat": speedups,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "ttft": sum(s[0] for s in split) / sum(s[2] for s in split) if split else None,
        "tpot": sum(s[1] for s in split) / sum(s[3] for s in split) if split and sum(s[3] for s in split) else None,
        "decode_speedup": statistics.fmean(p[0] for p in decode_pairs) / statistics.fmean(p[1] for p in decode_pairs)
        if decode_pairs else None,
        "tau": sum(acc) / len(acc) if acc else None,
        "acceptance_rate": (sum(acc) - len(acc)) / sum(dl) if sum(dl) else None,
        "mean_draft_length": sum(dl) / len(dl) if dl else None,
        # drafted but rejected, per round (acc counts the bonus token, hence len(acc) below)
        "wasted_per_round": (sum(dl) - (sum(acc) - len(acc))) / len(dl) if dl else None,
        "rounds": len(acc),
        "new_tokens": new_tokens,
        "wall_time": wall,
        "clock_time": on_clock,
        "lossless_checked": len(checked),
        "lossless_identical": sum(1 for r in checked if r["lossless"]),
    }
    out.update(breakdown_stats(list(mine.values())))
    return out


def breakdown_stats(records: list[dict]) -> dict:
    """Seconds per round of each part of the wall time, the overhead per round (policy + pool + rest) and, where
    the records carry them, ``own_over_wall`` (the own-calibration clock over the wall clock, pooled)."""
    parts: Counter = Counter()
    rounds = 0
    for r in records:
        c = turns(r)
        for b in c.get("breakdown") or []:
            parts.update(b)
        rounds += sum(c.get("target_calls", [])) if c.get("breakdown") else 0
    out: dict = {}
    if rounds:
        out["breakdown_per_round"] = {k: v / rounds for k, v in parts.items()}
        out["overhead_per_round"] = (parts["policy"] + parts["pool"] + parts["rest"]) / rounds
    own = [(seconds(r, "own"), seconds(r, "wall")) for r in records if seconds(r, "own") is not None]
    if own and sum(w for _, w in own) > 0:
        out["own_over_wall"] = sum(o for o, _ in own) / sum(w for _, w in own)
    return out


def draft_length_histograms(records: list[dict]) -> dict[str, dict[int, int]]:
    """Per method, how often each draft length was chosen (all rounds pooled); ``ar`` is left out."""
    out: dict[str, Counter] = {}
    for r in records:
        if r["method"] == "ar":
            continue
        out.setdefault(r["method"], Counter()).update(rounds_of(r)[1])
    return {m: dict(sorted(c.items())) for m, c in out.items()}


def distribution_summary(hist: dict[int, int]) -> dict:
    values = [k for k, c in hist.items() for _ in range(c)]
    if not values:
        return {"rounds": 0}
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"rounds": len(values), "mean": statistics.fmean(values), "median": statistics.median(values),
            "p10": q[0], "p90": q[-1], "share_0": values.count(0) / len(values),
            "share_ge_16": sum(v >= 16 for v in values) / len(values)}


def divergences(records: list[dict]) -> list[dict]:
    """Every record that differs from ``ar`` (with where and how close the target's top-2 logits were)."""
    out = []
    for r in records:
        if r.get("lossless") is False:
            d = dict(r.get("divergence") or {})
            out.append({"dataset": r["dataset"], "question_id": r["question_id"], "method": r["method"],
                        "repeat": r.get("repeat", 0), **d})
    return out


#: the counters of a phrase drafter's report (pacer.drafters.phrase.PhraseDrafter.report) the report sums
DRAFTER_COUNTS = ("rounds", "draft_tokens", "draft_forwards", "phrase_tokens", "candidate_rounds",
                  "candidate_tokens_proposed", "candidate_accepted_tokens", "pool_rounds", "pool_tokens_proposed",
                  "pool_accepted_tokens", "siblings_proposed", "siblings_accepted", "phrase_rounds",
                  "phrase_round_tokens", "phrase_round_accepted")


def drafter_totals(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per method, the phrase drafter's counters summed over every recorded turn (methods whose drafter reports
    none are left out)."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        for rep in r["choices"][0].get("drafter") or []:
            if not rep or "pool_rounds" not in rep:
                continue
            tot = out.setdefault(r["method"], dict.fromkeys(DRAFTER_COUNTS, 0))
            for k in DRAFTER_COUNTS:
                tot[k] += int(rep.get(k, 0))
    return out


def summarize(records: list[dict], methods: list[str] | None = None, clock: str = "wall",
              price: Callable[[list], float] | None = None) -> dict:
    """Everything the report shows: per group and method stats, draft-length distributions, divergences. With
    ``clock="profile"`` the speedups and tokens/s are the profile clock's and the wall clock's are kept as
    ``wall_speedup``, ``wall_tokens_per_s``, ``wall_median_ratio``, ``wall_ttft``, ``wall_tpot`` and
    ``wall_decode_speedup``; ``price`` prices a recorded forward on that clock (TTFT and TPOT; without it they are
    the wall clock's only)."""
    if methods is None:
        methods = list(dict.fromkeys(r["method"] for r in records))
    groups = {}
    for g in group_names(records):
        sub = [r for r in records if in_group(r, g)]
        groups[g] = {}
        for m in methods:
            if not any(r["method"] == m for r in sub):
                continue
            s = method_stats(sub, m, clock=clock, price=price)
            if clock != "wall":
                w = method_stats(sub, m)
                s.update(wall_speedup=w["speedup"], wall_tokens_per_s=w["tokens_per_s"],
                         wall_median_ratio=w["median_ratio"], wall_records=w["records"], wall_ttft=w["ttft"],
                         wall_tpot=w["tpot"], wall_decode_speedup=w["decode_speedup"])
                if s["records"] and s["wall_time"]:
                    s["clock_over_wall"] = s["clock_time"] / s["wall_time"]
            groups[g][m] = s
    hists = draft_length_histograms(records)
    return {
        "methods": methods,
        "clock": clock,
        "groups": groups,
        "draft_length_histograms": {m: {str(k): v for k, v in h.items()} for m, h in hists.items()},
        "draft_length_summary": {m: distribution_summary(h) for m, h in hists.items()},
        "divergences": divergences(records),
        "drafters": drafter_totals(records),
    }

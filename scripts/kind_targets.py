"""Per-kind tables of a ``pacer bench`` run and its check against the Ouroboros / first-token targets.

Reads ``RUN/summary.json`` and ``RUN/answers.jsonl`` (written by ``pacer bench``; no models) and prints Markdown:

* per kind (category): every method's speedup over ``ar`` (Spec-Bench's, on the run's clock) and its median
  per-question ratio; ``pacer+ouroboros`` over ``pacer``: the ratio of their speedups and the median over the kind's
  questions of the per-question ratio (each question's tokens/s of one over the other's);
* TTFT per method over ``ar``'s, overall and per kind;
* where a round's time goes, per kind, for the drafting methods (ms per round, wall clock);
* the targets: ``pacer+ouroboros`` >= 0.97x ``pacer`` on every kind's median question and >= 1.00x on the median
  question overall, >= 1.3x ``pacer`` on the grounded kinds' median question, >= 1.15x ``pacer`` and >= 2.3x
  ``ar`` overall (speedups), every drafting method's TTFT <= 1.10x ``ar``'s; met or not, and by how much.

Usage: ``python scripts/kind_targets.py RUN [--po pacer+ouroboros] [--pacer pacer] > RUN/kinds.md``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pacer.bench.metrics import record_tokens_per_s
from pacer.bench.records import read_answers

GROUNDED = ("summarization", "rag_qa", "code_edit")
PARTS = ("target_prefill", "target_chain", "target_tree", "draft", "draft_catch_up", "policy", "pool", "rest")


def per_question_ratio(records: list[dict], num: str, den: str, clock: str) -> dict[tuple, float]:
    """``tokens/s(num) / tokens/s(den)`` per (dataset, question, repeat) where both finished."""
    tps = {(r["dataset"], str(r["question_id"]), r.get("repeat", 0), r["method"]): record_tokens_per_s(r, clock)
           for r in records}
    out = {}
    for (d, q, rep, m), v in tps.items():
        if m == num and tps.get((d, q, rep, den)):
            out[(d, q, rep)] = v / tps[(d, q, rep, den)]
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def check(target: float, value: float | None) -> str:
    if value is None:
        return "no data"
    return f"met (+{value / target - 1:.0%})" if value >= target else f"**not met** ({value / target - 1:.0%})"


def check_at_most(limit: float, value: float | None) -> str:
    if value is None:
        return "no data"
    return f"met ({value / limit - 1:.0%})" if value <= limit else f"**not met** (+{value / limit - 1:.0%})"


def tables(summary: dict, records: list[dict], po: str = "pacer+ouroboros", pacer: str = "pacer") -> str:
    clock = summary.get("clock", "wall")
    groups = summary["groups"]
    methods = [m for m in summary["methods"] if m in groups["overall"]]
    kinds = [g.split(":", 1)[1] for g in groups if g.startswith("category:")]
    cat = {(r["dataset"], str(r["question_id"])): r["category"] for r in records}
    ratio = per_question_ratio(records, po, pacer, clock)
    by_kind = {k: [v for key, v in ratio.items() if cat[key[:2]] == k] for k in kinds}
    n_q = {k: len({key[:2] for key in ratio if cat[key[:2]] == k}) for k in kinds}
    L: list[str] = []
    label = "profile clock" if clock == "profile" else "wall clock"
    L.append(f"## Per kind ({label})\n")
    L.append("Speedup over `ar` (Spec-Bench's: mean tokens/s over `ar`'s mean) / median per-question ratio; "
             f"`{po}` over `{pacer}`: ratio of the speedups / median over the kind's questions of each question's "
             "ratio.\n")
    head = "| kind | questions | " + " | ".join(f"{m}" for m in methods if m != "ar") + f" | {po} / {pacer} |"
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for g, name in [("overall", "**all**")] + [(f"category:{k}", k) for k in kinds]:
        row = groups[g]
        qn = len(ratio) if g == "overall" else n_q[name]
        cells = [f"{_x(row[m].get('speedup'))} / {_x(row[m].get('median_ratio'))}" if m in row else "-"
                 for m in methods if m != "ar"]
        sp = (row[po]["speedup"] / row[pacer]["speedup"]) if po in row and pacer in row else None
        med = _median(list(ratio.values()) if g == "overall" else by_kind[name])
        L.append(f"| {name} | {qn} | " + " | ".join(cells) + f" | {_x(sp)} / {_x(med)} |")
    if clock == "profile":
        L.append("\nThe same on the wall clock (this shared machine; noisy):\n")
        L += [head.replace(f" {po} / {pacer} |", ""), "|" + "---|" * (head.count("|") - 2)]
        for g, name in [("overall", "**all**")] + [(f"category:{k}", k) for k in kinds]:
            row = groups[g]
            qn = len(ratio) if g == "overall" else n_q[name]
            cells = [f"{_x(row[m].get('wall_speedup'))} / {_x(row[m].get('wall_median_ratio'))}" if m in row
                     else "-" for m in methods if m != "ar"]
            L.append(f"| {name} | {qn} | " + " | ".join(cells) + " |")

    L.append(f"\n## TTFT over `ar`'s ({label}; wall clock in brackets)\n")
    head = "| kind | ar TTFT | " + " | ".join(m for m in methods if m != "ar") + " |"
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for g, name in [("overall", "**all**")] + [(f"category:{k}", k) for k in kinds]:
        row = groups[g]
        base, wbase = row["ar"].get("ttft"), row["ar"].get("wall_ttft")
        cells = []
        for m in methods:
            if m == "ar":
                continue
            t, w = row.get(m, {}).get("ttft"), row.get(m, {}).get("wall_ttft")
            cells.append(f"{_x(t / base if t and base else None)} ({_x(w / wbase if w and wbase else None)})")
        ar_cell = f"{base * 1000:.0f} ms" if base else "-"
        ar_cell += f" ({wbase * 1000:.0f} ms)" if wbase else ""
        L.append(f"| {name} | {ar_cell} | " + " | ".join(cells) + " |")

    L.append("\n## Where a round's time goes, per kind (wall clock, ms per round)\n")
    head = "| kind | method | rounds | τ | " + " | ".join(PARTS) + " |"
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for g, name in [("overall", "**all**")] + [(f"category:{k}", k) for k in kinds]:
        for m in methods:
            s = groups[g].get(m, {})
            b = s.get("breakdown_per_round")
            if not b or m == "ar" or "@" in m:
                continue
            L.append(f"| {name} | {m} | {s.get('rounds', '-')} | {s.get('tau', 0):.2f} | "
                     + " | ".join(f"{b.get(p, 0) * 1000:.1f}" for p in PARTS) + " |")

    L.append("\n## Targets\n")
    L += ["| target | value | result |", "|---|---|---|"]
    for k in kinds:
        L.append(f"| {po} >= 0.97x {pacer}, median question of {k} ({n_q[k]} q) | {_x(_median(by_kind[k]))} | "
                 f"{check(0.97, _median(by_kind[k]))} |")
    L.append(f"| {po} >= 1.00x {pacer}, median question ({len(ratio)} q) | {_x(_median(list(ratio.values())))} | "
             f"{check(1.0, _median(list(ratio.values())))} |")
    for k in GROUNDED:
        if k in by_kind:
            L.append(f"| {po} >= 1.3x {pacer} on grounded {k}, median question | {_x(_median(by_kind[k]))} | "
                     f"{check(1.3, _median(by_kind[k]))} |")
    ov = groups["overall"]
    if po in ov and pacer in ov:
        r = ov[po]["speedup"] / ov[pacer]["speedup"]
        L.append(f"| {po} >= 1.15x {pacer} overall (speedups) | {_x(r)} | {check(1.15, r)} |")
        L.append(f"| {po} >= 2.3x ar overall | {_x(ov[po]['speedup'])} | {check(2.3, ov[po]['speedup'])} |")
    for m in methods:
        if m == "ar" or "@" in m or not ov.get(m, {}).get("ttft") or not ov["ar"].get("ttft"):
            continue
        t = ov[m]["ttft"] / ov["ar"]["ttft"]
        L.append(f"| TTFT of {m} <= 1.10x ar's | {_x(t)} | {check_at_most(1.10, t)} |")
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--po", default="pacer+ouroboros")
    ap.add_argument("--pacer", default="pacer")
    args = ap.parse_args()
    summary_path = args.run / "summary.json"
    if not summary_path.is_file():
        print(f"kind_targets: {summary_path} does not exist; run pacer bench --report-only --out {args.run} first",
              file=sys.stderr)
        return 2
    records, _ = read_answers(args.run / "answers.jsonl")
    sys.stdout.write(tables(json.loads(summary_path.read_text()), records, args.po, args.pacer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

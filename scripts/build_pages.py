"""Build the measured tables of ``docs/results.md`` and ``README.md`` from the committed reports.

Every table of figures on those pages sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` and is
written here from the reports' ``summary.json`` (its ``meta`` is the run's ``run.json``), the shipped cost profiles
(``docs/profiles/*.json``) and the one-token step measurements (``docs/bench/plain-step/*.json``, profiles written
by ``pacer calibrate --export``, where present): the speedups, the clock they are on, the profile clock's own check
(*own / wall*), the CPU, backend, commit, tokens and questions of each run. ``tests/test_pages.py`` rebuilds the
pages in memory and fails where a page differs from what its reports say.

    PYTHONPATH=src python scripts/build_pages.py          # rewrite the tables in place
    PYTHONPATH=src python scripts/build_pages.py --check  # exit 1 naming every table that differs
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "bench"
PROFILES = ROOT / "docs" / "profiles"
#: where the one-token step of plain decoding is measured (cost profiles, ``pacer calibrate --export``)
PLAIN_STEP = BENCH / "plain-step"
ANCHOR = "ar@llamacpp"
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)
HELD_OUT = (("HumanEval", "dataset:humaneval"), ("GSM8K", "dataset:gsm8k"), ("MT-bench", "dataset:mtbench"),
            ("ShareGPT", "dataset:sharegpt"))
KINDS = (("writing", "category:writing"), ("coding", "category:coding"), ("math", "category:math"),
         ("STEM", "category:stem"), ("translation", "category:translation"),
         ("summarization", "category:summarization"), ("retrieval QA", "category:rag_qa"),
         ("code editing", "category:code_edit"))


# ------------------------------------------------------------------------------------------------ the reports
#: the report or profile last read (named by the one-line error of a damaged one, :func:`main`)
READING: list[Path] = []


def summary(report: str) -> dict:
    """A report's ``summary.json`` (``report``: its folder under docs/bench), read by pacer's checked JSON reader: a
    missing, cut or foreign file is a one-line :class:`pacer.errors.PacerError`."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.errors import PacerError
    from pacer.io import read_json

    path = BENCH / report / "summary.json"
    READING[:] = [path]
    fix = f"rebuild it (pacer bench --report-only --out {path.parent})"
    doc = read_json(path, "report summary", fix)
    if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
        raise PacerError(f"report summary {path} is not a pacer bench summary (an object with its run's 'meta'); "
                         f"{fix}")
    return doc


def fmt(x: float | None, unit: str = "x") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}{unit}"


def primary_clock(s: dict) -> str:
    """The clock a report's ``speedup`` fields are on: ``profile`` (``--costs``) or ``wall``."""
    return "profile" if s.get("clock") == "profile" else "wall"


def speedup(entry: dict, clock: str, primary: str) -> float | None:
    """A method's speedup over plain decoding on ``clock`` (an anchor on another backend is on the wall clock only)."""
    if clock == primary:
        return entry.get("speedup")
    return entry.get("wall_speedup") if clock == "wall" else None


def run_facts(s: dict) -> str:
    """CPU, backend, threads, tokens, questions, decoding, clocks and commit of a report, in one line."""
    m = s["meta"]
    cpu = m.get("cpu") or "CPU not recorded"
    backend = m.get("backend") or "transformers"
    dtype = m.get("dtype", "?")
    n_q = len(m.get("questions") or [])
    t = m.get("temperature") or 0
    decoding = f"sampling at T = {t:g}" if t else "greedy"
    clock = primary_clock(s)
    if clock == "profile":
        prof = (m.get("profile_clock") or {}).get("profile", "?").split(" (")[0]
        clock_text = f"clocks: profile ({prof}, measured on {m['profile_clock'].get('machine', '?')}) and wall"
    else:
        own = m.get("own_clock") or m.get("calibration", {}).get("source")
        clock_text = "clock: wall" + (", cost rule on this machine's own calibration" if own else "")
    commit = m.get("git_commit", "?")[:7]
    dirty = " with uncommitted changes" if m.get("git_dirty") else ""
    segs = len(m.get("segments") or [])
    segments = f", run in {segs} segments" if segs > 1 else ""
    repriced = " (re-priced with today's profile)" if m.get("repriced_from") else ""
    return (f"CPU: {cpu}; {backend} {dtype}, {m.get('threads', '?')} threads; {m.get('max_new_tokens')} new tokens, "
            f"{n_q} questions ({m.get('datasets')}); {decoding}; {clock_text}{repriced}; "
            f"commit `{commit}`{dirty}{segments}")


@dataclass
class Table:
    """A speedup table of one report: ``rows`` are (shown name, method label in the report)."""

    report: str
    rows: tuple[tuple[str, str], ...]
    groups: tuple[tuple[str, str], ...] = HELD_OUT
    link: str = "bench"  # the page's relative path to docs/bench

    def render(self) -> str:
        s = summary(self.report)
        primary = primary_clock(s)
        overall = s["groups"]["overall"]
        clocks = ["profile", "wall"] if primary == "profile" else ["wall"]
        own = any(overall[label].get("own_over_wall") is not None for _, label in self.rows if label in overall)
        head = ["method", *(f"speedup, {c}" for c in clocks)] + (["own / wall"] if own else [])
        head += [f"{name} ({primary})" for name, _ in self.groups] + ["τ"]
        lines = [f"{run_facts(s)}. Report: [{self.report}]({self.link}/{self.report}/report.md).", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, label in self.rows:
            if label not in overall:
                raise SystemExit(f"build_pages: {self.report} has no method {label!r}")
            e = overall[label]
            cells = [name, *(fmt(speedup(e, c, primary)) for c in clocks)]
            cells += [fmt(e.get("own_over_wall"), "")] if own else []
            for _, key in self.groups:
                g = s["groups"].get(key, {}).get(label)
                cells.append(fmt(speedup(g, primary, primary)) if g else "-")
            cells.append(fmt(e.get("tau"), ""))
            lines.append("| " + " | ".join(cells) + " |")
        plain = overall["ar"].get("wall_tokens_per_s") or overall["ar"].get("tokens_per_s")
        lines += ["", f"Plain decoding (`ar`): {fmt(plain, ' tokens/s')} on the wall clock."]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ losslessness
def divergence_steps(d: dict) -> float:
    gap = d.get("gap")
    gap = d["top2_gap"] if gap is None or (isinstance(gap, float) and math.isnan(gap)) else gap
    return gap / d["resolution"] if d.get("resolution") else math.inf


def lossless_counts(report: str) -> dict:
    """Drafting outputs checked against plain decoding, identical ones, and the others by the logit gap where they
    first differ, in steps of the dtype's resolution (``more``: past 3 steps, or a dtype without steps)."""
    s = summary(report)
    checked = sum(e.get("lossless_checked", 0) for e in s["groups"]["overall"].values())
    identical = sum(e.get("lossless_identical", 0) for e in s["groups"]["overall"].values())
    steps = Counter()
    for d in s["divergences"]:
        k = divergence_steps(d)
        steps[str(int(k)) if k <= 3 else "more"] += 1
    return {"checked": checked, "identical": identical, "differ": len(s["divergences"]), "steps": steps,
            "not_near_tie": sum(1 for d in s["divergences"] if not d.get("near_tie"))}


def lossless_table(reports: tuple[str, ...]) -> str:
    lines = ["| report | backend, dtype | drafting outputs | identical | differ | 0 steps | 1 | 2 | 3 | "
             "beyond | marked NOT a near-tie |", "|" + "---|" * 11]
    for r in reports:
        c = lossless_counts(r)
        m = summary(r)["meta"]
        st = c["steps"]
        lines.append(f"| [{r}](bench/{r}/report.md) | {m.get('backend') or 'transformers'} {m.get('dtype')} | "
                     f"{c['checked']} | {c['identical']} | {c['differ']} | {st['0']} | {st['1']} | {st['2']} | "
                     f"{st['3']} | {st['more']} | {c['not_near_tie']} |")
    return "\n".join(lines)


def lossless_sentence(report: str, link: str) -> str:
    c = lossless_counts(report)
    return (f"Outputs: in the development report {c['identical']} of {c['checked']} drafting outputs are plain "
            f"decoding's token for token; the other {c['differ']} first differ at a near-tie of the target's logits: "
            f"{c['steps']['0']} exact ties, {c['steps']['1'] + c['steps']['2']} at 1-2 bf16 steps, "
            f"{c['steps']['3']} at 3 steps ([every report, and that case]({link}))")


# ------------------------------------------------------------------------------------------------ cost curves
def load_profile(path: Path):
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.profiles import Profile

    READING[:] = [path]
    return Profile.load(path)  # the checked reader: a damaged profile is a one-line PacerError


def curve_ratio(path: Path, k: int, context: int) -> float:
    """``c_t(k) / c_t(1)`` of a profile's target curve at a measured context."""
    curve = load_profile(path).target_cost[context]
    return curve[k] / curve[1]


def cost_table(files: list[Path], contexts: tuple[int, ...] = (32, 512), link: str = "profiles") -> str:
    """Each profile's target curve: ``c_t(1)`` in ms and ``c_t(2)``, ``c_t(8)`` over it, at ``contexts``."""
    head = ["profile", "machine", "backend"] + [f"{what} at {c}" for c in contexts
                                               for what in ("c_t(1)", "c_t(2) / c_t(1)", "c_t(8) / c_t(1)")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in files:
        p = load_profile(f)
        cells = [f"[{f.stem}]({link}/{f.name})", p.machine.get("describe", "?"), p.backend]
        for c in contexts:
            curve = p.target_cost[c]
            cells += [f"{curve[1] * 1000:.0f} ms", fmt(curve[2] / curve[1]), fmt(curve[8] / curve[1])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_range(files: list[Path], k: int, contexts: tuple[int, ...] = (32, 512)) -> str:
    vals = [curve_ratio(f, k, c) for f in files for c in contexts]
    return f"{min(vals):.2f}-{max(vals):.2f}"


def profiles(backend: str, cpu: str = "") -> list[Path]:
    return [f for f in sorted(PROFILES.glob("*.json"))
            if load_profile(f).backend == backend and cpu in load_profile(f).machine.get("describe", "")]


def plain_step() -> str:
    """The one-token against the two-token forward of PyTorch's target, from every transformers profile shipped and
    every measurement under ``docs/bench/plain-step/``."""
    files = profiles("transformers") + sorted(PLAIN_STEP.glob("*.json"))
    lines = ["| profile | machine | context | c_t(1) | c_t(2) | c_t(1) / c_t(2) |", "|---|---|---|---|---|---|"]
    for f in files:
        p = load_profile(f)
        link = f"profiles/{f.name}" if f.parent == PROFILES else f"bench/plain-step/{f.name}"
        for c in sorted(p.target_cost):
            curve = p.target_cost[c]
            lines.append(f"| [{f.stem}]({link}) | {p.machine.get('describe', '?')} | {c} | "
                         f"{curve[1] * 1000:.0f} ms | {curve[2] * 1000:.0f} ms | {fmt(curve[1] / curve[2])} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the README rows
def regime_table() -> str:
    """The README's table: what pacer does on each kind of machine measured, with llama.cpp's plain decoding (the
    default install's path) beside every PyTorch figure."""
    dev, z4l, z3l, z3b = (summary(r) for r in ("dev40-zen4", "zen4-llamacpp-ouroboros", "zen3-avx2-llamacpp",
                                               "zen3-avx2-bf16"))
    llama_amd = profiles("llamacpp", "AMD EPYC")
    z4 = dev["groups"]["overall"]
    po = z4["pacer+ouroboros:siblings=4"]
    z4l_o, z3l_o, z3b_o = (s["groups"]["overall"] for s in (z4l, z3l, z3b))
    rows = [
        ("**the default**: the GGUF pair on llama.cpp, AMD EPYC, 2 cores",
         f"decodes plainly: a 1.5B target on 2 cores is compute-bound (c_t(2) = {ratio_range(llama_amd, 2)} "
         "c_t(1) in the AMD EPYC profiles), so no draft pays",
         f"pacer {fmt(z4l_o['pacer']['wall_speedup'])} (Zen 4, wall), {fmt(z3l_o['pacer']['speedup'])} (Zen 3, wall); "
         f"fixed γ = 3: {fmt(z3l_o['sd:gamma=3']['speedup'])}",
         "[zen4-llamacpp-ouroboros](docs/bench/zen4-llamacpp-ouroboros/report.md), "
         "[zen3-avx2-llamacpp](docs/bench/zen3-avx2-llamacpp/report.md)"),
        ("`--backend transformers`, bf16 on AVX-512 BF16 (AMD EPYC Zen 4), 2 cores",
         "drafts: the curve is flat (scoring 8 tokens costs about one)",
         f"development report: pacer+ouroboros {fmt(po['wall_speedup'])} wall, {fmt(po['speedup'])} profile "
         f"(own / wall {fmt(po['own_over_wall'], '')}), pacer {fmt(z4['pacer']['wall_speedup'])} wall; "
         f"llama.cpp's plain decoding of the same GGUF: {fmt(z4[ANCHOR]['wall_speedup'])} wall",
         "[dev40-zen4](docs/bench/dev40-zen4/report.md)"),
        ("`--backend transformers` on AVX2-only CPUs (AMD EPYC Zen 3)",
         "decodes plainly: no bf16 kernels, scoring 8 tokens costs several times one",
         f"pacer {fmt(z3b_o['pacer']['speedup'])}, fixed γ = 4 {fmt(z3b_o['sd:gamma=4']['speedup'])} (wall)",
         "[zen3-avx2-bf16](docs/bench/zen3-avx2-bf16/report.md)"),
        ("GPU (CUDA, `--device auto`)", "runs; drafts where the measured curve says so", "not yet measured", "-"),
    ]
    lines = ["| where | what pacer does | measured (speedup over plain decoding on the same backend) | report |",
             "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the pages
RESULTS_TABLES: dict[str, Table] = {
    "dev40": Table("dev40-zen4", (("pacer", "pacer"),
                                  ("pacer+ouroboros (siblings 4, phrase rounds of at most 8 tokens)",
                                   "pacer+ouroboros:siblings=4"),
                                  ("pacer+ouroboros, no siblings (phrase rounds of at most 8 tokens)",
                                   "pacer+ouroboros"),
                                  ("llama.cpp plain decoding (`ar@llamacpp`)", ANCHOR)), KINDS),
    "lookup-len-grounded": Table("dev40-zen4/lookup-len-grounded", (
        ("pacer+ouroboros, phrase rounds of at most 8 tokens", "pacer+ouroboros"),
        ("pacer+ouroboros, at most 16 (the default)", "pacer+ouroboros:lookup_len=16")),
        (("summarization", "category:summarization"), ("retrieval QA", "category:rag_qa"),
         ("code editing", "category:code_edit"))),
    "k1000": Table("k1000-zen5", (("pacer", "pacer:path=docs/bench/k1000-checkpoint"),
                                  ("cumprob, validation θ (best training-free rule)", "cumprob:threshold=validation"),
                                  ("confidence, validation θ", "confidence:threshold=validation"),
                                  ("entropy, validation θ", "entropy:threshold=validation"),
                                  ("fixed γ = 3 (best fixed γ)", "sd:gamma=3"),
                                  ("pacer+ouroboros, siblings 4",
                                   "pacer+ouroboros:path=docs/bench/k1000-checkpoint:siblings=4"),
                                  ("oracle length", "oracle"),
                                  ("SpecDec++-style head", "specdecpp:path=docs/bench/k1000-specdecpp-checkpoint"),
                                  ("llama.cpp plain decoding", ANCHOR))),
    "t07": Table("t07-draw-zen5", (("pacer", "pacer:path=docs/bench/k1000-checkpoint"),
                                   ("cumprob, validation θ", "cumprob:threshold=validation"),
                                   ("entropy, validation θ", "entropy:threshold=validation"),
                                   ("confidence, validation θ", "confidence:threshold=validation"),
                                   ("fixed γ = 3", "sd:gamma=3"),
                                   ("pacer+ouroboros (token by token at T > 0)",
                                    "pacer+ouroboros:path=docs/bench/k1000-checkpoint:siblings=4:candidates=2"))),
    "xeon64": Table("tf-live-xeon-amx", (("pacer", "pacer"), ("cumprob, validation θ", "cumprob:threshold=validation"),
                                         ("fixed γ = 3", "sd:gamma=3"), ("llama.cpp plain decoding", ANCHOR))),
    "xeon256": Table("ttft-xeon", (("pacer", "pacer"), ("pacer+ouroboros, siblings 4", "pacer+ouroboros:siblings=4"),
                                   ("llama.cpp plain decoding", ANCHOR))),
    "zen5-256": Table("compound256-zen5", (("pacer", "pacer:path=docs/bench/k1000-checkpoint"),
                                           ("pacer+ouroboros, siblings 4",
                                            "pacer+ouroboros:path=docs/bench/k1000-checkpoint:siblings=4"))),
    "xeon256-repriced": Table("compound256-kinds-xeon-repriced", (("pacer", "pacer"),
                                                                  ("pacer+ouroboros, siblings 4",
                                                                   "pacer+ouroboros:siblings=4"))),
    "zen3-llamacpp": Table("zen3-avx2-llamacpp", (("pacer (cost rule)", "pacer"), ("entropy (cost rule)", "entropy"),
                                                  ("ouroboros (cost rule)", "ouroboros"),
                                                  ("llama.cpp's p-min rule (`confidence`), θ 0.6",
                                                   "confidence:threshold=0.6"),
                                                  ("`confidence`, θ 0.4", "confidence:threshold=0.4"),
                                                  ("fixed γ = 2", "sd:gamma=2"), ("fixed γ = 3", "sd:gamma=3"),
                                                  ("oracle length, cost rule", "oracle")), HELD_OUT[:3]),
    "zen4-llamacpp": Table("zen4-llamacpp-ouroboros", (("sd (cost rule)", "sd"), ("entropy (cost rule)", "entropy"),
                                                       ("pacer (cost rule)", "pacer"),
                                                       ("ouroboros (cost rule)", "ouroboros"),
                                                       ("pacer+ouroboros (cost rule)", "pacer+ouroboros"),
                                                       ("lookup (cost rule)", "lookup"))),
    "zen3-bf16": Table("zen3-avx2-bf16", (("pacer (cost rule)", "pacer"), ("entropy (cost rule)", "entropy"),
                                          ("fixed γ = 4", "sd:gamma=4"),
                                          ("pacer+ouroboros (cost rule)", "pacer+ouroboros"),
                                          ("oracle length, cost rule", "oracle")), HELD_OUT[:3]),
    "fixed-rules": Table("default-pair-n10", (("pacer (its fixed threshold)", "pacer"), ("entropy", "entropy"),
                                              ("confidence", "confidence"), ("fixed γ = 2", "sd:gamma=2"),
                                              ("fixed γ = 4", "sd:gamma=4"), ("oracle length", "oracle"),
                                              ("transformers' assisted generation", "hf-assisted"),
                                              ("the same, heuristic schedule", "hf-assisted:schedule=heuristic")),
                         HELD_OUT[:3]),
    "block-t07": Table("block-zen4-llamacpp/t07", (("fixed γ = 4, token-level verification", "sd:gamma=4"),
                                                   ("fixed γ = 4, block verification", "sd:gamma=4:verify=block")),
                       KINDS),
    "block-t10": Table("block-zen4-llamacpp/t10", (("fixed γ = 4, token-level verification", "sd:gamma=4"),
                                                   ("fixed γ = 4, block verification", "sd:gamma=4:verify=block")),
                       KINDS),
}
LOSSLESS_REPORTS = ("dev40-zen4", "dev40-zen4/lookup-len-grounded", "dev40-zen4/lookup-len-other", "k1000-zen5",
                    "tf-live-xeon-amx", "ttft-xeon", "compound256-zen5", "compound256-kinds-xeon-repriced",
                    "zen3-avx2-bf16", "default-pair-n10", "zen3-avx2-llamacpp", "zen4-llamacpp-ouroboros")


def results_blocks() -> dict[str, str]:
    out = {name: t.render() for name, t in RESULTS_TABLES.items()}
    out["lossless"] = lossless_table(LOSSLESS_REPORTS)
    out["costs"] = cost_table(sorted(PROFILES.glob("*.json")))
    out["plain-step"] = plain_step()
    return out


def readme_blocks() -> dict[str, str]:
    return {"regimes": regime_table(),
            "lossless": lossless_sentence("dev40-zen4", "docs/results.md#losslessness") + "."}


PAGES = {ROOT / "docs" / "results.md": results_blocks, ROOT / "README.md": readme_blocks}


def rebuild(text: str, blocks: dict[str, str], page: str = "page") -> str:
    """``text`` with every marked table replaced by its block; a marker without a block, or a block without a
    marker, is an error naming it."""
    seen = set()

    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name not in blocks:
            raise SystemExit(f"build_pages: {page} marks a table '{name}' that nothing builds")
        seen.add(name)
        return m.group(1) + blocks[name] + "\n" + m.group(4)

    out = MARKER.sub(sub, text)
    if missing := set(blocks) - seen:
        raise SystemExit(f"build_pages: {page} lacks the marker of {', '.join(sorted(missing))}")
    return out


def differences(page: Path, text: str, blocks: dict[str, str]) -> list[str]:
    """The tables of ``text`` (a page's content) that differ from what the reports say, with the first differing
    line of each."""
    want = dict((m.group(2), m.group(3)) for m in MARKER.finditer(rebuild(text, blocks, page.name)))
    bad = []
    for m in MARKER.finditer(text):
        have, need = m.group(3).splitlines(), want[m.group(2)].splitlines()
        if have != need:
            i = next((i for i, (a, b) in enumerate(zip(have, need, strict=False)) if a != b), min(len(have), len(need)))
            bad.append(f"{page.relative_to(ROOT)} table '{m.group(2)}', line {i + 1}: the page says "
                       f"{have[i] if i < len(have) else '(nothing)'!r}, its reports "
                       f"{need[i] if i < len(need) else '(nothing)'!r}")
    return bad


# ------------------------------------------------------------------------------------------------ report headers
def header_command(report_md: Path) -> str:
    """The command a report's header names (``- command: `...```)."""
    m = re.search(r"^- command: `([^`]*)`", report_md.read_text(encoding="utf-8"), re.M)
    if not m:
        raise ValueError(f"{report_md} names no command in its header")
    return m.group(1)


def parse_bench_command(command: str) -> argparse.Namespace:
    """A header's ``pacer bench ...`` read with pacer bench's own parser, its ``--methods`` with its own method-spec
    parser (every option checked against the method registry, every checkpoint and pool file named checked to be
    there, ``threshold=validation`` read from the checkpoint the command names or the backend's shipped one)."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.bench.cli import parser
    from pacer.bench.methods import parse_methods, validation_thresholds
    from pacer.policies.learned import default_checkpoint

    argv = shlex.split(command)
    if argv[:2] != ["pacer", "bench"]:
        raise ValueError(f"not a pacer bench command: {command[:60]}")
    args = parser().parse_args(argv[2:])
    mode = "sampled" if args.temperature > 0 else "greedy"
    ckpt = args.validation or default_checkpoint("pacer", args.backend)
    args.specs = parse_methods(args.methods, lambda: validation_thresholds(ckpt, mode))
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every table that differs")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.errors import PacerError

    bad = []
    try:  # every page is built before any is written: a damaged input changes none
        built = [(page, page.read_text(encoding="utf-8"), blocks()) for page, blocks in PAGES.items()]
    except PacerError as e:
        print(f"build_pages.py: error: {e}", file=sys.stderr)
        return 2
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        where = READING[0] if READING else "a report"
        print(f"build_pages.py: error: {where} lacks what its table reads ({type(e).__name__}: {e}); rebuild it "
              f"(pacer bench --report-only, pacer calibrate --export) or restore it", file=sys.stderr)
        return 2
    for page, text, blocks in built:
        if args.check:
            bad += differences(page, text, blocks)
        else:
            page.write_text(rebuild(text, blocks, page.name), encoding="utf-8")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

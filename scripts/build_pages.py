"""Build the measured tables of ``docs/results.md`` and ``README.md`` from the committed reports.

Every table of figures on those pages sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` and is
written here from the reports' ``summary.json`` (its ``meta`` is the run's ``run.json``), the shipped cost profiles
(``docs/profiles/*.json``): the speedups, the clock they are on, the profile clock's own check
(*own / wall*), the CPU, backend, commit, tokens and questions of each run. ``tests/test_pages.py`` rebuilds the
pages in memory and fails where a page differs from what its reports say, and re-reads every report's header
with the current parser (:func:`report_problems`).

The README's measured table is built from every report folder under ``docs/bench/readme/`` (:func:`regime_row`),
and the flag reference ``docs/flags.md`` from the commands' own parsers (:func:`flag_table`): one command rebuilds
every generated page.

    PYTHONPATH=src python scripts/build_pages.py          # rewrite the tables in place
    PYTHONPATH=src python scripts/build_pages.py --check  # exit 1 naming every table that differs
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "bench"
PROFILES = ROOT / "docs" / "profiles"
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


def questions_ran(s: dict) -> str:
    """The questions a report ran (``ar``'s, which every method is paired with), and the methods that ran fewer
    (a question skipped for one of them, e.g. a prompt past the anchor's context)."""
    ran = {label: e.get("questions") for label, e in s["groups"]["overall"].items()}
    n = ran.get("ar") or len(s["meta"].get("questions") or [])
    fewer = [f"{label} {q}" for label, q in ran.items() if isinstance(q, int) and q < n]
    return f"{n} questions" + (f" ({', '.join(fewer)})" if fewer else "")


def run_facts(s: dict) -> str:
    """CPU, backend, threads, tokens, questions, decoding, clocks and commit of a report, in one line."""
    m = s["meta"]
    cpu = m.get("cpu") or "CPU not recorded"
    backend = m.get("backend") or "transformers"
    dtype = m.get("dtype", "?")
    n_q = questions_ran(s)
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
    repriced = " (re-priced with the profile named)" if m.get("repriced_from") else ""
    return (f"CPU: {cpu}; {backend} {dtype}, {m.get('threads', '?')} threads; {m.get('max_new_tokens')} new tokens, "
            f"{n_q} ({m.get('datasets')}); {decoding}; {clock_text}{repriced}; "
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
#: the criterion (docs/results.md#losslessness): a first differing token whose logit gap is at most this many steps
#: of the dtype's resolution (bf16), or at most this many times the block noise measured at that prefix (llama.cpp),
#: is a near-tie; more is a losslessness failure
TIE = 2


def answers(report: str) -> list[dict]:
    """A report's answer records (``answers.jsonl.gz`` or ``answers.jsonl``)."""
    import gzip

    folder = BENCH / report
    path = folder / "answers.jsonl.gz"
    raw = gzip.open(path, "rt", encoding="utf-8") if path.exists() else open(folder / "answers.jsonl", encoding="utf-8")
    from pacer.io import loads_json

    READING[:] = [path]
    with raw as f:
        return [loads_json(line, "an answer record", f"rebuild the report {folder}") for line in f if line.strip()]


def drafted(rec: dict) -> int:
    """The tokens an answer record drafted, over all its turns."""
    return sum(sum(t) for c in rec["choices"] for t in c.get("draft_lengths") or [])


def divergence_scale(d: dict) -> tuple[float, str]:
    """A divergence's logit gap on the scale that applies to its backend's logits: in multiples of the block noise
    measured at that prefix where the backend has one (llama.cpp), else in steps of the dtype's resolution."""
    gap = d.get("gap")
    gap = d["top2_gap"] if gap is None or (isinstance(gap, float) and math.isnan(gap)) else gap
    if d.get("noise"):
        return gap / d["noise"], "x noise"
    return (gap / d["resolution"] if d.get("resolution") else math.inf), "steps"


def lossless_counts(report: str) -> dict:
    """The greedy outputs of a report that drafted at least one token and were checked against plain decoding:
    how many, how many identical, and of the others how many are within the criterion (:data:`TIE`) and the largest
    gap on its scale (:func:`divergence_scale`)."""
    recs = [r for r in answers(report) if r.get("lossless") is not None and drafted(r) > 0]
    keys = {(r["method"], r["dataset"], str(r["question_id"]), int(r["repeat"])) for r in recs}
    div = [d for d in summary(report)["divergences"]
           if (d["method"], d["dataset"], str(d["question_id"]), int(d["repeat"])) in keys]
    scaled = [divergence_scale(d) for d in div]
    worst = max(scaled, default=None)
    return {"checked": len(recs), "identical": sum(1 for r in recs if r["lossless"]), "differ": len(div),
            "within": sum(1 for k, _ in scaled if k <= TIE), "beyond": sum(1 for k, _ in scaled if k > TIE),
            "worst": f"{worst[0]:.1f} {worst[1]}" if worst else "-"}


def lossless_table(reports: tuple[str, ...]) -> str:
    lines = ["| report | backend, dtype | greedy outputs that drafted | identical | differ | within the criterion | "
             "beyond | largest gap |", "|" + "---|" * 8]
    for r in reports:
        c = lossless_counts(r)
        m = summary(r)["meta"]
        lines.append(f"| [{r}](bench/{r}/report.md) | {m.get('backend') or 'transformers'} {m.get('dtype')} | "
                     f"{c['checked']} | {c['identical']} | {c['differ']} | {c['within']} | {c['beyond']} | "
                     f"{c['worst']} |")
    return "\n".join(lines)


def sampled_reports() -> str:
    """The sampling reports: what was checked there (the distribution, by the tests; no output against plain
    decoding's)."""
    rows = [r for r in REPORTS if (summary(r)["meta"].get("temperature") or 0) > 0]
    return ("Sampling reports (" + ", ".join(f"[{r}](bench/{r}/report.md)" for r in rows) + ") compare no output "
            "with plain decoding's token for token: a draw is checked by its distribution, which "
            "`tests/test_sampling.py` and `tests/test_block.py` test.") if rows else "No sampling report."


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


def break_even_table(files: list[Path], context: int = 32, link: str = "profiles") -> str:
    """Each profile's draft cost against its target's plain step and the break-even acceptance of its curve at
    ``context`` (:mod:`pacer.breakeven`, the line ``pacer calibrate`` prints for this machine)."""
    from pacer.breakeven import break_even

    lines = ["| profile | machine | backend | draft token / plain step | break-even acceptance | at γ | "
             "ceiling (every draft token accepted) |", "|---|---|---|---|---|---|---|"]
    for f in files:
        p = load_profile(f)
        curve, c_d = p.target_cost[context], p.draft_cost[context][1]
        be = break_even(c_d, lambda k, curve=curve: _at(curve, k))
        cells = [f"[{f.stem}]({link}/{f.name})", p.machine.get("describe", "?"), p.backend, fmt(c_d / curve[1], "")]
        cells += [f"{be.alpha:.2f}", str(be.gamma), fmt(be.ceiling)] if be else ["none pays", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _at(curve: dict[int, float], k: int) -> float:
    """``c_t(k)`` of a measured curve, linear between measured ``k`` (the last slope beyond them)."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.costs import interpolate

    return interpolate(curve, k)


def ratio_range(files: list[Path], k: int, contexts: tuple[int, ...] = (32, 512)) -> str:
    vals = [curve_ratio(f, k, c) for f in files for c in contexts]
    return f"{min(vals):.2f}-{max(vals):.2f}"


def profiles(backend: str, cpu: str = "") -> list[Path]:
    return [f for f in sorted(PROFILES.glob("*.json"))
            if load_profile(f).backend == backend and cpu in load_profile(f).machine.get("describe", "")]


def plain_step() -> str:
    """The one-token against the two-token forward of PyTorch's target, from every transformers profile shipped."""
    files = profiles("transformers")
    lines = ["| profile | machine | context | c_t(1) | c_t(2) | c_t(1) / c_t(2) |", "|---|---|---|---|---|---|"]
    for f in files:
        p = load_profile(f)
        link = f"profiles/{f.name}"
        for c in sorted(p.target_cost):
            curve = p.target_cost[c]
            lines.append(f"| [{f.stem}]({link}) | {p.machine.get('describe', '?')} | {c} | "
                         f"{curve[1] * 1000:.0f} ms | {curve[2] * 1000:.0f} ms | {fmt(curve[1] / curve[2])} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the README rows
#: the README's measured rows: one report folder each under docs/bench/readme/ (a ``pacer bench`` run at today's
#: code on held-out questions: no ``--dataset dev``), sorted by folder name
README_REPORTS = BENCH / "readme"


def readme_reports() -> list[str]:
    return sorted(str(f.parent.relative_to(README_REPORTS.parent)) for f in README_REPORTS.glob("*/summary.json"))


def what_it_does(entry: dict) -> str:
    """What a method did in a run, from its rounds: decoded plainly (no token drafted) or drafted."""
    if not entry.get("mean_draft_length"):
        return "decodes plainly (no round drafted)"
    return f"drafts: {entry['mean_draft_length']:.1f} tokens a round, τ {entry['tau']:.2f}"


def regime_row(report: str) -> str:
    """One README row: the machine and backend, what the default method did, every method's speedup over plain
    decoding on the same backend (wall clock; a profile clock beside it where the run was priced), the baseline and
    the questions."""
    s = summary(report)
    m = s["meta"]
    if "dev" in str(m.get("datasets", "")).split(","):
        raise SystemExit(f"build_pages: {report} ran the development set, which tuned pacer's defaults; the README's "
                         f"figures come from held-out questions")
    overall = s["groups"]["overall"]
    primary = primary_clock(s)
    default = next((label for label in default_labels() if label in overall), None)
    if default is None:
        raise SystemExit(f"build_pages: {report} runs none of {', '.join(default_labels())}")
    where = (f"{m.get('backend') or 'transformers'} {m.get('dtype')}, {m.get('cpu') or 'CPU not recorded'}, "
             f"{m.get('threads')} threads")
    figures = []
    for label, e in overall.items():
        if label == "ar":
            continue
        wall = speedup(e, "wall", primary)
        prof = f", {fmt(e.get('speedup'))} profile" if primary == "profile" and label != ANCHOR else ""
        figures.append(f"`{label}` {fmt(wall)} wall{prof}")
    t = m.get("temperature") or 0
    plain = overall["ar"].get("wall_tokens_per_s") or overall["ar"].get("tokens_per_s")
    facts = (f"{questions_ran(s)} ({m.get('datasets')}), {m.get('max_new_tokens')} new tokens, "
             f"{f'T = {t:g}' if t else 'greedy'}; baseline `ar`: plain decoding on {m.get('backend')}, one target "
             f"forward a token, {fmt(plain, ' tokens/s')} wall"
             + ("" if m.get("backend") != "transformers" else " (PyTorch's one-token kernel path: "
                "[plain decoding on PyTorch](docs/results.md#plain-decoding-on-pytorch); `ar@llamacpp` is llama.cpp's "
                "plain decoding of the same file)"))
    return (f"| {where} | `{default}` {what_it_does(overall[default])} | {'; '.join(figures)} | {facts} | "
            f"[{report}](docs/bench/{report}/report.md) |")


def default_labels() -> tuple[str, ...]:
    """The labels that name a README row's behaviour, in order: pacer's default method
    (:data:`pacer.methods.DEFAULT_METHOD`), then the other PACER method."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.methods import DEFAULT_METHOD

    return (DEFAULT_METHOD, *(m for m in ("pacer", "pacer+ouroboros") if m != DEFAULT_METHOD))


def regime_table() -> str:
    """The README's table: what pacer does on each machine and backend measured at the current code, from the reports
    under docs/bench/readme/."""
    lines = ["| where | what pacer does | speedup over plain decoding on the same backend | questions, baseline | "
             "report |", "|---|---|---|---|---|"]
    rows = readme_reports()
    lines += [regime_row(r) for r in rows] or ["| - | not yet measured at the current code | - | - | - |"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the pages
RESULTS_TABLES: dict[str, Table] = {
    "xeon64": Table("tf-live-xeon-amx", (("pacer", "pacer"), ("cumprob, validation θ", "cumprob:threshold=validation"),
                                         ("fixed γ = 3", "sd:gamma=3"), ("llama.cpp plain decoding", ANCHOR))),
    "block-t07": Table("block-zen4-llamacpp/t07", (("fixed γ = 4, token-level verification", "sd:gamma=4"),
                                                   ("fixed γ = 4, block verification", "sd:gamma=4:verify=block")),
                       KINDS),
    "block-t10": Table("block-zen4-llamacpp/t10", (("fixed γ = 4, token-level verification", "sd:gamma=4"),
                                                   ("fixed γ = 4, block verification", "sd:gamma=4:verify=block")),
                       KINDS),
}
#: every committed pacer bench report (folders under docs/bench/ with a summary.json), the README's included
REPORTS = tuple(sorted(str(f.parent.relative_to(BENCH)) for f in BENCH.rglob("summary.json")))
LOSSLESS_REPORTS = tuple(r for r in REPORTS if not (summary(r)["meta"].get("temperature") or 0))


def results_blocks() -> dict[str, str]:
    out = {name: t.render() for name, t in RESULTS_TABLES.items()}
    out["lossless"] = lossless_table(LOSSLESS_REPORTS)
    out["sampled"] = sampled_reports()
    out["costs"] = cost_table(sorted(PROFILES.glob("*.json")))
    out["break-even"] = break_even_table(sorted(PROFILES.glob("*.json")))
    out["plain-step"] = plain_step()
    return out


def readme_blocks() -> dict[str, str]:
    return {"regimes": regime_table()}


# ------------------------------------------------------------------------------------------------ the flag reference
#: the commands whose flags docs/flags.md lists, generated from their own argparse parsers
FLAG_COMMANDS = ("generate", "bench", "serve", "demo", "calibrate")


def subparser(command: str) -> argparse.ArgumentParser:
    """The parser of ``pacer COMMAND`` (the one the CLI runs)."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def flag_table(command: str) -> str:
    """Every flag of ``pacer COMMAND``: its values, default and help, from the parser."""
    ap = subparser(command)
    lines = ["| flag | values | default | meaning |", "|---|---|---|---|"]
    for a in ap._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        name = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest}` (positional)"
        if a.choices is not None:
            values = " \\| ".join(f"`{c}`" for c in a.choices)
        elif a.nargs == 0:
            values = "(a switch)"
        else:
            values = f"`{a.metavar or (a.type.__name__ if isinstance(a.type, type) else 'text')}`"
        default = ap.get_default(a.dest)
        if a.nargs == 0 and isinstance(a, argparse._StoreFalseAction):
            shown = "on (the flag turns it off)"
        elif a.nargs == 0:
            shown = "off"
        else:
            shown = "-" if default is None else f"`{default}`"
        lines.append(f"| {name} | {values} | {shown} | {_cell(a.help or '')} |")
    return "\n".join(lines)


def flag_blocks() -> dict[str, str]:
    return {f"flags-{c}": flag_table(c) for c in FLAG_COMMANDS}


def bench_index_blocks() -> dict[str, str]:
    """The bench index's list of the README's reports (docs/bench/readme/), each with its run's facts."""
    rows = [f"- [{r}]({r}/report.md): {run_facts(summary(r))}" for r in readme_reports()]
    return {"readme-reports": "\n".join(rows) or "- none yet"}


PAGES = {ROOT / "docs" / "results.md": results_blocks, ROOT / "README.md": readme_blocks,
         ROOT / "docs" / "flags.md": flag_blocks, BENCH / "README.md": bench_index_blocks}


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


# ------------------------------------------------------------------------------------------------ prose figures
#: a measured figure in prose: a number with a unit of time, speed, size or share, or an "x" speed figure
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?(?:\s?(?:ms|s|tok/s|tokens/s|GB)\b|%|x\b)")
#: a file the paragraph cites: a relative Markdown link or a backticked path in the tree
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE_PATH = re.compile(r"`([\w./-]+\.(?:py|json|jsonl|gz|md|sh|toml))`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
#: the prose pages the figure check reads (reports are generated, not prose)
PROSE = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "bench" / "README.md",
         ROOT / "docs" / "profiles" / "README.md")


def _units(text: str) -> list[str]:
    """A page's prose split where a figure must find its source: paragraphs, list items and table rows."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if all(ln.startswith("|") for ln in lines if ln.strip()):
            out += lines
        else:
            out += [p for p in re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", para)]
    return out


def unchecked_figures(page: Path, text: str) -> list[str]:
    """The figures of a page's prose that neither sit in a built block (``<!-- table:... -->``, the method table)
    nor cite their file (a relative link or a backticked path that exists) in the same paragraph, list item or
    table row."""
    text = MARKER.sub("", text)
    text = re.sub(r"<!-- methods -->.*?<!-- /methods -->", "", text, flags=re.S)
    text = FENCE.sub("", text)
    bad = []
    for unit in _units(text):
        figures = FIGURE.findall(re.sub(r"`[^`]*`", "", unit))
        if not figures:
            continue
        cited = [m for m in LINK.findall(unit) if not m.startswith(("http:", "https:"))
                 and (page.parent / m).resolve().exists()]
        cited += [m for m in CODE_PATH.findall(unit) if (ROOT / m).exists() or (page.parent / m).exists()]
        if not cited:
            first = unit.strip().splitlines()[0][:100]
            bad.append(f"{page.relative_to(ROOT)}: {', '.join(figures)} in \"{first}...\" cites no file")
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


#: the methods that load a pre-verifier checkpoint, and the checkpoint kind each loads
CHECKPOINT_KIND = {"pacer": "pacer", "pacer+ouroboros": "pacer", "specdecpp": "specdecpp"}


def expected_labels(args: argparse.Namespace) -> list[str]:
    """The method labels ``pacer bench`` writes for a parsed header: its specs' labels, then llama.cpp's plain
    decoding (``ar@llamacpp``) where the backend runs that anchor beside a GGUF target and ``--no-anchor`` is not
    given."""
    from pacer import backends
    from pacer.bench.methods import ANCHOR as anchor

    labels = [s.label for s in args.specs]
    gguf = str(args.target) == "default-target" or str(args.target).endswith(".gguf")
    if args.anchor and not args.quick and gguf and backends.get(args.backend).anchor:
        labels.append(anchor)
    return labels


def checkpoint_problems(args: argparse.Namespace) -> list[str]:
    """Every method spec of a parsed header that would not load on its backend: a checkpoint folder that is not
    there, of another kind, made on another backend, or whose weights do not match their recorded sha256."""
    import hashlib

    from pacer.policies.learned import default_checkpoint, read_config

    bad = []
    for spec in args.specs:
        kind = CHECKPOINT_KIND.get(spec.name)
        if kind is None:
            continue
        path = Path(spec.opts["path"]) if "path" in spec.opts else default_checkpoint(kind, args.backend)
        try:
            cfg, _ = read_config(path)
        except Exception as e:  # noqa: BLE001 - PacerError or an OS error: either is the defect named
            bad.append(f"{spec.label}: its checkpoint {path} does not load ({e})")
            continue
        made_on = cfg.get("backend", "transformers")
        if cfg.get("kind") != kind:
            bad.append(f"{spec.label}: {path} is a {cfg.get('kind')} checkpoint, not a {kind} one")
        if made_on != args.backend:
            bad.append(f"{spec.label}: {path} reads features of the {made_on} backend; the header runs "
                       f"--backend {args.backend}, which refuses it")
        weights = path / "weights.safetensors"
        if not weights.is_file() or hashlib.sha256(weights.read_bytes()).hexdigest() != cfg.get("weights_sha256"):
            bad.append(f"{spec.label}: {weights} is missing or does not match its recorded sha256")
    return bad


def header_problems(command: str, s: dict, folder: str) -> list[str]:
    """What keeps a report's header (``command``) from re-running it at the current code: ``s`` is the report's
    ``summary.json``, ``folder`` its folder relative to the repository (``docs/bench/NAME``). Empty: the command
    parses with pacer bench's own parser and method-spec parser, names no machine path, writes into ``folder``,
    loads every method on its backend, writes exactly the method labels of the report's tables, and, priced with a
    profile, names a profile file whose content hash is the one the report recorded."""
    argv = shlex.split(command)
    machine = [a for a in argv if a.startswith(("/", "~")) or ".venv" in a or "/work/" in a]
    if machine:
        return [f"machine paths in its command: {machine}"]
    try:
        args = parse_bench_command(command)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the parser's exit or a PacerError: the header fails
        return [f"the current parser refuses it: {e}"]
    bad = []
    if str(args.out).rstrip("/") != folder:
        bad.append(f"it writes into --out {args.out}, not the report's folder {folder}")
    if args.backend == "auto" or not args.threads:
        bad.append("--backend and --threads decide the result: name them")
    if args.backend == "transformers" and ("auto" in (args.dtype, args.draft_quant)):
        bad.append("--dtype / --draft-quant auto: name what ran")
    for path in (args.questions, args.costs, args.own_profile, args.validation):
        if path is not None and not (ROOT / path).exists():
            bad.append(f"{path} is not in the tree")
    bad += checkpoint_problems(args)
    want, have = expected_labels(args), list(s["groups"]["overall"])
    if want != have:
        bad.append(f"it writes the labels {want}, the report's tables show {have}")
    if args.costs is not None and (ROOT / args.costs).exists():
        recorded = (s["meta"].get("profile_clock") or {}).get("sha256")
        digest = load_profile(ROOT / args.costs).digest()
        if recorded != digest:
            bad.append(f"priced with {args.costs}, whose content hash today is {digest[:12]}..., but the report "
                       f"recorded {recorded[:12] + '...' if recorded else 'none'}: the file was re-measured since")
    if s["meta"].get("command") != command:
        bad.append("its summary.json records another command")
    return bad


def report_problems(report_md: Path) -> list[str]:
    """:func:`header_problems` of a committed report (a script's report: the script it names is in the tree)."""
    command = header_command(report_md)
    argv = shlex.split(command)
    if argv[:2] != ["pacer", "bench"]:
        ok = argv[0] == "python" and (ROOT / argv[1]).is_file()
        return [] if ok else [f"neither pacer bench nor a script in the tree: {command}"]
    folder = report_md.parent
    from pacer.io import read_json

    s = read_json(folder / "summary.json", "report summary", f"rebuild it (pacer bench --report-only --out {folder})")
    bad = header_problems(command, s, str(folder.relative_to(ROOT)))
    run = read_json(folder / "run.json", "run record", f"run the report's command again ({folder})")
    if run.get("command") != command:
        bad.append("its run.json records another command")
    return bad


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

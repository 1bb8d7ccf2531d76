"""``summary.json``, ``report.md`` and the PNG plots of a benchmark folder (all written atomically)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from ..io import atomic_write_bytes, atomic_write_text
from .metrics import OVERALL, draft_length_histograms, summarize

TIE_STEPS = 2  # = pacer.decoding.Divergence.TIE_STEPS (kept here so a report needs no torch import)

PLOTS = ("speedup_by_category.png", "oracle_draft_lengths.png", "draft_lengths_vs_oracle.png")


def _f(x, fmt: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def plot_speedup(summary: dict, path: Path) -> None:
    plt = _plt()
    groups = [g for g in summary["groups"] if g != "overall" and not g.startswith("dataset:")] + [OVERALL]
    methods = [m for m in summary["methods"] if m != "ar"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(groups) * max(1, len(methods)) / 3), 4.2))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [(summary["groups"][g].get(m) or {}).get("speedup") or 0.0 for g in groups]
        errs = [(summary["groups"][g].get(m) or {}).get("speedup_std") or 0.0 for g in groups]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, ys, width, yerr=errs if any(errs) else None, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g.split(":", 1)[-1] for g in groups], rotation=30, ha="right")
    ax.set_ylabel("speedup over ar (mean tok/s ratio)")
    ax.set_title("Speedup per category")
    if methods:
        ax.legend(fontsize=7, ncol=2)
    _save(fig, path)
    plt.close(fig)


def plot_oracle(hists: dict[str, dict[int, int]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    oracle = next((h for m, h in hists.items() if m.split(":")[0] == "oracle"), None)
    if oracle:
        ax.bar(list(oracle), list(oracle.values()), color="tab:gray")
        ax.set_title(f"Oracle: best draft length per round ({sum(oracle.values())} rounds)")
    else:
        ax.text(0.5, 0.5, "no oracle in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Oracle: best draft length per round")
    ax.set_xlabel("draft length (draft tokens before the first mismatch)")
    ax.set_ylabel("rounds")
    _save(fig, path)
    plt.close(fig)


def plot_vs_oracle(hists: dict[str, dict[int, int]], path: Path) -> None:
    plt = _plt()
    oracle_name = next((m for m in hists if m.split(":")[0] == "oracle"), None)
    methods = [m for m in hists if m != oracle_name] or [oracle_name or "none"]
    cols = min(3, len(methods))
    rows = (len(methods) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    top = max((k for h in hists.values() for k in h), default=1)
    bins = [k - 0.5 for k in range(0, top + 2)]  # one bar centred on every integer length
    for ax, m in zip(axes.flat, methods, strict=False):
        for name, color, style in ((oracle_name, "tab:gray", "stepfilled"), (m, "tab:blue", "step")):
            h = hists.get(name) if name else None
            if not h:
                continue
            vals = [k for k, c in h.items() for _ in range(c)]
            ax.hist(vals, bins=bins, density=True, histtype=style, color=color, linewidth=1.5,
                    alpha=0.5 if style == "stepfilled" else 1.0,
                    label="oracle" if name == oracle_name else "policy")
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("draft length per round", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.suptitle("Draft lengths chosen by each policy vs the oracle's best (share of rounds)")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def markdown(summary: dict, meta: dict) -> str:
    L: list[str] = []
    L.append("# pacer bench report\n")
    L.append(f"- command: `{meta.get('command', '?')}`")
    L.append(f"- git commit: `{meta.get('git_commit', 'unknown')}`" + (" (with uncommitted changes)"
                                                                      if meta.get("git_dirty") else ""))
    if rp := meta.get("repriced_from"):
        L.append(f"- **re-priced**: the records of `{rp.get('run')}` (run by the command above), every forward "
                 f"priced again by `pacer bench --reprice {rp.get('run')} --costs "
                 f"{(meta.get('profile_clock') or {}).get('file')}` at commit `{rp.get('git_commit', '?')}`; "
                 f"no timing was redone")
    for k in ("started", "updated", "cpu", "target", "draft", "dtype", "threads", "max_new_tokens", "repeats",
              "datasets", "selection", "load_average_at_start", "torch", "transformers"):
        if k in meta:
            L.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    cal = meta.get("calibration")
    if cal:
        L.append(f"- calibration ({cal.get('source')}{', noisy' if cal.get('noisy') else ''}): {cal.get('curve')}; "
                 f"{cal.get('verdict')}")
    pc = meta.get("profile_clock")
    if pc:
        L.append(f"- **profile clock** (`--costs {pc.get('file')}`): the speedups and tok/s of the tables price every "
                 f"forward of this run with the profile {pc.get('profile')} - measured on **{pc.get('machine')}** - "
                 f"at the run's context, plus this run's own overhead as measured here (wall time minus the "
                 f"forwards' measured seconds); the cost rule decided with the profile's costs. These are *profile-"
                 f"clock* figures, not a wall-clock run on that machine; the wall clock's are beside them."
                 + (f" The profile's content hash (sha256): `{pc['sha256']}`." if pc.get("sha256") else "")
                 + "".join(f" Note: {n}." for n in pc.get("notes") or []))
    if meta.get("own_clock"):
        L.append(f"- validation clock: the same forwards priced with {meta['own_clock']} (*own / wall* below: 1.00 "
                 f"where the pricing reproduces this machine's wall time)")
    if meta.get("kernel_note"):
        L.append(f"- **note**: {meta['kernel_note']}")
    for note in meta.get("thresholds") or []:
        L.append(f"- threshold of {note}")
    segs = meta.get("segments") or []
    if len(segs) > 1:
        L.append(f"- run in {len(segs)} segments (start, then `--resume`): " + "; ".join(
            f"{g.get('started')} at `{str(g.get('git_commit'))[:12]}`" + (" (dirty)" if g.get("git_dirty") else "")
            + f", load {g.get('load_average_at_start')}" + (f", on {g['cpu']}" if g.get("cpu") else "") for g in segs))
        cpus = list(dict.fromkeys(g["cpu"] for g in segs if g.get("cpu")))
        if len(cpus) > 1:
            L.append(f"- ⚠️ **the segments ran on {len(cpus)} CPUs** ({'; '.join(cpus)}): the profile clock prices "
                     f"every run's forwards alike, but the wall-clock figures pair runs timed on different machines")
    rc = meta.get("lossless_rechecked")
    if rc:
        L.append(f"- differences re-diagnosed with `--recheck-lossless` ({rc.get('outputs')} outputs) on "
                 f"{rc.get('when')} at `{str(rc.get('git_commit'))[:12]}`"
                 + (" (dirty)" if rc.get("git_dirty") else ""))
    skipped = meta.get("skipped") or []
    planned = len(meta.get("methods") or []) * len(meta.get("questions") or []) * int(meta.get("repeats") or 1) \
        - sum(int(sk.get("runs", 1)) for sk in skipped)
    for sk in skipped:
        L.append(f"- {sk['method']} not run on {sk['question']} (repeat {sk['repeat']}): {sk['why']}")
    if planned and summary.get("records", planned) < planned:
        L.append(f"- **PARTIAL RUN: {summary['records']} of {planned} planned (question, method, repeat) runs are "
                 f"finished; continue it with the same command and `--resume`**")
    T = meta.get("temperature") or 0
    L.append(f"- sampling at temperature {T} (seed {meta.get('seed')}; each turn a seeded draw, the same seed for "
             f"every method), verified by the {meta.get('verify') or 'token'} rule unless a method names its own "
             f"(`verify=`): outputs are draws, not compared with ar's token by token (the distribution is what "
             f"speculative sampling keeps; tests/test_sampling.py and tests/test_block.py check it)" if T > 0
             else "- greedy decoding")
    L.append("- wall time per turn from the first forward to the last token (prefill "
             "included, tokenization and the oracle's reference excluded); methods interleaved per question "
             "(`ar` first, the others in rotated order) after a warm-up of every method\n")
    div = summary["divergences"]
    if div:
        L.append(f"## ⚠️ LOSSLESSNESS: {len(div)} output(s) differ from plain decoding\n")
        L.append("Diagnosis at the first differing token, scoring the common prefix with the target in one plain "
                 "forward: *gap* = best logit minus the lower logit of the two differing tokens, also in *steps* of "
                 "the dtype's resolution at that magnitude (bf16: 0.125 for logits in [16, 32), 0.25 in [32, 64)). "
                 f"The criterion (docs/results.md#losslessness): a gap of at most {TIE_STEPS} steps is a near-tie "
                 "that scoring inside a block can flip; on a backend with block *noise* (the largest logit difference "
                 "between tokens scored in blocks and alone, measured on the prefix's last 16 positions: llama.cpp's "
                 "quantized kernels take another path for blocks of 4 tokens or more; 0 on transformers) the gap is "
                 "measured against it instead, and at most twice the noise is a near-tie; more is a losslessness "
                 "failure (**NO**).\n")
        L.append("| question | method | repeat | turn | first differing token | top-2 gap | gap | steps (dtype) "
                 "| noise | gap / noise | near-tie |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for d in div:
            turn = d["turn"] + 1 if isinstance(d.get("turn"), int) else "-"
            res, gap, noise = d.get("resolution"), d.get("gap"), d.get("noise") or 0.0
            # a backend with block-vs-single noise (llama.cpp) is judged against the noise, not the dtype's
            # resolution (a float32 logit's steps would read in the thousands there): one criterion per row
            steps = gap / res if res and gap is not None and not noise else None
            ratio = gap / noise if noise and gap is not None else None
            L.append(f"| {d['dataset']}/{d['question_id']} | {d['method']} | {d['repeat']} | {turn} | "
                     f"{d.get('index', '-')} | {_f(d.get('top2_gap'), '.4f')} | {_f(gap, '.4f')} | "
                     f"{_f(steps, '.1f')} | {_f(noise, '.3f')} | {_f(ratio, '.2f')} | "
                     f"{'yes' if d.get('near_tie') else '**NO**'} |")
        L.append("")
    else:
        L.append(_no_divergence(summary, T))
    overall = summary["groups"].get(OVERALL, {})
    profile = summary.get("clock") == "profile"
    c1 = (pc or {}).get("c_t1") if profile else meta.get("c_t1")
    L.append("## Overall" + (" (profile clock; wall clock beside it)" if profile else "") + "\n")
    L.append("| method | speedup | spread over repeats (sd, min-max) | median per-question ratio | tok/s "
             + ("| wall speedup | wall tok/s " if profile else "")
             + "| τ | acceptance | mean draft | wasted draft / round | overhead / round | own / wall | questions "
               "| lossless |")
    L.append("|---|---|---|---|---|" + ("---|---|" if profile else "") + "---|---|---|---|---|---|---|---|")
    for m, s in overall.items():
        spread = "-" if s["speedup"] is None or len(s["speedup_per_repeat"]) < 2 else (
            f"±{s['speedup_std']:.2f} ({s['speedup_min']:.2f}-{s['speedup_max']:.2f})")
        lossless = "baseline" if m == "ar" else "another backend" if m == "ar@llamacpp" else \
            f"{s['lossless_identical']}/{s['lossless_checked']}" if s["lossless_checked"] else "sampled"
        over = s.get("overhead_per_round")
        over_s = "-" if over is None else f"{over * 1e3:.1f} ms" + (f" ({over / c1:.1%})" if c1 else "")
        wall = f"{_f(s.get('wall_speedup'))}x | {_f(s.get('wall_tokens_per_s'))} | " if profile else ""
        L.append(f"| {m} | {_f(s['speedup'])}x | {spread} | {_f(s['median_ratio'])}x | "
                 f"{_f(s['tokens_per_s'])} | {wall}{_f(s['tau'])} | {_f(s['acceptance_rate'], '.1%')} | "
                 f"{_f(s['mean_draft_length'])} | {_f(s.get('wasted_per_round'))} | {over_s} | "
                 f"{_f(s.get('own_over_wall'))} | {s['questions']} | {lossless} |")
    L.append("")
    if profile and any(s.get("records") == 0 for s in overall.values()):
        L.append("Methods the profile clock cannot price (hf-assisted runs outside pacer's loop; the llama.cpp anchor "
                 "runs another backend) are shown on the wall clock only.\n")
    _first_token(L, overall, profile, summary.get("priced_first_round", True))
    parts = {m: s["breakdown_per_round"] for m, s in overall.items() if s.get("breakdown_per_round")}
    if parts:
        names = list(next(iter(parts.values())))
        L.append("## Where a round's time goes (wall clock, ms per round" + (", share of c_t(1)" if c1 else "")
                 + ")\n")
        L.append("| method | " + " | ".join(n.replace("_", " ") for n in names) + " |")
        L.append("|---|" + "---|" * len(names))
        for m, b in parts.items():
            L.append(f"| {m} | " + " | ".join(f"{b.get(n, 0) * 1e3:.1f}" + (f" ({b.get(n, 0) / c1:.0%})" if c1
                                                                              else "") for n in names) + " |")
        L.append("")
    others = [g for g in summary["groups"] if g != OVERALL]
    if others:
        L.append("## Speedup per dataset and category (τ in brackets)\n")
        heads = [g.replace("category:", "").replace("dataset:", "set ") for g in others]

        def table(cell) -> None:
            """One row per method, one column per group: ``cell(stats)`` of the method in the group, ``-`` without."""
            L.append("| method | " + " | ".join(heads) + " |")
            L.append("|---|" + "---|" * len(others))
            for m in summary["methods"]:
                cells = [cell(s) if (s := summary["groups"][g].get(m)) else "-" for g in others]
                L.append(f"| {m} | " + " | ".join(cells) + " |")
            L.append("")

        table(lambda s: f"{_f(s['speedup'])}x ({_f(s['tau'])})")
        L.append("Median per-question ratio per dataset and category (each question's tok/s over `ar`'s on it; one "
                 "slow turn moves it less than the mean, and a method that does the same work as `ar` is within "
                 "the machine's noise of 1.00x):\n")
        table(lambda s: f"{_f(s['median_ratio'])}x")
    if summary["draft_length_summary"]:
        L.append("## Draft lengths per round (all rounds pooled; the oracle's: the best length per round)\n")
        L.append("| method | rounds | mean | median | p10 | p90 | share 0 | share ≥16 |")
        L.append("|---|---|---|---|---|---|---|---|")
        for m, d in summary["draft_length_summary"].items():
            if not d.get("rounds"):
                continue
            L.append(f"| {m} | {d['rounds']} | {d['mean']:.2f} | {d['median']:.1f} | {d['p10']:.1f} | "
                     f"{d['p90']:.1f} | {d['share_0']:.1%} | {d['share_ge_16']:.1%} |")
        L.append("")
    if summary.get("drafters"):
        L.append("## Phrase drafting (the drafter's counters, all turns)\n")
        L.append("Draft tokens per draft forward (phrases checked in one forward); candidate branches after a draft; "
                 "*pool rounds*: rounds whose draft model drafted nothing and whose pool continuation was scored "
                 "(priced as paying); siblings: the draft's second choice beside a draft token; *phrase rounds*: "
                 "rounds that verified a phrase alone, without the draft model, where it promised more tokens a "
                 "second than a draft round.\n")
        L.append("| method | rounds | draft tokens / forward | candidate rounds | candidate tokens scored / accepted "
                 "| pool rounds | pool tokens scored / accepted | siblings scored / accepted | phrase rounds | "
                 "phrase tokens scored / accepted |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for m, t in summary["drafters"].items():
            per = t["draft_tokens"] / t["draft_forwards"] if t["draft_forwards"] else 0.0
            L.append(f"| {m} | {t['rounds']} | {per:.2f} | {t['candidate_rounds']} | "
                     f"{t['candidate_tokens_proposed']} / {t['candidate_accepted_tokens']} | {t['pool_rounds']} | "
                     f"{t['pool_tokens_proposed']} / {t['pool_accepted_tokens']} | "
                     f"{t['siblings_proposed']} / {t['siblings_accepted']} | {t['phrase_rounds']} | "
                     f"{t['phrase_round_tokens']} / {t['phrase_round_accepted']} |")
        L.append("")
    L.append("## Plots\n")
    for p in PLOTS:
        L.append(f"![{p}]({p})")
    L.append("\nDefinitions: see `docs/bench/README.md` (speedup = mean tok/s of a method over that of `ar` "
             "on the same questions, as in Spec-Bench; τ = tokens per target call, bonus token included).")
    return "\n".join(L) + "\n"


def _no_divergence(summary: dict, temperature: float) -> str:
    """What the losslessness check covered in a run where no output differs: how many greedy outputs were compared
    with plain decoding's, or, sampling, that none was (a draw is checked by its distribution, in the tests)."""
    checked = sum(s.get("lossless_checked", 0) for s in summary["groups"].get(OVERALL, {}).values())
    if temperature > 0:
        return ("Sampling: no output is compared with plain decoding's token for token (each turn is a seeded draw; "
                "that speculative sampling keeps the target's distribution is checked by tests/test_sampling.py and "
                "tests/test_block.py).\n")
    if not checked:
        return "No output was compared with plain decoding's (no method's output was checked).\n"
    return f"All {checked} checked greedy outputs are identical to plain decoding, token for token.\n"


def _first_token(L: list[str], overall: dict, profile: bool, priced: bool) -> None:
    """The TTFT / TPOT table (see :mod:`pacer.bench.metrics`): on the run's clock, the wall clock's beside it."""
    rows = {m: s for m, s in overall.items() if s.get("tpot") is not None or s.get("wall_tpot") is not None}
    if not rows:
        return
    ms = lambda v: "-" if v is None else f"{v * 1e3:.0f} ms"  # noqa: E731
    L.append("## First token and decode (TTFT, TPOT)" + (" (profile clock; wall clock beside it)" if profile else "")
             + "\n")
    L.append("TTFT: a turn's first round (the target's prefill, which gives the first token; in records where the "
             "draft read the prompt and drafted before the prefill, those draft forwards too). TPOT: the rest of the "
             "time over the tokens committed after the first round. *decode speedup*: the speedup on those tokens "
             "alone (mean decode tok/s over `ar`'s, as the speedup).\n")
    if profile and not priced:
        L.append("The profile of this run's `--costs` could not be loaded here, or has changed since the run priced "
                 "with it (`pacer bench --reprice` prices a run again with a profile): TTFT and TPOT are the wall "
                 "clock's only.\n")
    L.append("| method | TTFT | TPOT | decode speedup" + (" | wall TTFT | wall TPOT | wall decode speedup" if profile
                                                         else "") + " |")
    L.append("|---|---|---|---" + ("|---|---|---" if profile else "") + "|")
    for m, s in rows.items():
        wall = f" | {ms(s.get('wall_ttft'))} | {ms(s.get('wall_tpot'))} | {_f(s.get('wall_decode_speedup'))}x" \
            if profile else ""
        L.append(f"| {m} | {ms(s.get('ttft'))} | {ms(s.get('tpot'))} | {_f(s.get('decode_speedup'))}x{wall} |")
    L.append("")


def _profile_clock(meta: dict, records: list[dict] = ()):
    """A recorded forward's seconds on the run's profile clock (``None``: no profile clock, or its profile file is
    not here or not the one the run priced with: its digest differs from the run's, or, for a run made before the
    digest was recorded, it does not reproduce the records' profile-clock times)."""
    pc = meta.get("profile_clock") or {}
    if not pc.get("file"):
        return None
    from ..decoding.meter import Call
    from ..errors import PacerError
    from ..profiles import Profile

    try:
        prof = Profile.load(pc["file"])
    except (PacerError, OSError, ValueError):
        return None
    if prof.describe() != pc.get("profile") or pc.get("sha256", prof.digest()) != prof.digest():
        return None
    if "sha256" not in pc:  # a run made before the digest was recorded: the file must price its records as they are
        from ..profiles import clock_recorded

        for r in records:
            c = r["choices"][0]
            for w, calls, t in zip(c.get("wall_time") or [], c.get("calls") or [], c.get("profile_time") or [],
                                   strict=False):
                if calls and abs(clock_recorded(prof, w, calls) - t) > 1e-5 + 1e-6 * t:
                    return None
    return lambda x: prof.price(Call.from_list(x))


def write_report(out: Path, records: list[dict], methods: list[str], meta: dict) -> dict:
    """Write ``summary.json``, ``report.md`` and the plots into ``out``; returns the summary."""
    clock = "profile" if meta.get("profile_clock") else "wall"
    price = _profile_clock(meta, records) if clock == "profile" else None
    summary = summarize(records, [m for m in methods if any(r["method"] == m for r in records)], clock, price)
    summary["priced_first_round"] = clock == "wall" or price is not None
    summary["meta"] = meta
    summary["records"] = len(records)
    from .limit import oracle_markdown, oracle_summary

    summary["priced_oracle"] = oracle_summary(records, summary["methods"], out)  # None: no oracle pass
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    text = markdown(summary, meta)
    atomic_write_text(out / "report.md", text + ("\n" + "\n".join(oracle_markdown(summary["priced_oracle"]))
                                                 if summary["priced_oracle"] else ""))
    hists = draft_length_histograms(records)
    plot_speedup(summary, out / PLOTS[0])
    plot_oracle(hists, out / PLOTS[1])
    plot_vs_oracle(hists, out / PLOTS[2])
    return summary

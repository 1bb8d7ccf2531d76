"""Command line: ``pacer generate | demo | bench | collect | train | tune`` (also ``python -m pacer``).

Every bad input ends with a one-line ``pacer: error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import sys
import time
from collections.abc import Sequence

from . import preverify_cli
from .args import (
    add_decoding_args,
    add_model_args,
    as_flags,
    auto_method,
    check_args,
    check_model_args,
    load_decoder,
)
from .bench import cli as bench_cli
from .errors import PacerError
from .profiles import Profile, clock
from .serve import cli as serve_cli
from .streaming import TextStreamer


def cmd_generate(args: argparse.Namespace) -> int:

    check_model_args(args)
    args.method = auto_method(args)
    job = check_args(args)
    if args.prompt == "-":
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8") if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        except UnicodeDecodeError as e:
            raise PacerError(f"standard input is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv") from e
    else:
        prompt = args.prompt
    if not prompt.strip():
        raise PacerError("the prompt is empty; pass some text (or '-' to read standard input)")
    profile = Profile.load(args.costs) if args.costs else None  # a bad file is refused before any model loads
    dec = load_decoder(args, job.request)
    if profile is not None:
        for note in dec.use_profile(profile):
            print(f"pacer: note: {note}", file=sys.stderr)
    streamer = None if args.json else TextStreamer(dec.tokenizer, args.stop)
    res = dec.generate(prompt, job, stop=args.stop, chat=args.chat, on_tokens=streamer)
    if profile is not None:
        seconds = clock(profile, res.stats.wall_time, res.stats.calls)
        res.extra["profile_clock"] = {"profile": profile.describe(), "seconds": round(seconds, 6),
                                      "tokens_per_s": round(res.stats.new_tokens / seconds, 4) if seconds > 0 else 0,
                                      "wall_seconds": round(res.stats.wall_time, 6)}
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        streamer.finish(res.text)
        print()
        print(res.stats.summary(), file=sys.stderr)
        if "cost_aware" in res.extra:
            print(cost_note(res.extra["cost_aware"]), file=sys.stderr)
        if profile is not None:
            pc = res.extra["profile_clock"]
            print(f"[profile clock] {pc['seconds']:.2f}s = {pc['tokens_per_s']:.2f} tok/s on {pc['profile']} "
                  f"(every forward priced with the profile, this run's own overhead as measured here; wall clock "
                  f"here {res.stats.wall_time:.2f}s)", file=sys.stderr)
    return 0


def cost_note(rep: dict) -> str:
    """One line on what the cost-aware rule did in a generation."""
    from .costs import Costs

    err = rep["calibration_error"]
    curve = Costs.from_dict(rep["costs"], free_draft=True).curve()  # (c_d is 0 without a draft model: lookup)
    if not rep.get("length", True):
        return (f"[cost-aware] the draft length is the literal rule's; phrases and branches priced on costs "
                f"({rep['source']}): {curve} (--cost-aware off: not priced)")
    return (f"[cost-aware] {rep['zero_rounds']}/{rep['rounds']} rounds drafted nothing (plain decoding steps); "
            f"costs ({rep['source']}): {curve}; per-token acceptance "
            f"{rep['alpha']:.2f}" + (f", survival-score calibration error {err:.3f}" if err is not None else "")
            + " (--cost-aware off, --gamma or --threshold to override)")


DEMO_PROMPTS = [
    ("raw", 'def is_palindrome(s: str) -> bool:\n'
            '    """Return True if s reads the same forwards and backwards,'
            ' ignoring case and non-alphanumeric characters."""\n'),
    ("chat", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?"),
    ("chat", "Write a Python function that returns the n-th prime number, with a short docstring."),
    # grounded: the answer repeats much of the prompt, where drafting from the text pays
    ("chat", "Here is a function:\n\n```python\ndef average(values):\n    total = 0\n    count = 0\n"
             "    for value in values:\n        total += value\n        count += 1\n    return total / count\n```\n\n"
             "Edit it so that it returns 0.0 for an empty list and has type hints. Reply with the whole edited "
             "function only."),
]


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: a few prompts with plain and speculative decoding, interleaved, with the speedup.

    Exits 1 when an output differs from plain decoding and the target's top-2 logit gap at the first difference
    is not a near-tie (a real losslessness failure); 0 otherwise."""

    asked = args.backend
    check_model_args(args)
    args.method = auto_method(args)
    job = check_args(args)
    ignored = [flag for flag, used in (("--temperature", args.temperature != 0.0), ("--top-k", args.top_k != 0),
                                       ("--top-p", args.top_p != 1.0), ("--seed", args.seed != 0),
                                       ("--verify", args.verify is not None),
                                       ("--stop", bool(args.stop)), ("--chat", args.chat)) if used]
    if ignored:
        raise PacerError(f"pacer demo decodes greedily on its own prompts and takes no {', '.join(ignored)}; "
                         f"use pacer generate for that")
    from .machine import describe_cpu

    dec = load_decoder(args)
    record = dec.pair.record
    runs = dec.target_info.weights if record.dtypes else f"{args.backend} backend"
    print(f"pacer demo: target {args.target}, draft {args.draft}, {runs}, {dec.threads} threads, "
          f"method {args.method}, {args.max_new_tokens} new tokens per prompt")
    print(f"machine: {describe_cpu()}")
    from .backends import reason

    why = reason(args.backend) if asked == "auto" else f"--backend {asked}"
    print(f"backend: {args.backend} ({why})")
    print(f"weights: target {dec.target_info.weights}, draft {dec.draft_info.weights}"
          + (" (int8 weight-only: measured faster here; lossless, the draft only proposes)"
             if dec.draft_info.weights.startswith("int8") and args.quantize == "none" else ""))
    if args.dtype == "auto" and record.auto_dtype:
        why = record.auto_dtype(dec.device, getattr(args, "progress", True))[1]
        print(f"dtype: {dec.target_info.dtype_name} (--dtype auto: {why})")
    dec.generate("Hello", "ar", max_new_tokens=2)  # warm-up
    from .calibration import regime

    cal = dec.calibration(dec.draft_rows(dec.draft_vocab))
    print(f"measured costs ({cal.source}): {cal.costs.curve()}")
    print(f"=> {cal.verdict()}")
    print(f"=> {regime(cal.costs, dec.target_info.backend, dec.target_info.weights)}")
    if note := cal.costs.slow_one_row_note():
        print(f"note: {note}")
    anchor = None
    if record.anchor:  # the user's real anchor: llama.cpp's plain decoding of the same GGUF
        from .bench.run import anchor_decoder

        anchor = anchor_decoder(args, dec)
        if anchor is not None:
            anchor.generate("Hello", "ar", max_new_tokens=2)
    print()
    rows = []
    anchor_ratios = []
    for kind, prompt in DEMO_PROMPTS:
        ar = dec.generate(prompt, "ar", args.max_new_tokens, chat=kind == "chat")
        if anchor is not None:
            fast = anchor.generate(prompt, "ar", args.max_new_tokens, chat=kind == "chat")
            anchor_ratios.append(fast.stats.tokens_per_s / max(ar.stats.tokens_per_s, 1e-9))
        sd = dec.generate(prompt, job, chat=kind == "chat")
        same = ar.token_ids == sd.token_ids
        print("-" * 100)
        print(prompt.strip()[:200])
        print("-" * 40 + " output " + "-" * 52)
        print(sd.text)
        print("-" * 100)
        print(ar.stats.summary())
        print(sd.stats.summary())
        if "cost_aware" in sd.extra:
            print(cost_note(sd.extra["cost_aware"]))
        note = "identical to plain decoding" if same else "DIFFERS from plain decoding"
        real_diff = False
        if not same:
            from .decoding import first_divergence

            ids = dec.encode(prompt, kind == "chat")
            dv = first_divergence(dec.target, ids, ar.token_ids, sd.token_ids)
            note += f" at token {dv.index} (target {dv.describe()})"
            real_diff = not dv.near_tie
        speed = sd.stats.tokens_per_s / ar.stats.tokens_per_s if ar.stats.tokens_per_s > 0 else 0.0
        print(f"=> speedup {speed:.2f}x, {note}\n")
        rows.append((speed, same, real_diff))
    import statistics

    median = statistics.median(r[0] for r in rows)
    real = sum(r[2] for r in rows)
    verdict = f"; FAILED: {real} output(s) differ from plain decoding where the target was NOT near a tie" \
        if real else ""
    if median < 1.1:
        c = cal.costs
        print(f"why not faster: {cal.verdict()}; a draft token costs {c.draft / c.target_cost(1):.2f} of a "
              f"target forward ({describe_cpu()})")
    print(f"median speedup of {args.method} over plain decoding: {median:.2f}x; "
          f"outputs identical: {sum(r[1] for r in rows)}/{len(rows)}{verdict}")
    if anchor_ratios:
        a = statistics.median(anchor_ratios)
        print(f"anchor: llama.cpp's plain decoding of the same GGUF runs {a:.2f}x this backend's plain decoding "
              f"here (median of {len(anchor_ratios)}), i.e. {args.method} here is {median / a:.2f}x what llama.cpp "
              f"gives without pacer (pacer demo --backend llamacpp runs pacer there)")
    return 1 if real else 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Re-measure this machine's forward costs for a pair, cache them, print the curve (and plot it) and the regime
    it puts this machine in (:func:`pacer.calibration.regime`: whether drafting pays, and what to expect); with
    ``--export FILE`` also measure and write this machine's cost profile (:mod:`pacer.profiles`)."""
    from .io import check_out_file
    from .machine import describe_cpu

    if args.plot and not args.plot.lower().endswith(".png"):
        raise PacerError(f"--plot takes a .png file name, got '{args.plot}'")
    for flag, path in (("--plot", args.plot), ("--export", args.export)):
        if path:
            check_out_file(path, flag)
    from . import breakeven
    from .calibration import regime

    contexts = _contexts(args.contexts)
    dec = load_decoder(args)
    cal = dec.calibration(dec.draft_rows(dec.draft_vocab), refresh=True)
    if args.json:
        print(json.dumps({**cal.to_dict(), "regime": regime(cal.costs, dec.target_info.backend,
                                                              dec.target_info.weights),
                          "break_even": breakeven.describe(cal.costs.draft, cal.costs.target_cost)}, indent=2))
    else:
        c = cal.costs
        print(f"machine: {describe_cpu()}; {dec.threads} threads; torch {cal.key.get('torch')}")
        print(f"pair: {args.target} + {args.draft}, {dec.target_info.weights}, "
              f"draft vocabulary {cal.key.get('draft_rows')}")
        print(f"{'k':>4} {'target ms':>10} {'ms per token':>13}  (one forward scoring k new tokens after "
              f"{cal.key.get('context')} cached)")
        for k in sorted({*c.target, 16}):
            tag = "" if k in cal.measured else "  (interpolated)" if k < max(cal.measured, default=0) \
                else "  (extrapolated)"
            print(f"{k:>4} {c.target_cost(k) * 1e3:>10.1f} {c.target_cost(k) / k * 1e3:>13.1f}{tag}")
        print(f"draft: {c.draft * 1e3:.1f} ms per token (prefill {c.draft_prefill * 1e3:.2f} ms per token); "
              f"target prefill: {cal.prefill * 1e3:.2f} ms per prompt token; measured in {cal.seconds:.1f}s")
        print(f"NOISY (the machine was busy): {cal.notes[-1]}" if cal.noisy else f"cached in {cal.cached}"
              if cal.cached else cal.notes[-1] if cal.notes else "not cached")
        print(f"=> {cal.verdict()}")
        print(f"=> {regime(c, dec.target_info.backend, dec.target_info.weights)}")
        print(f"=> break-even: {breakeven.describe(c.draft, c.target_cost)}")
    if args.plot:
        from .calibration import plot

        plot(cal, args.plot, describe_cpu())
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.export:
        from . import profiles

        def say(msg: str) -> None:
            print(f"pacer: profiling: {msg}", file=sys.stderr)

        rows = dec.draft_rows(dec.draft_vocab) if dec.draft_info is not None else None
        prof = profiles.measure(dec.pair, rows, contexts, say=say)
        prof.name = args.profile_name or profiles.default_name(prof)
        prof.save(args.export)
        c1 = {c: row[1] for c, row in prof.target_cost.items()}
        print(f"profile {prof.name} written to {args.export}: c_t(1) by context "
              + ", ".join(f"{c}: {v * 1e3:.0f} ms" for c, v in c1.items())
              + f"; c_t(8)/c_t(1) at {min(c1)}: {prof.target_cost[min(c1)][8] / c1[min(c1)]:.2f}")
    return 0


def _contexts(text: str) -> tuple[int, ...]:
    from .bounds import MAX_CONTEXT, Count

    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out:
        raise PacerError(f"--contexts takes comma-separated token counts >= 1, e.g. 32,512,2048; got '{text}'")
    bound = Count("--contexts", 1, MAX_CONTEXT, "the longest context pacer measures at")
    return tuple(bound.check(c) for c in out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pacer",
                                 description="Lossless speculative decoding with adaptive draft length")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt", help="the prompt, or - to read standard input")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    g.add_argument("--costs", default=None, metavar="PROFILE.json",
                   help="decide and clock with another machine's cost profile (docs/profiles/; pacer calibrate "
                        "--export): the profile clock is printed beside the wall clock")
    add_model_args(g)
    add_decoding_args(g)
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="plain vs speculative decoding on a few prompts, with the measured "
                                    "speedup")
    add_model_args(d)
    add_decoding_args(d)
    d.set_defaults(func=cmd_demo, max_new_tokens=96)
    c = sub.add_parser("calibrate", help="measure this machine's forward costs (target vs k scored tokens, draft "
                                         "token, prefill), cache and print them, with this machine's regime: "
                                         "whether drafting pays here and the speedup to expect")
    add_model_args(c)
    c.add_argument("--plot", default=None, metavar="FILE.png", help="also plot the cost curve")
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    c.add_argument("--export", default=None, metavar="FILE.json",
                   help="also measure this machine's cost profile (c_t(k) at several contexts, tree forwards, draft "
                        "curve, prefill) and write it to FILE (for --costs on any machine; a symbolic link: its "
                        "target is written)")
    c.add_argument("--contexts", default="32,128,512,2048", help="contexts the profile measures at (--export)")
    c.add_argument("--profile-name", default=None, help="the profile's name (default CPU-BACKEND-DTYPE)")
    c.set_defaults(func=cmd_calibrate)
    bench_cli.register(sub)
    preverify_cli.register(sub)
    serve_cli.register(sub)
    return ap


def _join_negative_lists(argv: list[str]) -> list[str]:
    """``--layers -2,-1`` as ``--layers=-2,-1`` (argparse takes a value starting with ``-`` for an option)."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] in ("--layers",) and re.fullmatch(r"-\d+(,-?\d+)*", a):
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def os_problem(e: OSError) -> str:
    """One line for a file or disk error: what failed, where, and what to do."""
    where = f" ({e.filename})" if e.filename else ""
    what = e.strerror or str(e) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{what}{where}: free some space (or pass a folder on another disk) and run again; what was being " \
               f"written is not left half-written"
    if e.errno in (errno.EISDIR, errno.ENOTDIR):
        return f"{what}{where}: a folder stands where a file is written, or a file where a folder is; pass another path"
    return f"{what}{where}; check the path and its permissions"


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    start = time.perf_counter()
    try:
        # a bounded flag (pacer.bounds.Count) refuses its value while parsing: the same one-line error as below
        args = ap.parse_args(_join_negative_lists(list(sys.argv[1:] if argv is None else argv)))
        if hasattr(args, "draft_vocab"):
            from .pair import parse_draft_vocab

            args.draft_vocab = parse_draft_vocab(args.draft_vocab, "--draft-vocab")
            if isinstance(args.draft_vocab, int) and args.draft_vocab > 0 and getattr(args, "draft", None):
                from .draftvocab import check_size
                from .models import configured_vocab

                if (vocab := configured_vocab(args.draft, args.dtype)) is not None:  # before any model loads
                    check_size(args.draft_vocab, vocab)
        return int(args.func(args) or 0)
    except PacerError as e:
        print(f"pacer: error: {as_flags(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a file or disk problem that reached the top (a full disk mid-run): one line, as above
        print(f"pacer: error: {os_problem(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npacer: interrupted after {time.perf_counter() - start:.0f}s", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

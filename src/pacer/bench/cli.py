"""The ``pacer bench`` subcommand: arguments, validation, resume checks and the actions on a finished run (the run
itself: :mod:`pacer.bench.run`; see :mod:`pacer.bench`)."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import shlex
from pathlib import Path

from .. import backends
from ..args import add_model_args, add_verify_arg, as_flags
from ..bounds import MAX_NEW_TOKENS, MAX_PROMPTS, MAX_REPEATS, MAX_SEED, MIN_SEED, Count
from ..errors import PacerError
from ..io import resolve_path
from ..pair import check_threads
from ..request import verify_problem
from .run import answers, git, greedy, load_run_decoder, lock, read_meta, report, run, write_meta

DEFAULT_METHODS = ("ar,sd:gamma=4,heuristic,confidence,entropy,oracle,hf-assisted,"
                   "hf-assisted:schedule=heuristic")


def register(subparsers) -> None:
    """Add the ``bench`` subcommand (it has its own decoding flags: methods are given as ``--methods`` specs)."""
    p = subparsers.add_parser(
        "bench", help="benchmark methods on held-out questions (speedup, tau, losslessness, plots)",
        description="Benchmark decoding methods on the same loaded pair, interleaved per question. "
                    "Writes answers.jsonl, summary.json, report.md and plots into --out.")
    add_arguments(p)
    p.set_defaults(func=cmd_bench)


def _backend_defaults() -> str:
    return "; ".join(f"{b.name}: {b.bench_methods}" for b in map(backends.get, backends.names()) if b.bench_methods)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default=None,
                   help="comma-separated name:key=val:... items, e.g. 'ar,sd:gamma=2..8,heuristic,"
                        "confidence:threshold=0.4,oracle,pacer,hf-assisted,hf-assisted:schedule=heuristic' "
                        f"(default: {DEFAULT_METHODS}; a backend may name its own: {_backend_defaults()})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--questions", type=Path, default=None,
                     help="Spec-Bench / MT-bench question JSONL (question_id, category, turns)")
    src.add_argument("--dataset", default=None,
                     help="packaged set(s), comma-separated: humaneval, gsm8k, mtbench, sharegpt (held-out split), "
                          "dev (the development set: 48 questions of 8 kinds; use --n 48 for all)")
    p.add_argument("--n", type=Count("--n", 1, MAX_PROMPTS), default=None,
                   help="questions per dataset (default 10; --quick: all 4)")
    p.add_argument("--select", default="stratified", choices=["stratified", "first", "random"],
                   help="question selection (stratified: round-robin over categories in file order)")
    p.add_argument("--select-seed", type=Count("--select-seed", MIN_SEED, MAX_SEED), default=0,
                   help="seed of --select random")
    p.add_argument("--max-new-tokens", type=Count("--max-new-tokens", 1, MAX_NEW_TOKENS), default=None,
                   help="per turn (default 128; --quick: 24)")
    p.add_argument("--repeats", type=Count("--repeats", 1, MAX_REPEATS), default=1,
                   help="passes over all questions (spread of the speedup)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, every output checked against ar's token by token; > 0: sampling, "
                        "each turn a seeded draw (the same seed for every method), not compared token by token")
    p.add_argument("--seed", type=Count("--seed", MIN_SEED, MAX_SEED), default=0,
                   help="base seed of --temperature > 0 (per question/repeat/turn)")
    add_verify_arg(p, "token; a method spec's verify=token|block chooses its own, so both rules run interleaved "
                      "in one bench, e.g. --methods ar,sd,sd:verify=block")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--resume", action="store_true", help="continue a run in --out, skipping finished records")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from --out without models")
    p.add_argument("--export-specbench", type=Path, default=None, metavar="DIR",
                   help="write --out's answers as Spec-Bench answer files, one per method (DIR/METHOD.jsonl; "
                        "run_N/ folders for several repeats), for Spec-Bench's evaluation/speed.py; no models")
    p.add_argument("--recheck-lossless", action="store_true",
                   help="re-diagnose every output in --out that differs from ar with the current near-tie criterion "
                        "(loads the run's target, rebuilds its questions from run.json; no timing is redone), "
                        "then rebuild the report")
    p.add_argument("--reprice", type=Path, default=None, metavar="RUN",
                   help="price the forwards recorded in run folder RUN again with --costs (a corrected or another "
                        "profile of the same pair and backend) and write that run and its report to --out; no "
                        "models, no timing redone: the cost rule's decisions stay those RUN made with its own costs")
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny random models, built-in questions")
    p.add_argument("--skip-failing", action="store_true", help="drop methods that fail their warm-up")
    p.add_argument("--costs", type=Path, default=None, metavar="PROFILE.json",
                   help="the profile clock: decide with this cost profile (docs/profiles/, pacer calibrate --export) "
                        "and price every forward with it plus this run's own overhead; the report shows it beside "
                        "the wall clock")
    p.add_argument("--own-profile", type=Path, default=None, metavar="PROFILE.json",
                   help="this machine's own profile for the validation clock (default: its calibration)")
    p.add_argument("--validation", type=Path, default=None, metavar="CKPT",
                   help="the checkpoint whose recorded rule thresholds `rule:threshold=validation` runs (chosen by "
                        "pacer train on its collection's validation prompts under its costs, never on benchmark "
                        "questions); default: the shipped pacer checkpoint of the backend")
    p.add_argument("--no-anchor", dest="anchor", action="store_false",
                   help="do not run llama.cpp's plain decoding of a GGUF target beside a transformers-backend run")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_model_args(p)


def parser() -> argparse.ArgumentParser:
    """A parser of ``pacer bench`` arguments alone (a recorded command is re-read with it)."""
    ap = argparse.ArgumentParser(prog="pacer bench")
    add_arguments(ap)
    return ap


def _validate(args: argparse.Namespace) -> None:
    if args.quick:  # tiny models are overhead-bound: one thread is fastest and suffers least from busy cores
        args.max_new_tokens = args.max_new_tokens if args.max_new_tokens is not None else 24
        args.threads = args.threads or 1
        from ..backends.transformers import TRANSFORMERS

        args.backend = TRANSFORMERS.name if args.backend == "auto" else args.backend  # the tiny pair: torch models
    else:
        args.n = args.n if args.n is not None else 10
        args.max_new_tokens = args.max_new_tokens if args.max_new_tokens is not None else 128
        if not args.questions and not args.dataset and not args.report_only:
            raise PacerError("pass --dataset NAME[,NAME] or --questions FILE (or --quick)")
    if args.n is not None and args.n <= 0:
        raise PacerError(f"--n must be >= 1, got {args.n}")
    if args.max_new_tokens <= 0:
        raise PacerError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.repeats <= 0:
        raise PacerError(f"--repeats must be >= 1, got {args.repeats}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise PacerError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    check_threads(args.threads)  # --quick loads no LoadSpec of its own before its models
    if why := verify_problem(args.temperature, args.verify):
        raise PacerError(as_flags(why))


def load_questions(args: argparse.Namespace):
    from . import data

    if args.questions:
        return data.select(data.load_question_file(args.questions), args.n, args.select, args.select_seed)
    if args.dataset:
        # Datasets are interleaved (1st of each, 2nd of each, ...): an interrupted run still covers every dataset.
        names = [s.strip() for s in args.dataset.split(",") if s.strip()]
        if twice := next((n for i, n in enumerate(names) if n in names[:i]), None):
            raise PacerError(f"--dataset lists {twice} twice (each question would run twice and a finished run read "
                             f"as partial); list each dataset once")
        per_set = [data.select(data.load_dataset(name), args.n, args.select, args.select_seed) for name in names]
        out = [qs[i] for i in range(max(map(len, per_set), default=0)) for qs in per_set if i < len(qs)]
        if not out:
            raise PacerError("--dataset is empty")
        return out
    return data.select(list(data.QUICK_QUESTIONS), args.n, args.select, args.select_seed)


def reprice(run: Path, costs: Path | None, out: Path) -> int:
    """``--reprice RUN --costs FILE --out OUT``: RUN's records with every forward priced again on FILE's clock
    (:func:`pacer.profiles.clock`: the recorded calls and wall times, no models), written with a report to OUT.
    Only what RUN priced (on its profile or its own clock) is priced: an anchor on another backend or a method
    outside pacer's loop stays unpriced. The rule decided with the costs RUN ran with, which the report says. A
    profile of another pair or backend, an OUT that is RUN or holds anything, or a record that cannot be priced
    is refused in one line before OUT is written; OUT is built aside and appears whole."""
    import shutil

    from ..io import check_out_dir
    from ..profiles import Profile, clock_recorded
    from . import records as rec_io

    if costs is None:
        raise PacerError("--reprice needs --costs PROFILE.json: the profile to price the run's forwards with")
    if resolve_path(out, "--out") == resolve_path(run, "--reprice"):
        raise PacerError("--reprice writes a new run folder: pass another --out than the run it reprices")
    check_out_dir(out)
    if out.exists() and any(out.iterdir()):
        raise PacerError(f"--out {out} is not empty; --reprice writes a new run folder")
    meta = read_meta(run)
    if not meta or not (run / "answers.jsonl").exists():
        raise PacerError(f"--reprice: {run} holds no pacer bench run (run.json and answers.jsonl)")
    prof = Profile.load(costs)
    # run.json does not record the draft's vocabulary rows: they are not compared (the dtype and model are)
    draft = {"fingerprint": meta["draft_fingerprint"], "dtype": meta.get("draft_weights"),
             "rows": (prof.draft or {}).get("rows")} if meta.get("draft_fingerprint") else None
    notes = prof.check_pair(meta.get("backend", ""), {"fingerprint": meta.get("target_fingerprint"),
                                                      "dtype": meta.get("target_weights")}, draft)
    was = meta.get("profile_clock") or {}
    records = answers(run, meta)
    priced = 0
    for rec in records:
        c = rec["choices"][0]
        if "profile_time" not in c and "own_time" not in c:
            continue  # not priced by the run: an anchor on another backend, a method outside pacer's loop
        calls, walls = c.get("calls") or [], c.get("wall_time") or []
        if len(calls) != len(walls) or not all(calls):
            raise PacerError(f"--reprice: {run}'s record {rec.get('answer_id')} has no forwards for every turn; "
                             f"it cannot be priced again")
        c["profile_time"] = [round(clock_recorded(prof, w, cl), 6) for w, cl in zip(walls, calls, strict=True)]
        priced += 1
    commit = str(meta.get("git_commit") or "?")[:12]
    decided = f"{was['profile']}, as {was.get('file')} held it at the run's commit {commit}" if was else \
        "this machine's own costs"
    meta["profile_clock"] = {"profile": prof.describe(), "file": str(costs), "machine": prof.machine.get("describe"),
                             "notes": [*prof.notes, *notes, f"re-priced from {run} by --reprice: the cost rule "
                                                             f"decided with {decided}"],
                             "c_t1": prof.c1(), "sha256": prof.digest()}
    meta["repriced_from"] = {"run": str(run), "profile_clock": was or None,
                             "git_commit": git("rev-parse", "HEAD") or "unknown"}
    tmp = out.parent / f".{out.name}.reprice-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        rec_io.write_all(tmp / "answers.jsonl", records)
        write_meta(tmp, meta)
        summary = report(tmp, meta.get("methods", []), meta)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"pacer bench: {priced} of {len(records)} record(s) of {run} re-priced with {costs}; report in {out} "
          f"({len(summary['divergences'])} lossless violations)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``pacer bench``: an action on a finished run in ``--out``, or a run: its settings, methods, questions and
    profiles checked and its folder taken (each before any model loads), then :func:`pacer.bench.run.run`."""
    out: Path = args.out
    if args.export_specbench is not None:
        return export_specbench(out, args.export_specbench)
    if args.report_only:
        return report_only(out)
    if args.recheck_lossless:
        return recheck_lossless(out)
    if args.reprice is not None:
        return reprice(args.reprice, args.costs, out)
    _validate(args)
    if not args.quick:
        from ..args import check_model_args

        check_model_args(args)
    methods_text, specs = _methods(args)
    questions = load_questions(args)
    _load_profiles(args)
    previous = _previous_run(args, questions)
    out.mkdir(parents=True, exist_ok=True)
    folder = lock(out)
    try:
        return run(args, out, specs, questions, previous, methods_text)
    finally:
        folder.close()


def export_specbench(out: Path, folder: Path) -> int:
    """``--export-specbench DIR``: the run's answers as Spec-Bench answer files."""
    from ..io import check_out_dir
    from .specbench import export

    check_out_dir(folder, "--export-specbench")  # before anything is read or written
    if resolve_path(folder, "--export-specbench") == resolve_path(out, "--out"):
        raise PacerError("--export-specbench writes Spec-Bench's files beside the run's own: pass another folder "
                         "than --out")
    if not (out / "answers.jsonl").exists():
        raise PacerError(f"--export-specbench: {out / 'answers.jsonl'} does not exist")
    files = export(answers(out, read_meta(out)), folder)
    print(f"pacer bench: {len(files)} Spec-Bench answer file(s) in {folder}")
    return 0


def report_only(out: Path) -> int:
    """``--report-only``: the report rebuilt from the run's records, no models."""
    meta = read_meta(out)
    if not (out / "answers.jsonl").exists():
        raise PacerError(f"--report-only: {out / 'answers.jsonl'} does not exist")
    summary = report(out, meta.get("methods", []), meta)
    print(f"pacer bench: report rebuilt in {out} ({len(summary['divergences'])} lossless violations)")
    return 0


def _methods(args: argparse.Namespace) -> tuple[str, list]:
    """``--methods`` (or the backend's or the default list) parsed into specs, with the validation thresholds that
    ``rule:threshold=validation`` runs noted in ``args.threshold_notes``; greedy-only methods refused under
    sampling."""
    from .methods import parse_methods

    methods_text = args.methods or backends.get(args.backend).bench_methods or DEFAULT_METHODS
    chosen: dict[str, dict] = {}

    def validation() -> dict[str, dict]:
        from ..policies.learned import default_checkpoint
        from .methods import validation_thresholds

        if not chosen:
            chosen.update(validation_thresholds(args.validation or default_checkpoint("pacer", args.backend),
                                                "greedy" if args.temperature == 0 else "sampled"))
        return chosen

    specs = parse_methods(methods_text, validation)  # errors before anything is loaded or written
    args.threshold_notes = [f"`{s.label}`: θ = {chosen[s.name]['threshold']:g} from {chosen[s.name]['checkpoint']}, "
                       f"chosen by {chosen[s.name]['chosen']}" for s in specs if "threshold=validation" in s.label]
    if named := [s.label for s in specs if verify_problem(args.temperature, s.verify)]:
        raise PacerError(f"{', '.join(named)}: " + as_flags(verify_problem(args.temperature, "block")))
    greedy_only = [s.label for s in specs if s.greedy_only]
    if args.temperature > 0 and greedy_only:
        raise PacerError(f"--temperature {args.temperature}: {', '.join(greedy_only)} decode(s) greedily only (the "
                         f"oracle drafts against ar's greedy answer); drop them from --methods or use --temperature 0")
    return methods_text, specs


def _load_profiles(args: argparse.Namespace) -> None:
    """``--costs`` and ``--own-profile`` read into ``args.profile`` / ``args.own`` (refused before any model loads)."""
    from ..profiles import Profile

    args.profile = Profile.load(args.costs) if args.costs else None
    args.own = Profile.load(args.own_profile) if args.own_profile else None


def _previous_run(args: argparse.Namespace, questions: list) -> dict:
    """The run.json of the run in ``--out`` (``{}``: none), checked: a folder that holds a run is taken only by
    ``--resume``, with the run's questions (or more), costs, thresholds and machine."""
    from ..io import check_out_dir

    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise PacerError(f"--out {out} exists and is not a folder")
    check_out_dir(out)
    if folders := [n for n in ("answers.jsonl", "run.json", "report.md", "summary.json") if (out / n).is_dir()]:
        raise PacerError(f"--out {out} holds a folder named {folders[0]} where the run writes that file; remove it or "
                         f"choose another --out")
    previous = read_meta(out)
    if args.resume:
        _check_resume(args, previous, questions)
    has_answers = (out / "answers.jsonl").exists() and (out / "answers.jsonl").stat().st_size > 0
    if (previous or has_answers) and not args.resume:
        raise PacerError(f"--out {out} already holds a benchmark run; pass --resume to continue it, "
                         f"or choose another folder")
    if has_answers and not previous:
        raise PacerError(f"--resume: {out} has answers but no run.json (not a pacer bench run, or damaged): its "
                         f"settings cannot be checked; use another --out")
    return previous


def _check_resume(args: argparse.Namespace, previous: dict, questions: list) -> None:
    """What a resumed run must keep of the run it continues: its questions (a superset may run), not a re-priced
    run's, and the same costs, validation thresholds and machine."""
    out: Path = args.out
    if previous.get("questions") is not None:
        asked = {q.key for q in questions}  # the set may grow (a larger --n), never lose a question
        if lost := [k for k in previous["questions"] if k not in asked]:
            raise PacerError(f"--resume: {out} answers another question set ({len(previous['questions'])} questions; "
                             f"this command asks {len(asked)}, without {lost[0]}); resume with the run's own "
                             f"questions or a superset of them (its command is in run.json) or use another --out")
    if previous.get("repriced_from"):
        raise PacerError(f"--resume: {out} is a re-priced run (pacer bench --reprice), whose rule decided with "
                         f"other costs than its profile's; resume the run it came from, "
                         f"{previous['repriced_from'].get('run')}")
    if previous:  # what the methods decide with must not change between segments
        _check_resumed_decisions(args, previous)
    if previous.get("cpu_identity"):
        from ..machine import cpu_identity, describe_cpu

        if previous["cpu_identity"] != cpu_identity():
            raise PacerError(f"--resume: {out} was started on {previous.get('cpu')}, this machine is {describe_cpu()}: "
                             f"its wall-clock ratios would pair questions timed on two machines; run the benchmark "
                             f"again into another --out")


def _check_resumed_decisions(args: argparse.Namespace, previous: dict) -> None:
    """A resumed run decides with the costs (``--costs``) and validation thresholds the run started with."""
    out: Path = args.out
    was = (previous.get("profile_clock") or {}).get("file")
    now = str(args.costs) if args.costs else None
    if was != now or (was and previous["profile_clock"].get("profile") != args.profile.describe()):
        raise PacerError(f"--resume: {out} was run with " + (f"--costs {was}" if was else "no --costs")
                         + " (the cost rule decides with it), this run has "
                         + (f"--costs {now}" if now else "none") + "; pass the run's own --costs (its command "
                         "is in run.json) or use another --out")
    # the validation clock: a run priced on a given own profile resumes on it, one on its calibration without one
    own_before = bool(previous.get("own_profile_sha256")) or "--own-profile" in shlex.split(previous.get("command")
                                                                                            or "")
    if own_before != (args.own is not None) and previous.get("own_clock"):
        raise PacerError(f"--resume: {out} was run " + ("with --own-profile" if own_before else "on this machine's "
                         "calibration (no --own-profile)") + ", this run " + ("has none" if own_before else
                         f"has --own-profile {args.own_profile}") + ": its validation clock would change mid-run; "
                         "pass the run's own --own-profile (its command is in run.json) or use another --out")
    # the same file may hold other costs by now: the content the run recorded is what must match
    for flag, recorded, profile in (("--costs", (previous.get("profile_clock") or {}).get("sha256"), args.profile),
                                    ("--own-profile", previous.get("own_profile_sha256"), args.own)):
        if recorded and profile is not None and profile.digest() != recorded:
            raise PacerError(f"--resume: {flag} {getattr(args, flag[2:].replace('-', '_'))} holds other costs than "
                             f"the run {out} was made with (its sha256 {profile.digest()[:12]}... is not run.json's "
                             f"{str(recorded)[:12]}...): one report would mix two cost sets; restore the run's "
                             f"profile or use another --out")

    def by_label(notes: list[str] | None) -> dict[str, str]:
        return {n.split("`")[1]: n for n in notes or [] if n.count("`") >= 2}

    old_t, new_t = by_label(previous.get("thresholds")), by_label(args.threshold_notes)
    if changed := [k for k in old_t if k in new_t and old_t[k] != new_t[k]]:
        raise PacerError(f"--resume: {out} ran {changed[0]} at another validation threshold (run.json "
                         f"'thresholds'); pass the run's own --validation checkpoint or use another --out")


def recheck_lossless(out: Path) -> int:
    """Re-diagnose the recorded differences of the run in ``out`` (its ``answers.jsonl``) with the current
    :class:`pacer.decoding.Divergence` criterion. The prompts are rebuilt as the run built them (the question,
    the chat template and, for later turns, the method's own earlier answers); the answers file is rewritten
    atomically, then the report."""
    from . import records as rec_io
    from .runner import check_lossless, recorded_turns

    meta = read_meta(out)
    if not meta.get("command") or not (out / "answers.jsonl").exists():
        raise PacerError(f"--recheck-lossless: {out} holds no finished benchmark run (run.json with its command "
                         f"and answers.jsonl)")
    from ..pair import parse_draft_vocab

    run_args = parser().parse_args(shlex.split(meta["command"])[2:])
    run_args.draft_vocab = parse_draft_vocab(run_args.draft_vocab)
    _validate(run_args)
    questions = {q.key: q for q in load_questions(run_args)}
    records = rec_io.repair(out / "answers.jsonl", greedy(meta), bool(meta.get("answers_signed")))
    ar = {(r["dataset"], r["question_id"], r.get("repeat", 0)): r for r in records if r["method"] == "ar"}
    todo = [r for r in records if r.get("lossless") is False]
    if not todo:
        print(f"pacer bench: no output in {out} differs from ar; nothing to recheck")
        return 0
    dec, *_ = load_run_decoder(run_args)
    if meta.get("target_weights") and dec.target_info.weights != meta["target_weights"]:
        raise PacerError(f"--recheck-lossless: {out} ran the target as {meta['target_weights']}, this machine loaded "
                         f"{dec.target_info.weights}; recheck where the run was made")
    changed = 0
    for r in todo:
        key = f"{r['dataset']}/{r['question_id']}"
        if key not in questions:
            raise PacerError(f"--recheck-lossless: question {key} of {out} is not in the run's question set")
        ref = ar[(r["dataset"], r["question_id"], r.get("repeat", 0))]["choices"][0]["token_ids"]
        ok, div = check_lossless(dec, recorded_turns(dec, questions[key], r), ref)
        changed += div != r.get("divergence")
        r["lossless"], r["divergence"] = ok, div
    rec_io.write_all(out / "answers.jsonl", records)
    meta["lossless_rechecked"] = {"when": _dt.datetime.now().isoformat(timespec="seconds"),
                                  "git_commit": git("rev-parse", "HEAD") or "unknown",
                                  "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
                                  "outputs": len(todo)}
    write_meta(out, meta)
    summary = report(out, meta.get("methods", []), meta)
    bad = sum(1 for d in summary["divergences"] if not d.get("near_tie"))
    print(f"pacer bench: rechecked {len(todo)} differing output(s) in {out} ({changed} diagnosis changed); "
          f"{bad} NOT a near-tie")
    return 0



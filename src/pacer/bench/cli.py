"""The ``pacer bench`` subcommand: arguments, validation, resume, the run and the report (see :mod:`pacer.bench`)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .. import backends
from ..args import add_model_args
from ..errors import PacerError

DEFAULT_METHODS = ("ar,sd:gamma=4,heuristic,confidence,entropy,oracle,hf-assisted,"
                   "hf-assisted:schedule=heuristic")
#: settings that must match when a run is resumed (the rest - methods, questions, repeats - may grow)
PINNED = ("target", "draft", "target_fingerprint", "draft_fingerprint", "dtype", "threads", "max_new_tokens",
          "quick", "draft_vocab", "target_weights", "draft_weights", "backend", "temperature", "seed")


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
    p.add_argument("--n", type=int, default=None, help="questions per dataset (default 10; --quick: all 4)")
    p.add_argument("--select", default="stratified", choices=["stratified", "first", "random"],
                   help="question selection (stratified: round-robin over categories in file order)")
    p.add_argument("--select-seed", type=int, default=0, help="seed of --select random")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default 128; --quick: 24)")
    p.add_argument("--repeats", type=int, default=1, help="passes over all questions (spread of the speedup)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, every output checked against ar's token by token; > 0: sampling, "
                        "each turn a seeded draw (the same seed for every method), not compared token by token")
    p.add_argument("--seed", type=int, default=0, help="base seed of --temperature > 0 (per question/repeat/turn)")
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


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _lock(out: Path):
    """An exclusive lock on ``out/.lock`` for the run: two runs appending to one folder would corrupt it."""
    import fcntl

    f = open(out / ".lock", "a+")  # noqa: SIM115 - held open for the whole run, closed by the caller
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise PacerError(f"another pacer bench is running in {out}; wait for it or use another --out") \
            from None
    return f


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def command_line(args: argparse.Namespace, methods: str) -> str:
    """The run's command with every setting explicit (reproduces it)."""
    parts = ["pacer", "bench", "--methods", methods]
    if args.questions:
        parts += ["--questions", str(args.questions)]
    if args.dataset:
        parts += ["--dataset", args.dataset]
    if args.quick:
        parts += ["--quick"]
    if args.n is not None:
        parts += ["--n", str(args.n)]
    parts += ["--select", args.select]
    if args.select == "random":
        parts += ["--select-seed", str(args.select_seed)]
    parts += ["--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats)]
    if args.temperature > 0:
        parts += ["--temperature", str(args.temperature), "--seed", str(args.seed)]
    if not args.quick:
        parts += ["--target", args.target, "--draft", args.draft, "--backend", args.backend]
        if backends.get(args.backend).dtypes:
            parts += ["--dtype", args.dtype]
        if backends.get(args.backend).int8:
            parts += ["--draft-quant", args.draft_quant, "--quantize", args.quantize]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    parts += ["--draft-vocab", str(args.draft_vocab)]
    for flag, value in (("--costs", args.costs), ("--own-profile", args.own_profile),
                        ("--validation", args.validation)):
        if value is not None:  # what the run decided, priced and chose thresholds with: part of reproducing it
            parts += [flag, str(value)]
    if not args.anchor:
        parts += ["--no-anchor"]
    parts += ["--out", str(args.out)]
    return shlex.join(parts)


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
    if args.threads is not None and args.threads <= 0:
        raise PacerError(f"--threads must be >= 1, got {args.threads}")


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


def _read_meta(out: Path) -> dict:
    """``run.json`` of a run in ``out`` (``{}``: none), refused when it was changed by hand (its ``sha256`` is of
    the rest of it; files written before the checksum existed are taken as they are)."""
    from ..io import read_json

    if not (out / "run.json").exists() and not (out / "run.json").is_symlink():
        return {}
    meta = read_json(out / "run.json", "the run's record", "restore it or start a new --out")
    if not isinstance(meta, dict):
        raise PacerError(f"{out / 'run.json'} is not a pacer bench run.json; start a new --out")
    want = meta.pop("sha256", None)
    if want is not None and want != _meta_sha256(meta):
        raise PacerError(f"{out / 'run.json'} was changed by hand (its checksum does not match); start a new --out")
    return meta


def _meta_sha256(meta: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def _write_meta(out: Path, meta: dict) -> None:
    """Write ``run.json`` atomically with the checksum of its content (see :func:`_read_meta`)."""
    from ..io import atomic_write_text

    meta = {k: v for k, v in meta.items() if k != "sha256"}
    atomic_write_text(out / "run.json", json.dumps({**meta, "sha256": _meta_sha256(meta)}, indent=2) + "\n")


def _greedy(meta: dict) -> bool | None:
    """Whether the run in ``meta`` (run.json) decoded greedily (``None``: no run.json to say)."""
    return not meta.get("temperature") if meta else None


def _answers(out: Path, meta: dict) -> list[dict]:
    """The records of the run in ``out`` whose run.json is ``meta``, read by the checked reader
    (:func:`pacer.bench.records.read_answers`: its verdicts by how it decoded, each record's checksum)."""
    from . import records as rec_io

    if not meta:  # without it, neither how the run decoded nor whether its records are signed is known
        raise PacerError(f"{out / 'run.json'} is missing: the records' lossless verdicts cannot be checked without "
                         f"it (how the run decoded, that every record is signed); restore it or run the benchmark "
                         f"again")
    return rec_io.read_answers(out / "answers.jsonl", _greedy(meta), bool(meta.get("answers_signed")))[0]


def _report(out: Path, specs_labels: list[str], meta: dict) -> dict:
    from .report import write_report

    records = _answers(out, meta)
    labels = list(dict.fromkeys([*specs_labels, *(r["method"] for r in records)]))
    meta = {**meta, "updated": _dt.datetime.now().isoformat(timespec="seconds")}
    return write_report(out, records, labels, meta)


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
    if out.resolve() == run.resolve():
        raise PacerError("--reprice writes a new run folder: pass another --out than the run it reprices")
    check_out_dir(out)
    if out.exists() and any(out.iterdir()):
        raise PacerError(f"--out {out} is not empty; --reprice writes a new run folder")
    meta = _read_meta(run)
    if not meta or not (run / "answers.jsonl").exists():
        raise PacerError(f"--reprice: {run} holds no pacer bench run (run.json and answers.jsonl)")
    prof = Profile.load(costs)
    # run.json does not record the draft's vocabulary rows: they are not compared (the dtype and model are)
    draft = {"fingerprint": meta["draft_fingerprint"], "dtype": meta.get("draft_weights"),
             "rows": (prof.draft or {}).get("rows")} if meta.get("draft_fingerprint") else None
    notes = prof.check_pair(meta.get("backend", ""), {"fingerprint": meta.get("target_fingerprint"),
                                                      "dtype": meta.get("target_weights")}, draft)
    was = meta.get("profile_clock") or {}
    records = _answers(run, meta)
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
                             "git_commit": _git("rev-parse", "HEAD") or "unknown"}
    tmp = out.parent / f".{out.name}.reprice-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        rec_io.write_all(tmp / "answers.jsonl", records)
        _write_meta(tmp, meta)
        summary = _report(tmp, meta.get("methods", []), meta)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"pacer bench: {priced} of {len(records)} record(s) of {run} re-priced with {costs}; report in {out} "
          f"({len(summary['divergences'])} lossless violations)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .methods import parse_methods

    out: Path = args.out
    if args.export_specbench is not None:
        from ..io import check_out_dir
        from .specbench import export

        check_out_dir(args.export_specbench, "--export-specbench")  # before anything is read or written
        if args.export_specbench.resolve() == out.resolve():
            raise PacerError("--export-specbench writes Spec-Bench's files beside the run's own: pass another folder "
                             "than --out")
        if not (out / "answers.jsonl").exists():
            raise PacerError(f"--export-specbench: {out / 'answers.jsonl'} does not exist")
        files = export(_answers(out, _read_meta(out)), args.export_specbench)
        print(f"pacer bench: {len(files)} Spec-Bench answer file(s) in {args.export_specbench}")
        return 0
    if args.report_only:
        meta = _read_meta(out)
        if not (out / "answers.jsonl").exists():
            raise PacerError(f"--report-only: {out / 'answers.jsonl'} does not exist")
        summary = _report(out, meta.get("methods", []), meta)
        print(f"pacer bench: report rebuilt in {out} ({len(summary['divergences'])} lossless violations)")
        return 0
    if args.recheck_lossless:
        return recheck_lossless(out)
    if args.reprice is not None:
        return reprice(args.reprice, args.costs, out)
    _validate(args)
    if not args.quick:
        from ..args import check_model_args

        check_model_args(args)
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
    greedy_only = [s.label for s in specs if s.greedy_only]
    if args.temperature > 0 and greedy_only:
        raise PacerError(f"--temperature {args.temperature}: {', '.join(greedy_only)} decode(s) greedily only (the "
                         f"oracle drafts against ar's greedy answer); drop them from --methods or use --temperature 0")
    questions = load_questions(args)
    from ..profiles import Profile

    args.profile = Profile.load(args.costs) if args.costs else None  # refused before any model loads
    args.own = Profile.load(args.own_profile) if args.own_profile else None
    from ..io import check_out_dir

    if out.exists() and not out.is_dir():
        raise PacerError(f"--out {out} exists and is not a folder")
    check_out_dir(out)
    if folders := [n for n in ("answers.jsonl", "run.json", "report.md", "summary.json") if (out / n).is_dir()]:
        raise PacerError(f"--out {out} holds a folder named {folders[0]} where the run writes that file; remove it or "
                         f"choose another --out")
    previous = _read_meta(out)
    if args.resume and previous.get("questions") is not None:
        asked = {q.key for q in questions}  # the set may grow (a larger --n), never lose a question
        if lost := [k for k in previous["questions"] if k not in asked]:
            raise PacerError(f"--resume: {out} answers another question set ({len(previous['questions'])} questions; "
                             f"this command asks {len(asked)}, without {lost[0]}); resume with the run's own "
                             f"questions or a superset of them (its command is in run.json) or use another --out")
    if args.resume and previous.get("repriced_from"):
        raise PacerError(f"--resume: {out} is a re-priced run (pacer bench --reprice), whose rule decided with "
                         f"other costs than its profile's; resume the run it came from, "
                         f"{previous['repriced_from'].get('run')}")
    if args.resume and previous:  # what the methods decide with must not change between segments
        was = (previous.get("profile_clock") or {}).get("file")
        now = str(args.costs) if args.costs else None
        if was != now or (was and previous["profile_clock"].get("profile") != args.profile.describe()):
            raise PacerError(f"--resume: {out} was run with " + (f"--costs {was}" if was else "no --costs")
                             + " (the cost rule decides with it), this run has "
                             + (f"--costs {now}" if now else "none") + "; pass the run's own --costs (its command "
                             "is in run.json) or use another --out")

        def by_label(notes: list[str] | None) -> dict[str, str]:
            return {n.split("`")[1]: n for n in notes or [] if n.count("`") >= 2}

        old_t, new_t = by_label(previous.get("thresholds")), by_label(args.threshold_notes)
        if changed := [k for k in old_t if k in new_t and old_t[k] != new_t[k]]:
            raise PacerError(f"--resume: {out} ran {changed[0]} at another validation threshold (run.json "
                             f"'thresholds'); pass the run's own --validation checkpoint or use another --out")
    if args.resume and previous.get("cpu_identity"):
        from ..machine import cpu_identity, describe_cpu

        if previous["cpu_identity"] != cpu_identity():
            raise PacerError(f"--resume: {out} was started on {previous.get('cpu')}, this machine is {describe_cpu()}: "
                             f"its wall-clock ratios would pair questions timed on two machines; run the benchmark "
                             f"again into another --out")
    has_answers = (out / "answers.jsonl").exists() and (out / "answers.jsonl").stat().st_size > 0
    if (previous or has_answers) and not args.resume:
        raise PacerError(f"--out {out} already holds a benchmark run; pass --resume to continue it, "
                         f"or choose another folder")
    if has_answers and not previous:
        raise PacerError(f"--resume: {out} has answers but no run.json (not a pacer bench run, or damaged): its "
                         f"settings cannot be checked; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)
    try:
        return _run(args, out, specs, questions, previous, methods_text)
    finally:
        lock.close()


def _load_decoder(args: argparse.Namespace):
    """The run's pair (tiny random models under ``--quick``, unless ``--target``/``--draft`` name another pair, e.g. on
    a registered backend of your own) and the names it is recorded under: ``(decoder, target, draft, dtype)``."""
    from ..api import Decoder
    from ..args import load_decoder

    if args.quick and (args.target, args.draft) == ("default-target", "default-draft"):
        from ..tiny import tiny_pair

        dec = Decoder(*tiny_pair("close"), threads=args.threads, draft_vocab=args.draft_vocab)
        return dec, "tiny-close-target", "tiny-close-draft", "float32"
    dec = load_decoder(args)
    return dec, args.target, args.draft, dec.target_info.dtype_name  # the dtype --dtype auto chose


def recheck_lossless(out: Path) -> int:
    """Re-diagnose the recorded differences of the run in ``out`` (its ``answers.jsonl``) with the current
    :class:`pacer.decoding.Divergence` criterion. The prompts are rebuilt as the run built them (the question,
    the chat template and, for later turns, the method's own earlier answers); the answers file is rewritten
    atomically, then the report."""
    from . import records as rec_io
    from .runner import check_lossless, recorded_turns

    meta = _read_meta(out)
    if not meta.get("command") or not (out / "answers.jsonl").exists():
        raise PacerError(f"--recheck-lossless: {out} holds no finished benchmark run (run.json with its command "
                         f"and answers.jsonl)")
    from ..draftvocab import parse

    run_args = parser().parse_args(shlex.split(meta["command"])[2:])
    run_args.draft_vocab = parse(run_args.draft_vocab)
    _validate(run_args)
    questions = {q.key: q for q in load_questions(run_args)}
    records = rec_io.repair(out / "answers.jsonl", _greedy(meta), bool(meta.get("answers_signed")))
    ar = {(r["dataset"], r["question_id"], r.get("repeat", 0)): r for r in records if r["method"] == "ar"}
    todo = [r for r in records if r.get("lossless") is False]
    if not todo:
        print(f"pacer bench: no output in {out} differs from ar; nothing to recheck")
        return 0
    dec, *_ = _load_decoder(run_args)
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
                                  "git_commit": _git("rev-parse", "HEAD") or "unknown",
                                  "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
                                  "outputs": len(todo)}
    _write_meta(out, meta)
    summary = _report(out, meta.get("methods", []), meta)
    bad = sum(1 for d in summary["divergences"] if not d.get("near_tie"))
    print(f"pacer bench: rechecked {len(todo)} differing output(s) in {out} ({changed} diagnosis changed); "
          f"{bad} NOT a near-tie")
    return 0


def _run(args: argparse.Namespace, out: Path, specs: list, questions: list, previous: dict,
         methods_text: str) -> int:
    import torch
    import transformers

    from ..machine import cpu_identity, describe_cpu
    from .runner import Bench, warm_up

    # the code this process runs is what was on disk when it started: read the commit before the (long) loading
    # and warm-up, during which the tree may move on
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    keeps_dtype = args.dtype == "auto" and backends.get(args.backend).dtypes
    if args.resume and previous and keeps_dtype and previous.get("dtype"):
        args.dtype = previous["dtype"]  # a resumed run keeps the dtype --dtype auto chose when it started
    dec, target, draft, dtype = _load_decoder(args)
    profile_notes = dec.use_profile(args.profile) if args.profile is not None else []
    for note in profile_notes:
        print(f"pacer bench: note: {note}", file=sys.stderr)
    decoders = {}
    if args.anchor and not args.quick and dec.pair.record.anchor:
        anchor = _anchor_decoder(args, dec)
        if anchor is not None:
            from .methods import ANCHOR, anchor_spec

            decoders[ANCHOR] = anchor
            specs = [*specs, anchor_spec()]
            methods_text += f",{ANCHOR}"
    if not args.quick and dec.pair.record.dtypes:
        args.dtype = dtype  # the recorded command names the dtype that ran, not "auto" (a rerun elsewhere may differ)
    config = {
        "target": target, "draft": draft, "dtype": dtype, "threads": dec.threads,
        "target_fingerprint": dec.target_info.fingerprint,
        "draft_fingerprint": dec.draft_info.fingerprint if dec.draft_info else None,
        "max_new_tokens": args.max_new_tokens, "quick": bool(args.quick), "draft_vocab": args.draft_vocab,
        "target_weights": dec.target_info.weights,
        "draft_weights": dec.draft_info.weights if dec.draft_info else None,
        "backend": dec.backend,
        "temperature": args.temperature, "seed": args.seed if args.temperature > 0 else 0,
    }
    if args.resume and previous:
        for k in PINNED:
            if k not in previous and k not in ("draft_vocab", "backend"):
                continue
            # runs made before a setting existed: the full vocabulary, the transformers backend
            old = previous.get(k) or 0 if k == "draft_vocab" else previous.get(k, "transformers") \
                if k == "backend" else previous[k]
            if old != config[k]:
                hint = ""
                if k == "draft_weights" and isinstance(old, str):
                    hint = f" (pass --draft-quant {'int8' if old.startswith('int8') else 'none'} to load the draft " \
                           f"as the run did)"
                raise PacerError(f"--resume: {out} was run with {k}={old!r}, this run has "
                                 f"{config[k]!r}{hint}; use the same settings or another --out")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    load = _load_average()
    if not args.quick and load is not None and load > 0.5 * (os.cpu_count() or 1) + 0.5:
        log(f"pacer bench: warning: load average {load:.1f} on {os.cpu_count()} cores before the run; other "
            f"processes distort wall times (speedups stay paired per question, but absolute tok/s suffer)")
    log(f"pacer bench: {len(questions)} question(s) x {len(specs)} method(s) x {args.repeats} repeat(s), "
        f"{args.max_new_tokens} new tokens per turn, {dtype}, {dec.threads} threads; warming up ...")
    specs = warm_up(dec, specs, questions, args.max_new_tokens, args.skip_failing, log, decoders)
    labels = [s.label for s in specs]
    now = _dt.datetime.now().isoformat(timespec="seconds")
    load_at_start = None if load is None else round(load, 2)
    # one entry per start or resume: a run continued later says which commits and machines made it
    segment = {"started": now, "git_commit": commit or "unknown", "git_dirty": bool(dirty),
               "load_average_at_start": load_at_start, "cpu": describe_cpu()}
    if previous and not previous.get("segments"):  # a run.json from before segments were recorded
        previous["segments"] = [{k: previous.get(k) for k in ("started", "git_commit", "git_dirty",
                                                             "load_average_at_start", "cpu")}]
    meta = {
        **config,
        "command": command_line(args, methods_text),
        "argv": sys.argv,
        "git_commit": commit or "unknown",
        "git_dirty": bool(dirty),
        "methods": labels,
        "datasets": ", ".join(dict.fromkeys(q.dataset for q in questions)),
        "questions": [q.key for q in questions],
        "selection": f"{args.select}, n={args.n or 'all'} per dataset"
                     + (f", seed {args.select_seed}" if args.select == "random" else ""),
        "repeats": args.repeats,
        "started": previous.get("started") or now,
        "segments": [*previous.get("segments", []), segment],
        "load_average_at_start": load_at_start,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": describe_cpu(),
        "cpu_identity": cpu_identity(),
        # every record of a run started by this pacer carries its checksum (records.sign): one without is refused
        "answers_signed": not previous or bool(previous.get("answers_signed")),
    }
    if getattr(args, "threshold_notes", None):
        meta["thresholds"] = args.threshold_notes
    if dec.draft_info is not None:
        meta["calibration"] = dec.calibration(dec.draft_rows(dec.draft_vocab)).to_dict()
    clocks = {}
    if dec.draft_info is not None:
        from ..calibration import load_or_measure
        from ..profiles import Profile

        own = args.own or Profile.from_calibration(load_or_measure(dec.pair, dec.draft_rows(dec.draft_vocab)),
                                                   "this machine's calibration")
        clocks["own"] = own
        meta["own_clock"] = own.describe()
        meta["c_t1"] = own.c1()
        if args.profile is not None:
            clocks["profile"] = args.profile
            meta["profile_clock"] = {"profile": args.profile.describe(), "file": str(args.costs),
                                     "machine": args.profile.machine.get("describe"), "notes": profile_notes,
                                     "c_t1": args.profile.c1(), "sha256": args.profile.digest()}
    if not args.quick:
        note = clocks["own"].costs().slow_one_row_note() if "own" in clocks else ""
        if note:
            meta["kernel_note"] = note
    _write_meta(out, meta)
    from ..sampling import SamplingConfig

    sampling = SamplingConfig(args.temperature, seed=args.seed) if args.temperature > 0 else None
    bench = Bench(dec, specs, questions, out, args.max_new_tokens, args.repeats, args.progress, sampling, clocks,
                  decoders, signed=meta["answers_signed"])
    total, finished = bench.units()
    if finished:
        log(f"pacer bench: resuming, {finished}/{total} runs already in {out / 'answers.jsonl'}")
    try:
        bench.run()
    except BaseException:
        try:  # leave a report of what finished, then let the interruption / error through
            if bench.records:
                meta["skipped"] = bench.skipped
                _write_meta(out, meta)  # --report-only reads the skips from run.json
                _report(out, labels, meta)
                log(f"pacer bench: partial report written to {out / 'report.md'}; continue with --resume")
        except Exception as e:  # noqa: BLE001
            log(f"pacer bench: could not write the partial report: {e}")
        raise
    meta["skipped"] = bench.skipped
    _write_meta(out, meta)  # --report-only reads the skips from run.json
    summary = _report(out, labels, meta)
    _print_summary(summary, out)
    return 0


def _anchor_decoder(args: argparse.Namespace, dec):
    """The plain decoding of the same target on the backend the run's backend names as its anchor (llama.cpp's of
    a GGUF target beside a transformers run: the user's real anchor), or ``None`` where the target is no GGUF
    file or llama-cpp-python is not installed."""
    try:
        other = backends.anchor_for(dec.backend, args.target)
        if other is None:
            return None
        from ..api import Decoder

        return Decoder.from_pretrained(args.target, None, threads=args.threads, backend=other,
                                       progress=getattr(args, "progress", True), draft_vocab=None)
    except (PacerError, ImportError) as e:
        print(f"pacer bench: note: no llama.cpp anchor ({e})", file=sys.stderr)
        return None


def _print_summary(summary: dict, out: Path) -> None:
    overall = summary["groups"].get("overall", {})
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    print(f"{'method':<34} {'speedup':>8} {'median':>8} {'tok/s':>8} {'tau':>6} {'lossless':>9}")
    for m, s in overall.items():
        ll = "base" if m == "ar" else f"{s['lossless_identical']}/{s['lossless_checked']}" \
            if s["lossless_checked"] else "sampled"
        print(f"{m:<34} {f(s['speedup']):>8} {f(s['median_ratio']):>8} {f(s['tokens_per_s']):>8} "
              f"{f(s['tau']):>6} {ll:>9}")
    n = len(summary["divergences"])
    if n:
        print(f"WARNING: {n} output(s) differ from plain decoding - see {out / 'report.md'}")
    print(f"report: {out / 'report.md'}")

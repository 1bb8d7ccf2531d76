"""One ``pacer bench`` run in its ``--out`` folder, as a list of steps (:func:`run`): load the pair (and the
anchor beside it), pin a resumed run's settings, warm up, write ``run.json``, decide the clocks, run the questions
and write the report. Also the folder's ``run.json`` (checksummed: :func:`read_meta`, :func:`write_meta`) and its
report (:func:`report`), which the subcommand's other actions (``--report-only``, ``--reprice``,
``--recheck-lossless``, ``--export-specbench``) read too; the subcommand itself is :mod:`pacer.bench.cli`."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .. import backends
from ..errors import PacerError

#: settings that must match when a run is resumed (the rest - methods, questions, repeats - may grow)
PINNED = ("target", "draft", "target_fingerprint", "draft_fingerprint", "dtype", "threads", "max_new_tokens",
          "quick", "draft_vocab", "target_weights", "draft_weights", "backend", "temperature", "seed", "verify")
#: what a run made before a pinned setting existed ran with (a missing one is taken as this when resumed)
BEFORE = {"draft_vocab": 0, "backend": "transformers", "verify": "token"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


# ------------------------------------------------------------------------------------------- the run folder
def git(*args: str) -> str | None:
    """``git ARGS`` in pacer's source tree (its output; ``None`` where git or the tree is missing)."""
    try:
        r = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def lock(out: Path):
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


def read_meta(out: Path) -> dict:
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


def write_meta(out: Path, meta: dict) -> None:
    """Write ``run.json`` atomically with the checksum of its content (see :func:`read_meta`)."""
    from ..io import atomic_write_text

    meta = {k: v for k, v in meta.items() if k != "sha256"}
    atomic_write_text(out / "run.json", json.dumps({**meta, "sha256": _meta_sha256(meta)}, indent=2) + "\n")


def greedy(meta: dict) -> bool | None:
    """Whether the run in ``meta`` (run.json) decoded greedily (``None``: no run.json to say)."""
    return not meta.get("temperature") if meta else None


def answers(out: Path, meta: dict) -> list[dict]:
    """The records of the run in ``out`` whose run.json is ``meta``, read by the checked reader
    (:func:`pacer.bench.records.read_answers`: its verdicts by how it decoded, each record's checksum)."""
    from . import records as rec_io

    if not meta:  # without it, neither how the run decoded nor whether its records are signed is known
        raise PacerError(f"{out / 'run.json'} is missing: the records' lossless verdicts cannot be checked without "
                         f"it (how the run decoded, that every record is signed); restore it or run the benchmark "
                         f"again")
    return rec_io.read_answers(out / "answers.jsonl", greedy(meta), bool(meta.get("answers_signed")))[0]


def report(out: Path, specs_labels: list[str], meta: dict) -> dict:
    """Write the report of the run in ``out`` (``specs_labels`` first, then any other method recorded)."""
    from .report import write_report

    records = answers(out, meta)
    labels = list(dict.fromkeys([*specs_labels, *(r["method"] for r in records)]))
    meta = {**meta, "updated": _dt.datetime.now().isoformat(timespec="seconds")}
    return write_report(out, records, labels, meta)


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
    if args.verify is not None:
        parts += ["--verify", args.verify]
    if not args.quick:
        parts += ["--target", args.target, "--draft", args.draft, "--backend", args.backend]
        if backends.get(args.backend).dtypes:
            parts += ["--dtype", args.dtype]
        record = backends.get(args.backend)
        if record.int8 or record.auto_draft_quant:  # the draft's format: another draft proposes other tokens
            parts += ["--draft-quant", args.draft_quant]
        if record.int8:
            parts += ["--quantize", args.quantize]
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


# --------------------------------------------------------------------------------------------------- the run
def run(args: argparse.Namespace, out: Path, specs: list, questions: list, previous: dict,
        methods_text: str) -> int:
    """Run ``specs`` on ``questions`` into ``out`` (checked and locked by the caller; ``previous``: the run.json
    of the run it resumes, ``{}``: none) and print the summary."""
    # the code this process runs is what was on disk when it started: read the commit before the (long) loading
    # and warm-up, during which the tree may move on
    source = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    dec, target, draft, dtype = _load(args, previous)
    profile_notes = dec.use_profile(args.profile) if args.profile is not None else []
    for note in profile_notes:
        print(f"pacer bench: note: {note}", file=sys.stderr)
    decoders, specs, methods_text = _with_anchor(args, dec, specs, methods_text)
    decoders.update(_peers(args, dec, specs, decoders))
    if not args.quick and dec.pair.record.dtypes:
        args.dtype = dtype  # the recorded command names the dtype that ran, not "auto" (a rerun elsewhere may differ)
    config = _config(args, dec, target, draft, dtype)
    if args.resume and previous:
        _check_pinned(out, previous, config)
    load = _load_average()
    specs = _warm_up(args, dec, specs, questions, decoders, load, dtype)
    meta = _meta(args, config, methods_text, specs, questions, previous, source, load)
    clocks = _clocks(args, dec, meta, profile_notes)
    write_meta(out, meta)
    summary = _bench(args, dec, specs, questions, out, meta, clocks, decoders)
    _print_summary(summary, out)
    return 0


def load_run_decoder(args: argparse.Namespace):
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


def _load(args: argparse.Namespace, previous: dict):
    keeps_dtype = args.dtype == "auto" and backends.get(args.backend).dtypes
    if args.resume and previous and keeps_dtype and previous.get("dtype"):
        args.dtype = previous["dtype"]  # a resumed run keeps the dtype --dtype auto chose when it started
    return load_run_decoder(args)


def anchor_decoder(args: argparse.Namespace, dec):
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


def _with_anchor(args: argparse.Namespace, dec, specs: list, methods_text: str) -> tuple[dict, list, str]:
    """The decoders beside ``dec`` by method label, the specs and the methods text, with the anchor where it runs."""
    decoders = {}
    if args.anchor and not args.quick and dec.pair.record.anchor:
        anchor = anchor_decoder(args, dec)
        if anchor is not None:
            from .methods import ANCHOR, anchor_spec

            decoders[ANCHOR] = anchor
            specs = [*specs, anchor_spec()]  # run unless --no-anchor: the recorded command needs no method for it
    return decoders, specs, methods_text


def _peers(args: argparse.Namespace, dec, specs: list, decoders: dict) -> dict:
    """The model of llama-cpp-python's prompt lookup (:mod:`pacer.bench.peer`) for every ``lookup@llamacpp`` spec:
    the run's GGUF target (the run's own on the llama.cpp backend, the anchor's beside a transformers run), on the
    run's threads and context; a run that asks for it without a GGUF target is a one-line error."""
    from .peer import PEER, LlamaLookupPeer, gguf_path

    labels = [s.label for s in specs if s.name == PEER]
    if not labels:
        return {}
    owner = next((d for d in (dec, *decoders.values()) if gguf_path(d) is not None), None)
    if owner is None:
        raise PacerError(f"{PEER} runs llama-cpp-python on the target's GGUF file, and this run's target "
                         f"{args.target} was not loaded from one; pass a .gguf --target or drop {PEER}")
    peer = LlamaLookupPeer(dec, gguf_path(owner), dec.threads, owner.target.context)
    return dict.fromkeys(labels, peer)


def _config(args: argparse.Namespace, dec, target: str, draft: str, dtype: str) -> dict:
    """What the run's outputs and timings depend on (:data:`PINNED` across a resumed run's segments)."""
    return {
        "target": target, "draft": draft, "dtype": dtype, "threads": dec.threads,
        "target_fingerprint": dec.target_info.fingerprint,
        "draft_fingerprint": dec.draft_info.fingerprint if dec.draft_info else None,
        "max_new_tokens": args.max_new_tokens, "quick": bool(args.quick), "draft_vocab": args.draft_vocab,
        "target_weights": dec.target_info.weights,
        "draft_weights": dec.draft_info.weights if dec.draft_info else None,
        "backend": dec.backend,
        "temperature": args.temperature, "seed": args.seed if args.temperature > 0 else 0,
        "verify": args.verify or "token",
    }


def _check_pinned(out: Path, previous: dict, config: dict) -> None:
    """Refuse to resume with another value of a :data:`PINNED` setting than the run in ``out`` has."""
    for k in PINNED:
        if k not in previous and k not in BEFORE:
            continue
        old = previous.get(k) or 0 if k == "draft_vocab" else previous.get(k, BEFORE.get(k))
        if old != config[k]:
            hint = ""
            if k == "draft_weights" and isinstance(old, str):
                hint = f" (pass --draft-quant {'int8' if old.startswith('int8') else 'none'} to load the draft " \
                       f"as the run did)"
            raise PacerError(f"--resume: {out} was run with {k}={old!r}, this run has "
                             f"{config[k]!r}{hint}; use the same settings or another --out")


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _warm_up(args: argparse.Namespace, dec, specs: list, questions: list, decoders: dict, load: float | None,
             dtype: str) -> list:
    """The specs that ran the first question once (a failing one dropped under ``--skip-failing``), after a warning
    where other processes load the machine."""
    from .runner import warm_up

    if not args.quick and load is not None and load > 0.5 * (os.cpu_count() or 1) + 0.5:
        log(f"pacer bench: warning: load average {load:.1f} on {os.cpu_count()} cores before the run; other "
            f"processes distort wall times (speedups stay paired per question, but absolute tok/s suffer)")
    log(f"pacer bench: {len(questions)} question(s) x {len(specs)} method(s) x {args.repeats} repeat(s), "
        f"{args.max_new_tokens} new tokens per turn, {dtype}, {dec.threads} threads; warming up ...")
    return warm_up(dec, specs, questions, args.max_new_tokens, args.skip_failing, log, decoders)


def _meta(args: argparse.Namespace, config: dict, methods_text: str, specs: list, questions: list, previous: dict,
          source: tuple[str | None, str | None], load: float | None) -> dict:
    """run.json before the clocks: the config, the command, the code, the machine and one segment more."""
    import torch
    import transformers

    from ..machine import cpu_identity, describe_cpu

    commit, dirty = source
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
        "methods": [s.label for s in specs],
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
    return meta


def _clocks(args: argparse.Namespace, dec, meta: dict, profile_notes: list[str]) -> dict:
    """The profiles the run's forwards are priced with (``own``: this machine's; ``profile``: ``--costs``), and
    what run.json says of them (the calibration, each clock, a kernel note)."""
    if dec.draft_info is not None:
        meta["calibration"] = dec.calibration(dec.draft_rows(dec.draft_vocab)).to_dict()
    clocks = {}
    if dec.draft_info is not None:
        from ..calibration import load_or_measure
        from ..profiles import Profile

        if args.own is not None:  # the validation clock prices this pair's forwards: the same check as --costs
            from ..profiles import pair_of

            for note in args.own.check_pair(*pair_of(dec.pair, dec.draft_rows(dec.draft_vocab))):
                print(f"pacer bench: note: --own-profile: {note}", file=sys.stderr)
            meta["own_profile_sha256"] = args.own.digest()
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
    return clocks


def _bench(args: argparse.Namespace, dec, specs: list, questions: list, out: Path, meta: dict, clocks: dict,
           decoders: dict) -> dict:
    """Run every question (resuming after the records in ``out``) and write the report; where the run is
    interrupted or fails, a report of what finished first."""
    from ..sampling import SamplingConfig
    from .runner import Bench

    labels = [s.label for s in specs]
    sampling = SamplingConfig(args.temperature, seed=args.seed, verify=args.verify or "token") \
        if args.temperature > 0 else None
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
                write_meta(out, meta)  # --report-only reads the skips from run.json
                report(out, labels, meta)
                log(f"pacer bench: partial report written to {out / 'report.md'}; continue with --resume")
        except Exception as e:  # noqa: BLE001
            log(f"pacer bench: could not write the partial report: {e}")
        raise
    meta["skipped"] = bench.skipped
    _oracle_pass(dec, questions, bench.records, out, clocks, sampling is None)
    write_meta(out, meta)  # --report-only reads the skips from run.json
    return report(out, labels, meta)


def _oracle_pass(dec, questions: list, records: list, out: Path, clocks: dict, greedy: bool) -> None:
    """The priced oracle's pass (:func:`pacer.bench.limit.record_oracle`) on the run's costs: ``--costs``'
    profile, else this machine's calibration (greedy runs with a clock only)."""
    profile = clocks.get("profile") or clocks.get("own")
    if not greedy or profile is None:
        return
    from ..costs import ContextCosts
    from .limit import record_oracle

    record_oracle(dec, questions, records, ContextCosts(profile.costs), out, log)


def _print_summary(summary: dict, out: Path) -> None:
    overall = summary["groups"].get("overall", {})
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    oracle = ((summary.get("priced_oracle") or {}).get("groups") or {}).get("overall", {})
    print(f"{'method':<34} {'speedup':>8} {'median':>8} {'tok/s':>8} {'tau':>6} {'lossless':>9}"
          + (f" {'oracle':>7} {'of it':>6}" if oracle else ""))
    for m, s in overall.items():
        ll = "base" if m == "ar" else f"{s['lossless_identical']}/{s['lossless_checked']}" \
            if s["lossless_checked"] else "sampled"
        o = oracle.get(m, {})
        print(f"{m:<34} {f(s['speedup']):>8} {f(s['median_ratio']):>8} {f(s['tokens_per_s']):>8} "
              f"{f(s['tau']):>6} {ll:>9}" + (f" {f(o.get('oracle_speedup')):>7} {f(o.get('of_oracle')):>6}"
                                            if oracle else ""))
    n = len(summary["divergences"])
    if n:
        print(f"WARNING: {n} output(s) differ from plain decoding - see {out / 'report.md'}")
    print(f"report: {out / 'report.md'}")

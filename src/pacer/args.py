"""Command-line arguments shared by the subcommands (``pacer generate``, ``demo``, ``calibrate``, ``bench``,
``collect``, ``train``, ``tune``): the model pair, the decoding settings and every method option, read from the
method registry (:mod:`pacer.methods`) so a registered method's options get their flags here with no other
change. The subcommands live in :mod:`pacer.cli`, :mod:`pacer.bench.cli` and :mod:`pacer.preverify_cli`."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from . import backends, methods
from .bounds import MAX_NEW_TOKENS, MAX_SEED, MAX_THREADS, MAX_TOP_K, MIN_SEED, Count

if TYPE_CHECKING:
    from .api import Decoder
    from .pair import LoadSpec
    from .request import GenerationRequest, MethodRequest


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", default="default-target", help="HF model folder, .gguf file or default-target")
    g.add_argument("--draft", default="default-draft", help="HF model folder, .gguf file or default-draft")
    g.add_argument("--backend", default="auto", choices=["auto", *backends.names()],
                   help="what runs the models (pacer.backends): transformers (PyTorch; GGUF files are dequantized "
                        "once), llamacpp "
                        "(GGUF files as they are, on llama.cpp's kernels through llama-cpp-python) or auto "
                        "(default: llamacpp for a GGUF pair when llama-cpp-python is installed)")
    g.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="weights dtype of the transformers backend; auto (default): bfloat16 on CUDA, on a CPU the "
                        "faster of bfloat16 and float32 as measured here (AVX2-only CPUs have no bf16 kernels)")
    g.add_argument("--threads", type=Count("--threads", 1, MAX_THREADS), default=None,
                   help="intra-op threads (default: all cores)")
    g.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}",
                   help="where the transformers backend runs: auto (default: CUDA when available, else the CPU), "
                        "cpu or cuda (cuda:N); llama.cpp runs on the CPU in this build")
    g.add_argument("--draft-quant", choices=["auto", "none", "int8"], default="auto",
                   help="int8 weight-only draft (lossless: the draft only proposes); auto (default): where it "
                        "measures faster on this machine (llama.cpp: a Q4_0 copy of the draft's GGUF, made once and "
                        "cached, where that measures faster); none: the draft as loaded")
    g.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8 weight-only target: a different, faster target (its own plain decoding is the "
                        "baseline; outputs differ from the bf16 target's); the draft follows --draft-quant")
    g.add_argument("--draft-vocab", default="auto", metavar="S",
                   help="draft only from the S most frequent tokens and the prompt's (the draft's LM head shrinks; "
                        "lossless: the target still scores every token); 0 = the full vocabulary; auto (default): "
                        "32768 for a draft vocabulary of 131072 tokens or more, else the full one")


def load_spec(args: argparse.Namespace, draft: str | None = "") -> LoadSpec:
    """The :class:`~pacer.pair.LoadSpec` the model arguments name (``draft=None``: no draft)."""
    from .pair import LoadSpec

    return LoadSpec(args.target, args.draft if draft == "" else draft, args.backend, args.dtype, args.threads,
                    getattr(args, "device", "auto"), args.draft_quant, args.quantize, args.draft_vocab,
                    progress=getattr(args, "progress", True))


def load_decoder(args: argparse.Namespace, request: MethodRequest | None = None) -> Decoder:
    """The pair the model arguments name, checked (by :func:`check_model_args`, once: a command that called it
    already gets the spec it resolved, unless an argument changed since) and loaded; with a ``request``, its draft
    only where the method drafts with the draft model."""
    from .api import Decoder

    spec = getattr(args, RESOLVED, None)
    if spec is None or spec != load_spec(args):
        spec = check_model_args(args)
    return Decoder.load(spec if request is None or request.loads_draft else spec.without_draft())


def auto_method(args: argparse.Namespace, options: dict | None = None) -> str:
    """The method to run: ``--method`` as given, the default (:data:`pacer.methods.DEFAULT_METHOD`; ``auto`` names
    it too) with PACER's layer where a pre-verifier is there for the pair (the shipped one of the backend on the
    default draft, or one given with ``--preverifier``), else its layer-free sibling
    (:func:`pacer.methods.resolve_default`); ``options``: method options given besides the flags (the server's
    ``--speculative-config``). The backend must be resolved (:func:`check_model_args`)."""
    method = methods.DEFAULT_METHOD if args.method == "auto" else args.method
    if method != methods.DEFAULT_METHOD:
        return method
    from .policies.learned import default_checkpoint

    shipped = (default_checkpoint("pacer", args.backend) / "config.json").exists()
    given = {**method_options(args), **(options or {})}.get("path")
    return methods.resolve_default(method, bool((args.draft == "default-draft" and shipped) or given))


#: where :func:`check_model_args` keeps the resolved :class:`~pacer.pair.LoadSpec` on the arguments
RESOLVED = "resolved_load"


def check_model_args(args: argparse.Namespace) -> LoadSpec:
    """The model arguments checked before anything loads (:meth:`pacer.pair.LoadSpec.resolve`, in the command
    line's words); ``args.backend``, ``args.threads`` and ``args.device`` become what was resolved (``auto``: a
    backend, a device). Returns the resolved spec, also kept on ``args`` for :func:`load_decoder`."""
    from .errors import PacerError

    try:
        spec = load_spec(args).resolve()
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None
    args.backend, args.threads, args.device = spec.backend, spec.threads, spec.device
    setattr(args, RESOLVED, spec)
    return spec


def _dest(o: methods.Option) -> str:
    return "opt_" + o.name


def add_method_args(p: argparse.ArgumentParser, default: str = methods.DEFAULT_METHOD) -> None:
    """``--method``, the draft bounds every drafting method takes and one flag per registered method option."""
    g = p.add_argument_group("method")
    g.add_argument("--method", default=default, help=f"one of: {', '.join(methods.names())}")
    for o in methods.COMMON:
        if o.type is bool:
            continue  # --cost-aware below takes auto/on/off
        g.add_argument(o.cli_flag, type=Count.of(o), default=None, help=o.help)
    g.add_argument("--cost-aware", choices=["auto", "on", "off"], default="auto",
                   help="draft a token only where it pays on this machine's measured costs (auto: unless --gamma "
                        "or --threshold is given)")
    m = p.add_argument_group("method options (each method takes its own: see --method)")
    for o in methods.all_options():
        m.add_argument(o.cli_flag, dest=_dest(o), default=None, metavar=o.type.__name__.upper(), help=o.help)


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    add_method_args(p)
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=Count("--max-new-tokens", 1, MAX_NEW_TOKENS), default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=Count("--top-k", 0, MAX_TOP_K), default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=Count("--seed", MIN_SEED, MAX_SEED), default=0)
    add_verify_arg(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")


def add_verify_arg(g, help_default: str = "token") -> None:
    """``--verify``: the sampling verification rule (:data:`pacer.sampling.VERIFY_RULES`)."""
    from .sampling import VERIFY_RULES

    g.add_argument("--verify", choices=VERIFY_RULES, default=None,
                   help="how sampling (--temperature > 0) verifies a round's draft: token (token-level rejection "
                        "sampling) or block (block verification, Sun et al. 2025: the draft verified jointly, at "
                        "least as many tokens a round in expectation, the same output distribution); greedy "
                        f"decoding matches exactly, so block at temperature 0 is refused (default: {help_default})")


def method_options(args: argparse.Namespace) -> dict:
    """The method options given on the command line, parsed by their registered types (checked against the
    method by :class:`pacer.request.MethodRequest`)."""
    return {o.name: o.parse(v) for o in methods.all_options() if (v := getattr(args, _dest(o), None)) is not None}


def method_request(args: argparse.Namespace) -> MethodRequest:
    """The :class:`~pacer.request.MethodRequest` of the method arguments (a bad one: a one-line error in the
    command line's words)."""
    from .errors import PacerError
    from .request import MethodRequest

    try:
        return MethodRequest(args.method, args.gamma, args.min_draft, args.max_draft, cost_aware(args),
                             method_options(args))
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None


def cost_aware(args: argparse.Namespace) -> bool | None:
    return {"auto": None, "on": True, "off": False}[args.cost_aware]


#: settings named in the core's messages -> the flags that set them (the command line speaks in flags)
SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "gamma", "min_draft", "max_draft", "threads",
            "draft_vocab", "device", "verify")


def as_flags(message: str) -> str:
    """``message`` with each setting that a rule is stated for (``name must``, ``name (value)``, ``option name``)
    as its flag; every other word stays."""
    flags = {n: "--" + n.replace("_", "-") for n in SETTINGS} | {o.name: o.cli_flag for o in methods.all_options()}
    pattern = r"(?<![\w-])(?:(?<=option )(\w+)|(\w+)(?= must\b| \(| takes\b))"
    return re.sub(pattern, lambda m: flags.get(m.group(1) or m.group(2), m.group(0)), message)


def check_args(args: argparse.Namespace) -> GenerationRequest:
    """Every decoding argument checked before any model loads (one line, exit 2 on a bad one), once, by the
    checks the API makes (:class:`pacer.request.MethodRequest`, :class:`pacer.request.GenerationRequest`), in the
    command line's words; returns the generation request (:meth:`pacer.Decoder.generate` takes it as it is)."""
    from .errors import PacerError
    from .pair import check_threads
    from .request import GenerationRequest
    from .sampling import SamplingConfig

    try:
        check_threads(args.threads)  # a load setting, checked here before the prompt is read
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None
    if any(s == "" for s in args.stop):
        raise PacerError("--stop takes a non-empty string (an empty one would stop after the first token)")
    request = method_request(args)
    try:
        job = GenerationRequest(request, args.max_new_tokens, SamplingConfig(args.temperature, args.top_k,
                                                                             args.top_p, args.seed,
                                                                             args.verify or "token"))
        request.check_files()
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None
    return job

"""Command-line arguments shared by the subcommands (``pacer generate``, ``demo``, ``calibrate``, ``bench``,
``collect``, ``train``, ``tune``): the model pair, the decoding settings and every method option, read from the
method registry (:mod:`pacer.methods`) so a registered method's options get their flags here with no other
change. The subcommands live in :mod:`pacer.cli`, :mod:`pacer.bench.cli` and :mod:`pacer.preverify.cli`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

from . import methods

if TYPE_CHECKING:
    from .api import Decoder


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", default="default-target", help="HF model folder, .gguf file or default-target")
    g.add_argument("--draft", default="default-draft", help="HF model folder, .gguf file or default-draft")
    g.add_argument("--backend", default="auto", choices=["auto", "transformers", "llamacpp"],
                   help="what runs the models: transformers (PyTorch; GGUF files are dequantized once), llamacpp "
                        "(GGUF files as they are, on llama.cpp's kernels through llama-cpp-python) or auto "
                        "(default: llamacpp for a GGUF pair when llama-cpp-python is installed)")
    g.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="weights dtype of the transformers backend; auto (default): bfloat16 on CUDA, on a CPU the "
                        "faster of bfloat16 and float32 as measured here (AVX2-only CPUs have no bf16 kernels)")
    g.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    g.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}",
                   help="where the transformers backend runs: auto (default: CUDA when available, else the CPU), "
                        "cpu or cuda (cuda:N); llama.cpp runs on the CPU in this build")
    g.add_argument("--draft-quant", choices=["auto", "none", "int8"], default="auto",
                   help="int8 weight-only draft (lossless: the draft only proposes); auto (default): where it "
                        "measures faster on this machine")
    g.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8 weight-only target: a different, faster target (its own plain decoding is the "
                        "baseline; outputs differ from the bf16 target's); the draft follows --draft-quant")
    g.add_argument("--draft-vocab", default="auto", metavar="S",
                   help="draft only from the S most frequent tokens and the prompt's (the draft's LM head shrinks; "
                        "lossless: the target still scores every token); 0 = the full vocabulary; auto (default): "
                        "32768 for a draft vocabulary of 131072 tokens or more, else the full one")


def load_decoder(args: argparse.Namespace, draft: str | None = "") -> Decoder:
    """The pair the model arguments name (``draft=None``: no draft); more threads than cores are capped."""
    from .api import Decoder

    cores = os.cpu_count() or 1
    if args.threads is not None and args.threads > cores:
        print(f"pacer: warning: --threads {args.threads} is more than this machine's {cores} cores (oversubscribed "
              f"threads run many times slower); using {cores}", file=sys.stderr)
        args.threads = cores
    check_model_args(args)
    return Decoder.from_pretrained(args.target, args.draft if draft == "" else draft, args.dtype, args.threads,
                                   draft_vocab=args.draft_vocab, draft_quant=args.draft_quant,
                                   quantize=args.quantize, backend=args.backend,
                                   device=getattr(args, "device", "auto"))


def resolve_args_backend(args: argparse.Namespace) -> str:
    """``--backend auto`` resolved for these model arguments (:func:`pacer.models.resolve_backend`), in place."""
    from .devices import backend_for
    from .models import resolve_backend

    backend = backend_for(args.backend, getattr(args, "device", "auto"))  # CUDA: transformers
    args.backend = resolve_backend(backend, args.target, args.draft, quantize=args.quantize,
                                   draft_vocab=args.draft_vocab)
    return args.backend


def check_model_args(args: argparse.Namespace) -> None:
    """The model arguments checked before anything loads: the backend can run the models and takes the other
    settings (llama.cpp brings its own quantization and scores the whole vocabulary)."""
    from .api import check_quantize
    from .devices import check_device
    from .errors import PacerError
    from .models import check_backend

    resolve_args_backend(args)
    check_device(getattr(args, "device", "auto"), args.backend, args.quantize, args.draft_quant)
    check_backend(args.backend, args.target, args.draft)
    check_quantize(args.backend, args.quantize, args.draft_quant)
    if args.backend != "transformers" and str(args.draft_vocab) not in ("auto", "0"):
        raise PacerError(f"--draft-vocab applies to the transformers backend; the {args.backend} backend scores the "
                         f"whole vocabulary (drop --draft-vocab)")


def _dest(o: methods.Option) -> str:
    return "opt_" + o.name


def add_method_args(p: argparse.ArgumentParser, default: str = "sd") -> None:
    """``--method``, the draft bounds every drafting method takes and one flag per registered method option."""
    g = p.add_argument_group("method")
    g.add_argument("--method", default=default, help=f"one of: {', '.join(methods.names())}")
    for o in methods.COMMON:
        if o.type is bool:
            continue  # --cost-aware below takes auto/on/off
        g.add_argument(o.cli_flag, type=int, default=None, help=o.help)
    g.add_argument("--cost-aware", choices=["auto", "on", "off"], default="auto",
                   help="draft a token only where it pays on this machine's measured costs (auto: unless --gamma "
                        "or --threshold is given)")
    m = p.add_argument_group("method options (each method takes its own: see --method)")
    for o in methods.all_options():
        m.add_argument(o.cli_flag, dest=_dest(o), default=None, metavar=o.type.__name__.upper(), help=o.help)


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    add_method_args(p)
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")


def method_options(args: argparse.Namespace) -> dict:
    """The method options given on the command line, parsed by their registered types (checked against the
    method by :func:`pacer.api.check_request`)."""
    return {o.name: o.parse(v) for o in methods.all_options() if (v := getattr(args, _dest(o), None)) is not None}


def cost_aware(args: argparse.Namespace) -> bool | None:
    return {"auto": None, "on": True, "off": False}[args.cost_aware]


#: settings named in the core's messages -> the flags that set them (the command line speaks in flags)
SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "gamma", "min_draft", "max_draft", "threads",
            "draft_vocab", "device")


def as_flags(message: str) -> str:
    """``message`` with each setting that a rule is stated for (``name must``, ``name (value)``, ``option name``)
    as its flag; every other word stays."""
    flags = {n: "--" + n.replace("_", "-") for n in SETTINGS} | {o.name: o.cli_flag for o in methods.all_options()}
    pattern = r"(?<![\w-])(?:(?<=option )(\w+)|(\w+)(?= must\b| \(| takes\b))"
    return re.sub(pattern, lambda m: flags.get(m.group(1) or m.group(2), m.group(0)), message)


def check_args(args: argparse.Namespace) -> None:
    """Every decoding argument checked before any model loads (one line, exit 2 on a bad one), by the same
    checks the API makes (:func:`pacer.api.check_request`), in the command line's words."""
    from .api import check_request
    from .errors import PacerError
    from .sampling import SamplingConfig

    if args.threads is not None and args.threads <= 0:
        raise PacerError(f"--threads must be >= 1, got {args.threads}")
    if any(s == "" for s in args.stop):
        raise PacerError("--stop takes a non-empty string (an empty one would stop after the first token)")
    try:
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
        check_request(args.method, args.max_new_tokens, args.gamma, args.min_draft, args.max_draft, sampling,
                      method_options(args))
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None

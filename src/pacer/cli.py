"""Command line: ``pacer generate | demo | bench | collect | train | tune`` (also ``python -m pacer``).

Every bad input ends with a one-line ``pacer: error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from .errors import PacerError


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", default="default-target", help="HF model folder, .gguf file or default-target")
    g.add_argument("--draft", default="default-draft", help="HF model folder, .gguf file or default-draft")
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                   help="weights dtype (bfloat16 is the fast one on CPUs with bf16 support)")
    g.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    g.add_argument("--draft-vocab", default="auto", metavar="S",
                   help="draft only from the S most frequent tokens and the prompt's (the draft's LM head shrinks; "
                        "lossless: the target still scores every token); 0 = the full vocabulary; auto (default): "
                        "32768 for a draft vocabulary of 131072 tokens or more, else the full one")


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    from .api import METHODS

    g = p.add_argument_group("decoding")
    g.add_argument("--method", default="sd", help=f"one of: {', '.join(METHODS)}")
    g.add_argument("--gamma", type=int, default=4, help="draft length for sd (initial length for heuristic)")
    g.add_argument("--min-draft", type=int, default=None, help="lower bound on draft tokens per round")
    g.add_argument("--max-draft", type=int, default=None, help="upper bound on draft tokens per round")
    g.add_argument("--threshold", type=float, default=None,
                   help="threshold of confidence/entropy/pacer/specdecpp")
    g.add_argument("--preverifier", default=None, help="pacer/specdecpp checkpoint folder (default: shipped)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    g.add_argument("--ngram", type=int, default=None, help="ouroboros: phrase length")
    g.add_argument("--pool-size", type=int, default=None, help="ouroboros: phrase pool capacity")
    g.add_argument("--candidates", type=int, default=None,
                   help="ouroboros: candidate phrases verified per round")


def policy_opts(args: argparse.Namespace) -> dict:
    opts = {}
    if args.threshold is not None:
        opts["threshold"] = args.threshold
    if args.preverifier is not None:
        opts["path"] = args.preverifier
    return opts


def drafter_opts(args: argparse.Namespace) -> dict:
    names = {"ngram": "ngram", "pool_size": "pool_size", "candidates": "candidates"}
    return {v: getattr(args, k) for k, v in names.items() if getattr(args, k, None) is not None}


def check_args(args: argparse.Namespace) -> None:
    from .api import METHODS

    if args.method not in METHODS:
        raise PacerError(f"unknown method '{args.method}'; choose one of {', '.join(METHODS)}")
    if args.max_new_tokens <= 0:
        raise PacerError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.gamma <= 0:
        raise PacerError(f"--gamma must be >= 1, got {args.gamma}")
    if args.min_draft is not None and args.max_draft is not None and args.min_draft > args.max_draft:
        raise PacerError(f"--min-draft ({args.min_draft}) must not exceed --max-draft ({args.max_draft})")
    if args.threads is not None and args.threads <= 0:
        raise PacerError(f"--threads must be >= 1, got {args.threads}")
    from .sampling import SamplingConfig

    SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)


class TextStreamer:
    """Prints text as tokens are committed, holding back incomplete UTF-8 sequences and anything that may
    begin a stop string; :meth:`finish` prints the rest, so the printed text equals the result's ``text``."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), stream=None) -> None:
        self.tok = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.printed = 0
        self.stream = stream  # None: sys.stdout at write time (so redirections made later are honoured)

    def _write(self, text: str) -> None:
        out = self.stream or sys.stdout
        out.write(text)
        out.flush()

    def __call__(self, new: list[int]) -> None:
        self.ids += new
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        end = len(text)
        for s in self.stop:
            if s in text:
                end = min(end, text.index(s))
            else:  # hold back a suffix that may grow into this stop string
                end = min(end, next((len(text) - j for j in range(len(s) - 1, 0, -1) if text.endswith(s[:j])),
                                    len(text)))
        while end > self.printed and text[end - 1] == "\ufffd":  # an incomplete UTF-8 sequence so far
            end -= 1
        if end > self.printed:
            self._write(text[self.printed : end])
            self.printed = end

    def finish(self, text: str) -> None:
        """Print what is still held back of the final ``text``."""
        self._write(text[self.printed :])
        self.printed = len(text)


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import Decoder
    from .sampling import SamplingConfig

    check_args(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise PacerError("the prompt is empty; pass some text (or '-' to read standard input)")
    draft = None if args.method == "ar" else args.draft
    dec = Decoder.from_pretrained(args.target, draft, args.dtype, args.threads, draft_vocab=args.draft_vocab)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    streamer = None if args.json else TextStreamer(dec.tokenizer, args.stop)
    res = dec.generate(
        prompt, args.method, args.max_new_tokens, sampling, args.gamma, args.min_draft, args.max_draft,
        stop=args.stop, chat=args.chat, on_tokens=streamer, policy_opts=policy_opts(args),
        drafter_opts=drafter_opts(args),
    )
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        streamer.finish(res.text)
        print()
        print(res.stats.summary(), file=sys.stderr)
    return 0


DEMO_PROMPTS = [
    ("raw", 'def is_palindrome(s: str) -> bool:\n'
            '    """Return True if s reads the same forwards and backwards,'
            ' ignoring case and non-alphanumeric characters."""\n'),
    ("chat", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?"),
    ("chat", "Write a Python function that returns the n-th prime number, with a short docstring."),
]


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: a few prompts with plain and speculative decoding, interleaved, with the speedup.

    Exits 1 when an output differs from plain decoding and the target's top-2 logit gap at the first difference
    is not a near-tie (a real losslessness failure); 0 otherwise."""
    from .api import Decoder

    if args.method == "auto":  # PACER with the shipped pre-verifier on the default pair, plain SD on other pairs
        args.method = "pacer" if args.draft == "default-draft" or args.preverifier else "sd"
    check_args(args)
    ignored = [flag for flag, used in (("--temperature", args.temperature != 0.0), ("--top-k", args.top_k != 0),
                                       ("--top-p", args.top_p != 1.0), ("--seed", args.seed != 0),
                                       ("--stop", bool(args.stop)), ("--chat", args.chat)) if used]
    if ignored:
        raise PacerError(f"pacer demo decodes greedily on its own prompts and takes no {', '.join(ignored)}; "
                         f"use pacer generate for that")
    dec = Decoder.from_pretrained(args.target, args.draft, args.dtype, args.threads, draft_vocab=args.draft_vocab)
    print(f"pacer demo: target {args.target}, draft {args.draft}, {args.dtype}, {dec.threads} threads, "
          f"method {args.method}, {args.max_new_tokens} new tokens per prompt\n")
    dec.generate("Hello", "ar", max_new_tokens=2)  # warm-up
    rows = []
    for kind, prompt in DEMO_PROMPTS:
        ar = dec.generate(prompt, "ar", args.max_new_tokens, chat=kind == "chat")
        sd = dec.generate(prompt, args.method, args.max_new_tokens, gamma=args.gamma, chat=kind == "chat",
                          min_draft=args.min_draft, max_draft=args.max_draft, policy_opts=policy_opts(args),
                          drafter_opts=drafter_opts(args))
        same = ar.token_ids == sd.token_ids
        print("-" * 100)
        print(prompt.strip()[:200])
        print("-" * 40 + " output " + "-" * 52)
        print(sd.text)
        print("-" * 100)
        print(ar.stats.summary())
        print(sd.stats.summary())
        note = "identical to plain decoding" if same else "DIFFERS from plain decoding"
        real_diff = False
        if not same:
            from .decoding import first_divergence

            ids = dec.encode(prompt, kind == "chat")
            dv = first_divergence(dec.target.model, ids, ar.token_ids, sd.token_ids)
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
    print(f"median speedup of {args.method} over plain decoding: {median:.2f}x; "
          f"outputs identical: {sum(r[1] for r in rows)}/{len(rows)}{verdict}")
    return 1 if real else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pacer",
                                 description="Lossless speculative decoding with adaptive draft length")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("prompt", help="the prompt, or - to read standard input")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    add_model_args(g)
    add_decoding_args(g)
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="plain vs speculative decoding on a few prompts, with the measured "
                                    "speedup")
    add_model_args(d)
    add_decoding_args(d)
    d.set_defaults(func=cmd_demo, max_new_tokens=96, method="auto")
    for mod in ("bench", "preverify.cli"):
        try:
            module = __import__(f"pacer.{mod}", fromlist=["register"])
        except ImportError:
            continue
        if hasattr(module, "register"):
            module.register(sub, add_model_args, add_decoding_args)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        if hasattr(args, "draft_vocab"):
            from .draftvocab import parse

            args.draft_vocab = parse(args.draft_vocab)
        return int(args.func(args) or 0)
    except PacerError as e:
        print(f"pacer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npacer: interrupted after {time.perf_counter() - start:.0f}s", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

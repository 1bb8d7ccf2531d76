"""The same pair run in several configurations (backend, dtype), interleaved per prompt, on this machine.

    .venv/bin/python experiments/compare_backends.py --out docs/bench/backends-zen3/report.md [--new-tokens 64]
        (llama.cpp's plain decoding over PyTorch bf16's: the first configuration is the baseline)
    .venv/bin/python experiments/compare_backends.py --configs transformers:bfloat16,transformers:float32 \\
        --methods ar,pacer --draft default-draft --out docs/bench/dtype-zen3/report.md

A configuration is ``BACKEND[:DTYPE]`` (``llamacpp``, ``transformers:bfloat16``, ``transformers:float32``, ...);
every configuration's pair is loaded once. For each prompt (two HumanEval, two GSM8K, two MT-bench first turns by
default) every configuration runs every method (greedy) one after the other, and the tokens per second (first
forward to last token, prefill included, as ``pacer bench``) are compared within the prompt: each cell's ratio is
against the *first* configuration's plain decoding (``ar``) on the same prompt; the report gives the median ratios,
the CPU, the command and the commit, and whether each method's output equals plain decoding's *in its own
configuration* (the losslessness check; different configurations are different arithmetic and need not agree).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_configs(text: str) -> list[tuple[str, str]]:
    from pacer.models import DTYPES

    out = []
    for item in text.split(","):
        backend, _, dtype = item.strip().partition(":")
        if backend not in ("llamacpp", "transformers") or (backend == "llamacpp" and dtype) \
                or dtype not in ("", "auto", *DTYPES):
            raise SystemExit(f"compare_backends: bad configuration '{item}': use llamacpp or "
                             f"transformers[:{'|'.join(('auto', *DTYPES))}]")
        if (backend, dtype or "auto") in out:
            raise SystemExit(f"compare_backends: configuration '{item}' given twice")
        out.append((backend, dtype or "auto"))
    return out


def label(cfg: tuple[str, str], weights: str) -> str:
    return "llamacpp" if cfg[0] == "llamacpp" else f"transformers {weights}" + (" (auto)" if cfg[1] == "auto" else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Markdown report to write")
    p.add_argument("--configs", default="transformers:bfloat16,llamacpp",
                   help="comma-separated BACKEND[:DTYPE]; ratios are against the first one's plain decoding")
    p.add_argument("--methods", default="ar", help="comma-separated method names, with their defaults (ar is "
                                                  "always run)")
    p.add_argument("--draft", default=None, help="draft model (needed by drafting methods); default: none")
    p.add_argument("--n", type=int, default=2, help="questions per dataset (HumanEval, GSM8K, MT-bench)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    configs = parse_configs(args.configs)
    methods = ["ar", *[m for m in args.methods.split(",") if m and m != "ar"]]
    if len(methods) > 1 and args.draft is None:
        raise SystemExit(f"compare_backends: {', '.join(methods[1:])} need(s) a draft: pass --draft default-draft")

    from pacer import Decoder
    from pacer.bench.data import load_dataset, select
    from pacer.machine import describe_cpu

    questions = []
    for name in ("humaneval", "gsm8k", "mtbench"):
        questions += select(load_dataset(name), args.n)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    decs = [Decoder.from_pretrained(draft=args.draft, backend=b, dtype=dt, threads=args.threads, progress=False)
            for b, dt in configs]
    names = [label(c, d.target_info.weights) for c, d in zip(configs, decs, strict=True)]
    drafts = ", ".join(f"{n}: {d.draft_info.weights}" for n, d in zip(names, decs, strict=True) if d.draft_info)
    for dec in decs:  # warm-up, and the calibration of drafting methods before any timed run
        for m in methods:
            dec.generate("Hello", m, max_new_tokens=4)
    cells = [(i, m) for i in range(len(decs)) for m in methods]
    rows = []
    for q in questions:
        prompt, chat = q.turns[0], q.chat
        tps, same = {}, {}
        for i, m in cells:
            r = decs[i].generate(prompt, m, args.new_tokens, chat=chat)
            tps[i, m] = r.stats.tokens_per_s
            same[i, m] = r.token_ids
            print(f"{q.key}: {names[i]} {m} {tps[i, m]:.2f} tok/s", file=sys.stderr)
        rows.append((q.key, tps, {c: same[c] == same[c[0], "ar"] for c in cells}))
    head = [f"{names[i]} {m}" for i, m in cells]
    lines = [
        "# Plain decoding (and methods) of one pair in several configurations, interleaved per prompt",
        "",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- git commit: `{commit}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
        f"- cpu: {describe_cpu()}",
        f"- threads: {decs[0].threads}; {args.new_tokens} new tokens per prompt, greedy, prefill included",
        f"- target: default-target (Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF; transformers: dequantized to the dtype"
        f" shown); draft: {args.draft or 'none'}" + (f" (weights {drafts})" if drafts else ""),
        "",
        "tok/s per prompt (ratio to the first configuration's plain decoding on the same prompt):",
        "",
        "| question | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    for qid, tps, _ in rows:
        base = max(tps[0, "ar"], 1e-9)
        lines.append(f"| {qid} | " + " | ".join(f"{tps[c]:.2f} ({tps[c] / base:.2f}x)" for c in cells) + " |")
    lines += ["", "| configuration | method | median ratio | median tok/s | output = its plain decoding |",
              "|---|---|---|---|---|"]
    for c in cells:
        ratio = statistics.median(t[c] / max(t[0, "ar"], 1e-9) for _, t, _ in rows)
        ok = sum(s[c] for _, _, s in rows)
        lines.append(f"| {names[c[0]]} | {c[1]} | {ratio:.2f}x | {statistics.median(t[c] for _, t, _ in rows):.2f} "
                     f"| {ok}/{len(rows)} |")
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

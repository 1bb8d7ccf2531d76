"""Plain decoding of the same pair on both backends, interleaved per prompt, on this machine.

    .venv/bin/python scripts/compare_backends.py --out docs/bench/backends-zen3/report.md [--new-tokens 64]

For each prompt (two HumanEval, two GSM8K, two MT-bench first turns), plain greedy decoding runs on the llamacpp
backend (the GGUF files as they are) and on the transformers backend (the same GGUF dequantized to bf16), one after
the other, and the tokens per second (first forward to last token, prefill included, as ``pacer bench``) are
compared within each pair of runs; the report gives the median ratio, the CPU, the command and the commit, and how
many outputs agree token for token (they need not: Q4_K_M kernels and bf16 are different arithmetic).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Markdown report to write")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()

    from pacer import Decoder
    from pacer.bench.data import load_dataset, select
    from pacer.calibration import describe_cpu

    questions = []
    for name in ("humaneval", "gsm8k", "mtbench"):
        questions += select(load_dataset(name), 2)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    decs = {b: Decoder.from_pretrained(draft=None, backend=b, threads=args.threads, progress=False)
            for b in ("llamacpp", "transformers")}
    for dec in decs.values():  # warm-up
        dec.generate("Hello", "ar", max_new_tokens=4)
    rows = []
    for q in questions:
        prompt, chat = q.turns[0], q.chat
        res = {b: decs[b].generate(prompt, "ar", args.new_tokens, chat=chat) for b in decs}
        tps = {b: r.stats.tokens_per_s for b, r in res.items()}
        rows.append((q.key, tps["llamacpp"], tps["transformers"], res["llamacpp"].token_ids ==
                     res["transformers"].token_ids))
        print(f"{q.key}: llamacpp {tps['llamacpp']:.2f} tok/s, transformers {tps['transformers']:.2f} tok/s",
              file=sys.stderr)
    ratio = statistics.median(a / b for _, a, b, _ in rows)
    lines = [
        "# Plain decoding: llama.cpp backend vs transformers backend (bf16)",
        "",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- git commit: `{commit}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
        f"- cpu: {describe_cpu()}",
        f"- threads: {decs['llamacpp'].threads}; {args.new_tokens} new tokens per prompt, greedy, prefill included",
        "- target: default-target (Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF; transformers: dequantized to bf16)",
        "",
        "| question | llamacpp tok/s | transformers bf16 tok/s | ratio | same tokens |",
        "|---|---|---|---|---|",
        *(f"| {qid} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {'yes' if same else 'no'} |" for qid, a, b, same in rows),
        "",
        f"**Median ratio: {ratio:.2f}x** (llama.cpp plain decoding over PyTorch bf16 plain decoding, per prompt, "
        f"interleaved).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

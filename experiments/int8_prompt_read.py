"""How fast the int8 draft reads a prompt: aten's int8 kernel against one dense product (``quantize.DENSE_ROWS``).

Loads the default draft (``default-draft``, bf16, its decoder quantized int8 weight-only as ``--draft-quant int8``
does) and times one forward over ``n`` new tokens from an empty cache with the int8 kernel for every row count
and with the dense product for every row count, interleaved, repetitions after a warm-up, medians. Writes a
markdown report (command, commit, CPU) to ``--out``.

    .venv/bin/python experiments/int8_prompt_read.py --out docs/bench/int8-prompt-read-xeon/report.md
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from pacer import backends, quantize
from pacer.backends.transformers import TransformersBackend
from pacer.machine import describe_cpu

ROWS = (1, 4, 8, 12, 16, 32, 64, 170, 300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = backends.load_model("default-draft", "bfloat16", progress=False)
    quantize.quantize_int8(loaded.model)
    backend = TransformersBackend(loaded.model)
    switch = quantize.DENSE_ROWS
    rows = []
    with torch.inference_mode():
        for n in ROWS:
            ids = [(1000 + 7 * i) % 30000 for i in range(n)]
            times: dict[str, list[float]] = {"kernel": [], "dense": []}
            for rep in range(args.reps + 1):  # the first is a warm-up
                for mode, dense_from in (("kernel", 1 << 30), ("dense", 0)):
                    quantize.DENSE_ROWS = dense_from
                    backend.reset()
                    t = time.perf_counter()
                    backend.forward(ids, keep=1)
                    if rep:
                        times[mode].append(time.perf_counter() - t)
            k, d = statistics.median(times["kernel"]), statistics.median(times["dense"])
            rows.append((n, k, d))
            print(f"{n:4d} rows: kernel {k * 1e3:7.1f} ms, dense {d * 1e3:7.1f} ms", file=sys.stderr, flush=True)
    quantize.DENSE_ROWS = switch
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# The int8 draft reading a prompt: int8 kernel or one dense product", "",
             f"- command: `python {' '.join(sys.argv)}`", f"- git commit: `{commit}`", f"- cpu: {describe_cpu()}",
             f"- threads: {args.threads}; torch {torch.__version__}; median of {args.reps} after a warm-up, "
             "interleaved", "- model: default-draft (Qwen2.5-Coder-0.5B-Instruct), bf16, decoder int8 weight-only; "
             "one forward over n new tokens from an empty cache",
             f"- the switch in this build: `DENSE_ROWS` = {switch}",
             "", "| rows | int8 kernel (ms) | dense product (ms) | kernel / dense | used |", "|---|---|---|---|---|"]
    for n, k, d in rows:
        lines.append(f"| {n} | {k * 1e3:.1f} | {d * 1e3:.1f} | {k / d:.2f} | {'dense' if n >= switch else 'kernel'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

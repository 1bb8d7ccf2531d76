"""Why PyTorch's one-token forward of the default target is slower than its two-token one on AMD EPYC CPUs: the
bf16 matrix products of one row take another kernel than those of two.

Times, interleaved and on one thread, a bf16 linear layer of each shape of the target (Qwen2.5-Coder-1.5B: hidden
1536, MLP 8960, key/value heads 256, vocabulary 151,936) over 1 row, over 2 rows, and over 1 row padded to 2 (the
second row dropped), and checks whether the padded product's first row is bitwise the one-row product's. Writes
a JSON file (medians in ms, the machine) beside the printed table.

    .venv/bin/python experiments/one_token_kernel.py --out experiments/results/one-token-kernel-zen4.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

#: (name, in features, out features) of the default target's matrix products
SHAPES = (("q/o proj", 1536, 1536), ("k/v proj", 1536, 256), ("MLP up/gate", 1536, 8960), ("MLP down", 8960, 1536),
          ("lm_head", 1536, 151936))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from pacer.machine import cpu_identity, describe_cpu

    rows = []
    with torch.inference_mode():
        for name, n_in, n_out in SHAPES:
            lin = torch.nn.Linear(n_in, n_out, bias=False).to(torch.bfloat16)
            x1 = torch.randn(1, 1, n_in, dtype=torch.bfloat16)
            x2 = torch.randn(1, 2, n_in, dtype=torch.bfloat16)
            ways = {"1 row": lambda lin=lin, x1=x1: lin(x1), "2 rows": lambda lin=lin, x2=x2: lin(x2),
                    "1 row padded to 2": lambda lin=lin, x1=x1: lin(torch.cat([x1, x1], 1))[:, :1]}
            for f in ways.values():
                f()
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(a.reps):
                for k, f in ways.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            same = torch.equal(lin(x1)[0, 0], lin(torch.cat([x1, x1], 1))[0, 0])
            med = {k: round(statistics.median(v) * 1e3, 4) for k, v in times.items()}
            rows.append({"shape": name, "in": n_in, "out": n_out, "ms": med, "padded_row_bitwise_equal": same})
            print(f"{name:12s} " + "  ".join(f"{k}: {v:.3f} ms" for k, v in med.items()) + f"  bitwise {same}")
    import os

    doc = {"machine": describe_cpu(), "cpu": cpu_identity(), "torch": torch.__version__, "threads": 1,
           "reps": a.reps, "load_average_1min": round(os.getloadavg()[0], 2), "rows": rows}
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

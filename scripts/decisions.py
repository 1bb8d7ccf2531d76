"""The decisions record: what every method decides on a fixed set of generations, so that a change that claims to
change no behaviour can prove it.

For each generation the record keeps the output tokens, each round's draft length and accepted count, and the
ledger of forwards without their seconds (role, new tokens, cached context, tree or chain, rows kept): which source a
round drafted from (the draft model, a phrase verified alone, both), how many branch tokens it scored and where the
draft caught up are all visible there. The costs are fixed (no measured timing enters a decision: given costs and
profiles are never refined), so the record is the same on any machine for the same float arithmetic.

Two sets:

* ``tiny`` - the tiny float32 pairs built in code (:mod:`pacer.tiny`), every method of the registry, greedy and one
  seeded sample, under three cost curves (flat, a PyTorch-like one whose tree forwards cost more, a steep
  llama.cpp-like one). Seconds to run; ``tests/test_decisions.py`` compares it with ``tests/data/decisions-tiny.json``.
* ``real`` - the default pair on both backends (pacer, pacer+ouroboros and lookup), priced with the shipped Zen 4
  profiles (``docs/profiles/``); minutes; ``tests/test_decisions.py``'s realpair case compares it with
  ``tests/data/decisions-real-<backend>.json`` where the pair is installed. Its bf16 (PyTorch) and quantized
  (llama.cpp) products round as the machine's kernels do, so the record keeps the kind of machine it was made on
  (:func:`machine_kind`) and is compared exactly only on that kind; on any other, what holds everywhere is checked
  instead: every method's output is plain decoding's up to a near-tie (:func:`lossless_problems`) and every
  generation's rounds are well formed (:func:`structure_problems`).

    python scripts/decisions.py tiny --write tests/data/decisions-tiny.json
    python scripts/decisions.py real --backend llamacpp --write tests/data/decisions-real-llamacpp.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: prompts: a code prompt whose answer repeats its own text (phrases and lookup engage), a chat question
PROMPTS = [
    (False, "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a"),
    (True, "Say hello to the world, then say hello to the world again."),
]


#: the default pair also gets a grounded prompt: code to edit, whose answer copies most of it (phrase rounds)
REAL_EDIT = (True, "Rename the variable `total` to `acc` in this function and print nothing else:\n\n"
                   "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
                   "    if not values:\n        return 0.0\n    return total / len(values)\n")


def tiny_costs() -> dict:
    """Three cost curves for the tiny pairs (seconds; only ratios matter)."""
    from pacer.costs import Costs

    return {
        "flat": Costs(draft=0.01, target={1: 1.0, 64: 1.0}),
        "pytorch": Costs(draft=0.15, target={1: 1.0, 2: 0.93, 4: 0.96, 8: 1.05, 16: 1.3, 32: 1.9},
                         draft_prefill=0.03, tree={2: 1.0, 8: 1.25, 16: 1.6, 32: 2.4}),
        "llamacpp": Costs(draft=0.35, target={1: 1.0, 2: 1.6, 4: 2.7, 8: 4.9, 16: 7.5, 32: 12.0},
                          draft_prefill=0.08),
    }


#: the pre-verification layer's check, in seconds: fixed here (a decoder measures it once per process), so that
#: no timing enters a recorded decision
CHECK_SECONDS = 2e-4


def fixed_checks() -> None:
    import pacer.policies.learned as learned

    learned.check_cost = lambda *a, **k: CHECK_SECONDS


def generation_record(res) -> dict:
    """What a generation decided: tokens, rounds and its forwards without their seconds."""
    s = res.stats
    return {
        "tokens": list(res.token_ids),
        "draft_lengths": list(s.draft_lengths),
        "accepted": list(s.accepted_counts),
        "forwards": [[c.role[0], c.k, c.context, int(c.tree), c.rows] for c in s.calls],
        "finish": s.finish_reason,
    }


#: the tiny pair's pre-verification checkpoints (pacer, specdecpp), committed beside the record
CHECKPOINTS = ROOT / "tests" / "data" / "decisions-checkpoints"


def make_checkpoints(folder: Path = CHECKPOINTS) -> None:
    """Collect rounds of the tiny ``close`` pair on fixed prompts and train a small layer of each kind (seeded):
    what the learned methods decide with in the tiny record."""
    import tempfile

    import pacer.data.mix as mix
    from pacer import Decoder
    from pacer.preverify.collect import collect
    from pacer.preverify.features import FeatureSpec
    from pacer.preverify.train import train
    from pacer.tiny import tiny_pair

    pools = {c: [mix.TrainingPrompt(f"question {c} {i}: say something about {c}", c, "decisions") for i in range(4)]
             for c in mix.CATEGORIES}
    mix.candidate_pools, mix.benchmark_texts = (lambda: pools), (lambda: [])
    dec = Decoder(*tiny_pair("close"), threads=1, costs=tiny_costs()["flat"])
    with tempfile.TemporaryDirectory() as tmp:
        collect(dec, Path(tmp) / "data", n_prompts=8, max_new_tokens=24, spec=FeatureSpec((-2, -1), 64, 6),
                progress=False)
        for kind in ("pacer", "specdecpp"):
            train(Path(tmp) / "data", folder / kind, kind, block=2, epochs=3, seed=0, d=32, log=None,
                  check_seconds=1e-4, costs=tiny_costs()["pytorch"])


def run_tiny(max_new_tokens: int = 40) -> dict:
    from pacer import Decoder, MethodRequest, methods
    from pacer.sampling import SamplingConfig
    from pacer.tiny import tiny_pair

    if not CHECKPOINTS.exists():
        make_checkpoints()
    fixed_checks()
    out: dict = {}
    for pair_kind in ("close", "random"):
        pair = tiny_pair(pair_kind)
        for cost_name, costs in tiny_costs().items():
            dec = Decoder(*pair, threads=1, costs=costs)
            for name in methods.names():
                opts = {"path": str(CHECKPOINTS / name.split("+")[0])} \
                    if name.split("+")[0] in ("pacer", "specdecpp") else {}
                for temp in (0.0, 0.8):
                    key = f"{pair_kind}/{cost_name}/{name}/T{temp}"
                    rows = []
                    try:
                        for chat, prompt in PROMPTS:
                            sampling = SamplingConfig(temperature=temp, seed=7) if temp else None
                            res = dec.generate(prompt, MethodRequest(name, options=opts), max_new_tokens,
                                               sampling=sampling, chat=chat)
                            rows.append(generation_record(res))
                    except Exception as e:  # a method refused here (greedy-only, a checkpoint's size): recorded
                        rows = {"error": f"{type(e).__name__}: {e}".replace(str(ROOT), "")[:200]}
                    out[key] = rows
    return out


def machine_kind(backend: str) -> dict:
    """The kind of machine whose arithmetic a real-pair record holds: the CPU as pacer's calibrations key it
    (:func:`pacer.machine.cpu_identity`: model, family and model, the ISA flags that pick the matrix kernels -
    AVX2, AVX-512, AVX-512 BF16, AMX -, PyTorch's kernel level and the switches that lower it), the threads (they
    split the products' sums) and the versions of the runtime that computes them."""
    import importlib.metadata

    import torch

    from pacer.machine import cpu_identity

    kind = {"cpu": cpu_identity(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    if backend == "llamacpp":
        kind["llama_cpp"] = importlib.metadata.version("llama-cpp-python")
    return kind


def real_decoder(backend: str):
    """The default pair on ``backend`` with every automatic choice fixed (each times this machine: bf16, the int8
    draft on PyTorch, the draft's own encoding on llama.cpp), priced with the shipped Zen 4 profile."""
    from pacer import Decoder
    from pacer.profiles import Profile

    profile = {"llamacpp": "zen4-avx512bf16-llamacpp-q4km.json",
               "transformers": "zen4-avx512bf16-transformers-bf16.json"}[backend]
    fixed_checks()
    tf = backend == "transformers"
    dec = Decoder.from_pretrained(backend=backend, dtype="bfloat16" if tf else "auto",
                                  draft_quant="int8" if tf else "none", draft_vocab=32768 if tf else None,
                                  progress=False)
    dec.use_profile(Profile.load(ROOT / "docs" / "profiles" / profile))
    return dec


def run_real(backend: str, max_new_tokens: int = 64, dec=None) -> dict:
    """The real-pair record on ``backend`` (``dec``: :func:`real_decoder`'s, made here when not given), with the
    kind of machine it was made on under ``"machine"``."""
    from pacer import MethodRequest

    dec = dec or real_decoder(backend)
    out: dict = {"machine": machine_kind(backend)}
    for name in ("pacer", "pacer+ouroboros", "lookup"):
        out[f"{backend}/{name}"] = [generation_record(dec.generate(p, MethodRequest(name), max_new_tokens, chat=c))
                                    for c, p in PROMPTS + [REAL_EDIT]]
    return out


def structure_problems(rec: dict) -> list[str]:
    """What must hold of every recorded generation on any machine: a draft length and an accepted count per round
    (the first round the prefill's: nothing drafted), no round accepting more than it drafted, each round committing
    its accepted tokens and one of the target's (the last one cut by the budget or an end), one target forward per
    round, and a finish reason."""
    lines = []
    for key, gens in sorted(rec.items()):
        if key == "machine":
            continue
        if not isinstance(gens, list):
            lines.append(f"{key}: {str(gens)[:80]}")
            continue
        for i, g in enumerate(gens):
            d, a, n = g["draft_lengths"], g["accepted"], len(g["tokens"])
            rounds = [(x, y) for x, y in zip(d, a, strict=False)]
            why = ("rounds" if len(d) != len(a) or not d else
                   "prefill" if rounds[0] != (0, 0) else
                   "accepted" if any(not 0 <= y <= x for x, y in rounds) else
                   "tokens" if not sum(y + 1 for _, y in rounds[:-1]) < n <= sum(y + 1 for _, y in rounds) else
                   "forwards" if sum(f[0] == "t" for f in g["forwards"]) != len(d) else
                   "finish" if g["finish"] not in ("length", "eos", "stop", "context") else "")
            if why:
                lines.append(f"{key} prompt {i}: {why} malformed")
    return lines


def lossless_problems(dec, rec: dict, backend: str, max_new_tokens: int = 64) -> list[str]:
    """Where a method's recorded output differs from plain decoding's (run here, on ``dec``) other than at a
    near-tie of the target's logits (:class:`pacer.decoding.Divergence`): after a near-tie the two outputs are
    different texts, and nothing further is compared."""
    from pacer.decoding import first_divergence

    lines = []
    prompts = PROMPTS + [REAL_EDIT]
    ar = [dec.generate(p, "ar", max_new_tokens, chat=c).token_ids for c, p in prompts]
    for key, gens in sorted(rec.items()):
        if not key.startswith(f"{backend}/") or not isinstance(gens, list):
            continue
        for i, ((chat, prompt), g) in enumerate(zip(prompts, gens, strict=False)):
            dv = first_divergence(dec.target, dec.encode(prompt, chat=chat), ar[i], g["tokens"])
            if dv is not None and not dv.near_tie:
                lines.append(f"{key} prompt {i}: differs from plain decoding at {dv.index}: {dv.describe()}")
    return lines


def differences(old: dict, new: dict) -> list[str]:
    """Where two records disagree: one line per generation (its key, the first field that differs and where)."""
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            lines.append(f"{key}: {str(a)[:80]} -> {str(b)[:80]}")
            continue
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            for f in x:
                if x[f] != y.get(f):
                    u_, v_ = x[f], y.get(f)
                    at = next((j for j, (u, v) in enumerate(zip(u_, v_, strict=False)) if u != v),
                              min(len(u_), len(v_))) if isinstance(u_, list) and isinstance(v_, list) else 0
                    lines.append(f"{key} prompt {i}: {f} differs at {at}")
                    break
    return lines


def read_record(path: Path) -> dict:
    """A decisions record written by ``--write``, read by pacer's checked JSON reader and checked for its shape (an
    object of lists of generation records, each an object): a missing, cut or foreign file is a one-line
    :class:`pacer.errors.PacerError`."""
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.errors import PacerError
    from pacer.io import read_json

    fix = "write it again (python scripts/decisions.py SET --write FILE)"
    doc = read_json(path, "decisions record", fix)
    if not isinstance(doc, dict) or not all(isinstance(v, list) and all(isinstance(x, dict) for x in v)
                                            for v in doc.values()):
        raise PacerError(f"decisions record {path} is not a record of this script (an object of lists of "
                         f"generation records); {fix}")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", choices=("tiny", "real"))
    ap.add_argument("--backend", choices=("llamacpp", "transformers"), default="llamacpp")
    ap.add_argument("--write", type=Path, help="write the record here")
    ap.add_argument("--compare", type=Path, help="compare with this record; exit 1 where they differ")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from pacer.errors import PacerError
    from pacer.io import check_out_file

    try:  # the inputs are checked before the (minutes-long) run, as pacer's commands check theirs
        old = read_record(a.compare) if a.compare else None
        if a.write:
            check_out_file(a.write, "--write")
    except PacerError as e:
        print(f"decisions.py: error: {e}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1 if a.set == "tiny" else torch.get_num_threads())
    rec = run_tiny() if a.set == "tiny" else run_real(a.backend)
    if a.write:
        a.write.parent.mkdir(parents=True, exist_ok=True)
        a.write.write_text(json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n")
    if a.compare:
        diff = differences(old, rec)
        print("\n".join(diff) or f"decisions unchanged ({len(rec)} entries)")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

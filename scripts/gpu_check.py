"""The Python side of ``scripts/gpu_check.sh``: forward costs on a device, the decoding loop's own overhead, and the
speedup that draft-length rules reach with those costs through the real decoding loop.

``python scripts/gpu_check.py [--device cuda] [--out DIR]`` builds random-weight ``transformers`` Qwen2 models with
the shapes of Qwen2.5-0.5B, 1.5B and 7B (no download: the machine that runs the check may have no network) in bf16
and measures, on the device:

* **target forward cost** ``c_t(k)``: one forward scoring ``k`` new tokens (``k`` = 1, 2, 4, ..., 32) after a
  ``--context``-token cache (256), keeping ``k`` rows of logits as the loop's verification does;
* **draft token cost** ``c_d``: one new token through the 0.5B shape (the draft of both pairs), with the full LM head
  and with a reduced draft vocabulary of 32,768 rows (:mod:`pacer.draftvocab`);
* **loop overhead**: the time of a speculative round minus its forwards (fixed ``γ`` = 1, 4, 8 greedy and ``γ`` = 4
  sampling, random-weight pairs 1.5B/0.5B and 7B/0.5B), and of a plain decoding step minus its forward, as a
  fraction of ``c_t(1)``; every forward is recorded by the loop's own meter (:mod:`pacer.decoding.meter`, timed
  between two device synchronisations).

Then it **replays acceptance traces through the real decoding loop** (:func:`pacer.decoding.speculative_generate`
and, for plain decoding, :func:`pacer.decoding.autoregressive_generate`) on :class:`TraceBackend` models: a target
and a draft without weights whose greedy tokens are scripted so that the draft agrees with the target exactly where
a trace says. The loop records every forward it makes (new tokens, cached context); each is priced with the measured
costs - a target forward over ``k`` tokens ``c_t(k)``, a draft forward ``c_d`` - and each round adds the measured
overhead ``o(γ)`` (linear in ``γ``; a plain step's ``o_ar``). So the budget and ``min_draft`` handshake, the draft's
catch-up and the policies' updates are the loop's, not a model of them. Policies: fixed ``γ`` = 1..8, the cost-aware
rule (:class:`pacer.policies.cost_aware.CostAwarePolicy` over ``sd`` capped at 16, deciding on the forward costs and
learning the acceptance per draft position as it goes) and the oracle length (:class:`pacer.policies.OraclePolicy`:
drafts exactly the tokens the draft gets right; also under the cost-aware rule). Traces: the per-round accepted
counts of the ``oracle`` method in a committed benchmark run (``scripts/data/acceptance-traces.jsonl``: the
real Qwen2.5-Coder 1.5B/0.5B pair; a run of ``n`` accepted tokens is ``n`` agreements and one disagreement) and
i.i.d. per-token acceptance ``α`` in {0.6, 0.7, 0.8}.

Writes ``gpu_check.json`` (every number) and ``gpu_check_costs.md`` (the Markdown section of the report) to
``--out``. ``--quick`` uses tiny shapes, a short context and few repetitions: the CPU test
(``tests/test_device.py``) runs ``--device cpu --quick`` in seconds.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pacer import devices, timing
from pacer.backends.transformers import TransformersBackend
from pacer.costs import Costs
from pacer.decoding import ModelBackend, Output, Tree, autoregressive_generate, speculative_generate
from pacer.decoding.meter import DRAFT, TARGET, Call, metered
from pacer.decoding.stats import GenerationStats
from pacer.drafters.token import TokenDrafter
from pacer.policies import DraftPolicy, FixedPolicy, OraclePolicy
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.pricing import CostMemory
from pacer.sampling import SamplingConfig

KS = (1, 2, 4, 8, 16, 32)
GAMMAS = tuple(range(1, 9))
ALPHAS = (0.6, 0.7, 0.8)
#: the cost-aware rule's cap in the replay (``sd`` capped at this many tokens)
AWARE_CAP = 16
REDUCED_VOCAB = 32768
TRACES = Path(__file__).resolve().parent / "data" / "acceptance-traces.jsonl"


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's shape."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie: bool = True


SHAPES = {
    "qwen2.5-0.5b": Shape(896, 24, 14, 2, 4864, 151936, tie=True),
    "qwen2.5-1.5b": Shape(1536, 28, 12, 2, 8960, 151936, tie=True),
    "qwen2.5-7b": Shape(3584, 28, 28, 4, 18944, 152064, tie=False),
}
#: (target, draft)
PAIRS = (("qwen2.5-1.5b", "qwen2.5-0.5b"), ("qwen2.5-7b", "qwen2.5-0.5b"))
QUICK_SHAPES = {
    "tiny-s": Shape(64, 2, 4, 2, 128, 2048),
    "tiny-m": Shape(96, 3, 4, 2, 192, 2048),
    "tiny-l": Shape(128, 4, 4, 2, 256, 2048, tie=False),
}
QUICK_PAIRS = (("tiny-m", "tiny-s"), ("tiny-l", "tiny-s"))


# ------------------------------------------------------------------------------------------------------ models
def build_model(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """A random-weight Qwen2 causal LM of ``shape``, made directly on ``device`` in ``dtype``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=32768,
                      tie_word_embeddings=shape.tie)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(cfg, dtype=dtype)
    return model.eval()


def params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def token_ids(n: int, vocab: int, offset: int = 0) -> list[int]:
    """``n`` deterministic token ids spread over the vocabulary."""
    return [(1000 + 7919 * (i + offset)) % max(2, vocab - 1) for i in range(n)]


@torch.inference_mode()
def cost_curve(model: torch.nn.Module, context: int, reps: int, ks: Sequence[int] = KS) -> dict[int, float]:
    """``c_t(k)``: median seconds of a forward scoring ``k`` new tokens (keeping ``k`` rows of logits, as the
    loop's verification does) after ``context`` cached tokens."""
    b = TransformersBackend(model)
    vocab = b.vocab_size
    b.forward(token_ids(context, vocab), keep=1)
    out = {}
    for k in ks:
        out[k] = timing.median(b, token_ids(k, vocab, offset=context), context, reps, keep=k)
    return out


@torch.inference_mode()
def draft_cost(model: torch.nn.Module, context: int, reps: int, rows: torch.Tensor | None = None) -> float:
    """``c_d``: median seconds of one new token through the draft (full head, or the reduced one of ``rows``)."""
    b = TransformersBackend(model, rows)
    ctx = token_ids(context, b.vocab_size)
    b.forward(ctx, keep=1)
    return timing.median(b, token_ids(1, b.vocab_size, offset=context), context, reps)


@torch.inference_mode()
def loop_overhead(target: torch.nn.Module, draft: torch.nn.Module, context: int, rounds: int,
                  gammas: Sequence[int] = (1, 4, 8)) -> dict[str, dict[str, float]]:
    """What the loop spends outside its forwards, per round: ``"ar"`` (a plain decoding step), ``"g1"``, ``"g4"``,
    ``"g8"`` (greedy rounds of fixed ``γ``) and ``"s4"`` (sampled rounds of ``γ = 4``), each ``{"seconds", "gamma"
    (the mean draft length: the last rounds of a budget draft fewer), "rounds"}``. Random weights accept little
    greedily (about one token a round) and much when sampling (near-uniform distributions). The forwards are
    the loop's own records (:class:`pacer.decoding.meter.MeteredBackend`, synchronised on a device)."""
    t = metered(TransformersBackend(target), TARGET)
    d = metered(TransformersBackend(draft), DRAFT)
    prompt = token_ids(context, min(t.vocab_size, d.vocab_size))

    def run(gamma: int, sampling: SamplingConfig, n: int) -> dict[str, float]:
        stats = GenerationStats()
        out = Output(n, set())  # no end token: the whole budget
        if gamma == 0:
            autoregressive_generate(t, prompt, out, sampling, stats)
        else:
            speculative_generate(t, TokenDrafter(d, t.vocab_size), FixedPolicy(gamma), prompt, out, sampling, stats)
        r = max(stats.rounds, 1)
        return {"seconds": (stats.wall_time - sum(c.seconds for c in stats.calls)) / r,
                "gamma": stats.draft_tokens / r, "rounds": stats.rounds}

    greedy, sampled = SamplingConfig(), SamplingConfig(temperature=1.0, seed=0)
    run(4, greedy, 4)  # warm-up (every first call of a shape)
    run(4, sampled, 4)
    out = {"ar": run(0, greedy, rounds)}
    for g in gammas:
        out[f"g{g}"] = run(g, greedy, rounds + g)
    out["s4"] = run(4, sampled, 3 * rounds)
    return out


def fit_overhead(over: dict[str, dict[str, float]]) -> tuple[float, float]:
    """``o(γ) = a + b γ`` by least squares over the greedy rounds (``b`` clipped at 0)."""
    pts = [(v["gamma"], v["seconds"]) for k, v in over.items() if k.startswith("g")]
    if len(pts) < 2:
        return (pts[0][1] if pts else 0.0), 0.0
    mx = statistics.fmean(g for g, _ in pts)
    my = statistics.fmean(v for _, v in pts)
    sxx = sum((g - mx) ** 2 for g, _ in pts)
    b = max(0.0, sum((g - mx) * (v - my) for g, v in pts) / sxx) if sxx else 0.0
    return max(0.0, my - b * mx), b


# ----------------------------------------------------------------------------------------------------- traces
def bench_traces(path: Path, method: str = "oracle") -> list[list[bool]]:
    """Per-position agreement of draft and target, one list per answer turn, rebuilt from the per-round counts of
    ``method``'s records in a ``pacer bench`` answers file: a round that accepted ``n`` tokens is ``n`` agreements
    and one disagreement (the oracle drafts exactly up to the draft's first disagreement; where a round stopped at
    the oracle's cap or the budget instead, the next position counts as a disagreement: a slight underestimate)."""
    traces = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("method") != method:
            continue
        for choice in rec.get("choices", [])[:1]:
            accepts = choice.get("accept_lengths", [])
            if accepts and isinstance(accepts[0], int):  # one turn, stored flat
                accepts = [accepts]
            for turn in accepts:
                agree: list[bool] = []
                for a in turn:
                    agree += [True] * max(0, int(a) - 1) + [False]
                if agree:
                    traces.append(agree)
    return traces


def iid_traces(alpha: float, n: int, length: int, seed: int = 0) -> list[list[bool]]:
    """``n`` traces of ``length`` positions, each an agreement with probability ``alpha``."""
    rng = random.Random(seed)
    return [[rng.random() < alpha for _ in range(length)] for _ in range(n)]


# ----------------------------------------------------------------------------------- the loop on acceptance traces
class TraceBackend(ModelBackend):
    """A model without weights for replaying an acceptance trace through the real loop. Its greedy token at every
    position of the generation is ``0`` (the target: ``agree=None``), or, for the draft, ``0`` where ``agree`` says
    the draft agrees with the target at that generated position and ``1`` where it does not; the prompt is one
    token (:data:`PROMPT`). Rows are near one-hot logits over a two-token vocabulary, so greedy acceptance, the
    draft's features and the oracle's agreement (:meth:`score`) follow the trace exactly."""

    ROWS = torch.tensor([[8.0, 0.0], [0.0, 8.0]])

    def __init__(self, agree: Sequence[bool] | None = None) -> None:
        self.agree = agree
        self.context, self.vocab_size = 1 << 20, 2
        self.device, self.dtype, self.identity = torch.device("cpu"), torch.float32, self
        self.length = 0

    def _token(self, position: int) -> int:
        """The greedy token for absolute ``position`` (the prompt is position 0)."""
        g = position - len(PROMPT)
        return 1 if self.agree is not None and 0 <= g < len(self.agree) and not self.agree[g] else 0

    def reset(self) -> None:
        self.length = 0

    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False, tree: Tree | None = None):
        depth = tree.depth if tree is not None else range(len(ids))
        rows = self.ROWS[[self._token(self.length + i + 1) for i in depth]]
        self.length += len(ids)
        return (rows[-keep:] if keep else rows), None

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self.ROWS[[self._token(i + 1) for i in range(len(ids))]]


#: the prompt of every replayed generation (one token: its forward is priced as any forward of its length)
PROMPT = [0]


@dataclass
class SimResult:
    speedup: float
    tau: float
    mean_gamma: float


def price(calls: Sequence[Call], costs: Costs) -> float:
    """Seconds of recorded forwards at ``costs``: a target forward over ``k`` tokens ``c_t(k)`` (a tree one
    ``c_tree(k)``), a draft forward ``c_d(k)`` (``c_d`` where no draft curve was measured)."""
    return sum((costs.tree_cost(c.k) if c.tree else costs.target_cost(c.k)) if c.role == TARGET
               else costs.draft_cost(c.k) for c in calls)


@functools.lru_cache(maxsize=64)
def plain(n: int) -> GenerationStats:
    """Plain decoding of ``n`` tokens by the real loop on a :class:`TraceBackend` target (the same for every
    trace of that length: the target's text does not depend on the draft)."""
    stats = GenerationStats()
    autoregressive_generate(metered(TraceBackend(), TARGET), PROMPT, Output(n, set()), SamplingConfig(), stats)
    return stats


def replay(traces: list[list[bool]], make_policy: Callable[[], DraftPolicy]) -> list[GenerationStats]:
    """Greedy decoding of every trace by the real loop on :class:`TraceBackend` models, each with a policy from
    ``make_policy`` (as the API makes one a generation; what it learns across generations is in what the factory
    shares, such as a :class:`CostMemory`). Each generation's stats hold the forwards it made (``calls``) and its
    draft lengths. A policy that ``needs_reference`` (the oracle) gets the drafter's agreement, as the API gives
    it. Raises where the output differs from plain decoding's (it must not)."""
    runs = []
    for agree in traces:
        policy = make_policy()
        stats = GenerationStats()
        drafter = TokenDrafter(metered(TraceBackend(agree), DRAFT), 2)
        reference = [0] * len(agree)  # the target's text (plain(n) decodes it)
        if policy.needs_reference:
            policy.set_reference(drafter.agreement(PROMPT, reference))
        ids = speculative_generate(metered(TraceBackend(), TARGET), drafter, policy, PROMPT,
                                   Output(len(agree), set()), SamplingConfig(), stats)
        if ids != reference:
            raise RuntimeError(f"the loop's output differs from plain decoding's with {policy.describe()}")
        stats.new_tokens = len(ids)
        runs.append(stats)
    return runs


def speedup(runs: list[GenerationStats], costs: Costs, overhead: Callable[[int], float],
            ar_overhead: float) -> SimResult:
    """The replayed generations priced with ``costs`` plus each round's overhead (``overhead(γ)``; a plain step
    ``ar_overhead``) against plain decoding of the same lengths by the same loop, priced the same way."""
    sd_time = ar_time = 0.0
    rounds = drafted = tokens = 0
    for stats in runs:
        ar = plain(stats.new_tokens)
        ar_time += price(ar.calls, costs) + ar.rounds * ar_overhead
        sd_time += price(stats.calls, costs) + sum(overhead(g) for g in stats.draft_lengths)
        rounds += stats.rounds
        drafted += stats.draft_tokens
        tokens += ar.rounds
    return SimResult(ar_time / sd_time if sd_time else float("nan"), tokens / max(rounds, 1),
                     drafted / max(rounds, 1))


def overheads(over: dict[str, dict[str, float]]) -> tuple[Callable[[int], float], float]:
    """The measured loop overhead as ``o(γ)`` (``a + b γ`` fitted over the greedy rounds; a round that drafted
    nothing is a plain step) and a plain step's."""
    a, b = fit_overhead(over)
    ar = over["ar"]["seconds"]
    return (lambda g: ar if g == 0 else a + b * g), ar


def replay_all(traces: list[list[bool]], pairs: dict[str, tuple[Costs, dict[str, dict[str, float]]]]
               ) -> dict[str, dict[str, SimResult]]:
    """Per pair (its costs and measured overhead): fixed ``γ`` = 1..8, the cost-aware rule, the oracle and the
    oracle under the cost-aware rule. A policy that does not read the costs is replayed once for every pair."""
    def oracle() -> OraclePolicy:
        return OraclePolicy(None, min_draft=0, max_draft=32)

    def aware(inner: Callable[[], DraftPolicy], costs: Costs) -> Callable[[], DraftPolicy]:
        memory = CostMemory()  # shared by the generations of one method, as a Decoder shares it
        return lambda: CostAwarePolicy(inner(), costs, refine=0.0, memory=memory)

    fixed = {f"γ={g}": replay(traces, functools.partial(FixedPolicy, g)) for g in GAMMAS}
    fixed["oracle"] = replay(traces, oracle)
    out = {}
    for pair, (costs, over) in pairs.items():
        overhead, ar = overheads(over)
        res = {name: speedup(runs, costs, overhead, ar) for name, runs in fixed.items() if name != "oracle"}
        res["cost-aware"] = speedup(replay(traces, aware(lambda: FixedPolicy(AWARE_CAP, min_draft=0), costs)),
                                    costs, overhead, ar)
        res["oracle"] = speedup(fixed["oracle"], costs, overhead, ar)
        res["oracle, cost-aware"] = speedup(replay(traces, aware(oracle, costs)), costs, overhead, ar)
        out[pair] = res
    return out


# --------------------------------------------------------------------------------------------------------- run
def run(device: torch.device, dtype: torch.dtype, quick: bool, context: int, reps: int, rounds: int,
        trace_files: Sequence[Path], say: Callable[[str], None]) -> dict:
    """Every measurement and replay (see the module docstring) as one JSON-able dict."""
    shapes = QUICK_SHAPES if quick else SHAPES
    pairs = QUICK_PAIRS if quick else PAIRS
    draft_name = pairs[0][1]
    doc: dict = {"device": devices.describe(device), "dtype": str(dtype).removeprefix("torch."),
                 "torch": torch.__version__, "quick": quick, "context": context, "reps": reps, "ks": list(KS),
                 "shapes": {k: asdict(v) for k, v in shapes.items()}, "models": {}, "draft": {}, "overhead": {},
                 "simulation": {}, "traces": {}}
    start = time.perf_counter()
    say(f"building the draft shape {draft_name}")
    draft = build_model(shapes[draft_name], dtype, device, seed=1)
    doc["models"][draft_name] = {"params": params(draft), "c_t": cost_curve(draft, context, reps)}
    rows = torch.arange(min(REDUCED_VOCAB, shapes[draft_name].vocab // 2))
    doc["draft"] = {"model": draft_name, "full": draft_cost(draft, context, reps),
                    "reduced": draft_cost(draft, context, reps, rows), "reduced_rows": len(rows)}
    for target_name, _ in pairs:
        say(f"building the target shape {target_name}")
        target = build_model(shapes[target_name], dtype, device, seed=2)
        doc["models"][target_name] = {"params": params(target), "c_t": cost_curve(target, context, reps)}
        say(f"loop overhead, {target_name} / {draft_name}")
        doc["overhead"][f"{target_name}/{draft_name}"] = loop_overhead(target, draft, context, rounds)
        del target
        free(device)
    del draft
    free(device)
    doc["measure_seconds"] = time.perf_counter() - start

    trace_sets: dict[str, list[list[bool]]] = {}
    for f in trace_files:
        if Path(f).exists():
            found = bench_traces(Path(f))
            if found:
                trace_sets[f"bench oracle ({Path(f).parent.name})"] = found[:6] if quick else found
    for a in ALPHAS:
        trace_sets[f"iid α={a}"] = iid_traces(a, 4 if quick else 30, 48 if quick else 128, seed=int(a * 100))
    doc["traces"] = {k: {"traces": len(v), "tokens": sum(map(len, v)),
                         "agreement": round(sum(map(sum, v)) / max(1, sum(map(len, v))), 4)}
                     for k, v in trace_sets.items()}
    costs = {f"{t}/{draft_name}": (Costs(doc["draft"]["full"], dict(doc["models"][t]["c_t"])),
                                   doc["overhead"][f"{t}/{draft_name}"]) for t, _ in pairs}
    for name, tr in trace_sets.items():
        say(f"replaying {name} through the loop")
        for pair, res in replay_all(tr, costs).items():
            doc["simulation"].setdefault(pair, {})[name] = {k: asdict(r) for k, r in res.items()}
    doc["seconds"] = time.perf_counter() - start
    return doc


# ------------------------------------------------------------------------------------------------------ report
def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def _c1(model: dict) -> float:
    """``c_t(1)`` of a model's record (its keys are ints, or strings once read back from JSON)."""
    c = model["c_t"]
    return c[1] if 1 in c else c["1"]


def markdown(doc: dict) -> str:
    """The report's cost, overhead and speedup sections."""
    ks = doc["ks"]
    lines = [f"## Costs on {doc['device']} ({doc['dtype']}, random weights, {doc['context']}-token context, "
             f"median of {doc['reps']})", ""]
    if doc["quick"]:
        lines += ["*Quick run: tiny shapes, not the Qwen2.5 ones; the numbers only show that the check runs.*", ""]
    lines += ["Target forward scoring k new tokens (ms; the loop's verification keeps k rows of logits):", "",
              "| model | params | " + " | ".join(f"k={k}" for k in ks) + f" | c_t({ks[-1]}) / c_t(1) |",
              "|---|---:|" + "---:|" * len(ks) + "---:|"]
    for name, m in doc["models"].items():
        c = {int(k): v for k, v in m["c_t"].items()}
        size = f"{m['params'] / 1e9:.2f}B" if m["params"] >= 1e8 else f"{m['params'] / 1e6:.2f}M"
        lines.append(f"| {name} | {size} | " + " | ".join(_ms(c[k]) for k in ks)
                     + f" | {c[ks[-1]] / c[1]:.2f} |")
    d = doc["draft"]
    lines += ["", f"Draft token ({d['model']}, one new token): {_ms(d['full'])} ms with the full LM head, "
                  f"{_ms(d['reduced'])} ms with {d['reduced_rows']} rows (reduced draft vocabulary).", ""]
    for name, m in doc["models"].items():
        if name != d["model"]:
            c1 = _c1(m)
            lines.append(f"- c_d / c_t(1) for {name}: {d['full'] / c1:.3f} (full head), {d['reduced'] / c1:.3f} "
                         f"(reduced)")
    lines += ["", "## Loop overhead per round (time of a round minus its forwards)", "",
              "| pair | plain step | γ=1 | γ=4 | γ=8 | sampled γ=4 |", "|---|---:|---:|---:|---:|---:|"]
    for pair, o in doc["overhead"].items():
        c1 = _c1(doc["models"][pair.split("/")[0]])
        cells = [f"{_ms(o[k]['seconds'])} ms ({o[k]['seconds'] / c1:.2f})" for k in ("ar", "g1", "g4", "g8", "s4")]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    lines += ["", "(in brackets: as a fraction of one target forward c_t(1))", "",
              "## Speedup over plain decoding, the real loop on acceptance traces", "",
              "The decoding loop replays each trace on weightless models whose draft agrees with the target where "
              "the trace says; each forward it makes is priced with the costs above (a target forward over k tokens "
              "c_t(k), a draft forward c_d) and each round adds the measured overhead o(γ) (fitted linear in γ); "
              "plain decoding, by the same loop, c_t(1) + its overhead a token. Greedy; cost-aware: the rule of "
              f"pacer.policies.cost_aware over sd capped at {AWARE_CAP}, learning the acceptance per position (no "
              "refinement from timings); "
              "oracle: drafts exactly the tokens the draft gets right (cap 32).", ""]
    for name, t in doc["traces"].items():
        lines.append(f"- traces `{name}`: {t['traces']} turns, {t['tokens']} tokens, agreement {t['agreement']:.3f}")
    if not any(k.startswith("bench") for k in doc["traces"]):
        lines.append("- no committed acceptance traces found (docs/bench/*/answers.jsonl): i.i.d. ones only")
    for pair, sets in doc["simulation"].items():
        cols = list(next(iter(sets.values())))
        lines += ["", f"**{pair}** (speedup ×; mean γ of the cost-aware rule in brackets)", "",
                  "| traces | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for name, res in sets.items():
            cells = []
            for c in cols:
                r = res[c]
                extra = f" ({r['mean_gamma']:.1f})" if c.startswith("cost-aware") else ""
                cells.append(f"{r['speedup']:.2f}{extra}")
            best = max(GAMMAS, key=lambda g: res[f"γ={g}"]["speedup"])
            lines.append(f"| {name} (best fixed γ={best}) | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32", "float16"],
                    help="default: bfloat16 (float32 with --quick on the CPU)")
    ap.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json and gpu_check_costs.md")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, short context, few repetitions (seconds)")
    ap.add_argument("--context", type=int, default=None, help="cached tokens before a timed forward (default 256)")
    ap.add_argument("--reps", type=int, default=None, help="forwards per timed point (default 10)")
    ap.add_argument("--traces", action="append", default=None,
                    help="a pacer bench answers.jsonl with oracle records (repeatable; default: "
                         "scripts/data/acceptance-traces.jsonl)")
    args = ap.parse_args(argv)
    from pacer.errors import PacerError

    try:
        device = devices.check_device(args.device)
    except PacerError as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    dtype_name = args.dtype or ("float32" if args.quick and device.type == "cpu" else "bfloat16")
    dtype = getattr(torch, dtype_name)
    context = args.context or (32 if args.quick else 256)
    reps = args.reps or (2 if args.quick else 10)
    rounds = 6 if args.quick else 24
    torch.manual_seed(0)

    def say(msg: str) -> None:
        print(f"gpu_check: {msg}", file=sys.stderr, flush=True)

    doc = run(device, dtype, args.quick, context, reps, rounds, [Path(p) for p in args.traces or [TRACES]], say)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "gpu_check_costs.md").write_text(markdown(doc))
    for path in write_profiles(doc, out / "profiles"):
        say(f"cost profile {path}")
    bad = [p for p, sets in doc["simulation"].items() for r in sets.values() for v in r.values()
           if not math.isfinite(v["speedup"])]
    say(f"done in {doc['seconds']:.0f}s: {out / 'gpu_check_costs.md'}")
    return 1 if bad else 0


def write_profiles(doc: dict, folder: Path) -> list[Path]:
    """One cost profile (:mod:`pacer.profiles`) per measured target shape with the draft shape: its ``c_t(k)`` at
    the check's context, the draft's token cost (full head) and prefill per token estimated from its curve. The pair
    is a random-weight shape, not a real model: ``pacer bench --costs`` refuses it for a real pair (its fingerprint
    names the shape), it is for the replay and for reading the curve (``docs/bench/gpu/``)."""
    from pacer.machine import cpu_identity, describe_cpu
    from pacer.profiles import Profile

    folder.mkdir(parents=True, exist_ok=True)
    ctx = int(doc["context"])
    d = doc["draft"]
    dc = {int(k): float(v) for k, v in doc["models"][d["model"]]["c_t"].items()}
    gpu = str(doc["device"]).split(",")[0].strip().lower().replace(" ", "-")
    paths = []
    for name, m in doc["models"].items():
        if name == d["model"]:
            continue
        tc = {int(k): float(v) for k, v in m["c_t"].items()}
        kmax = max(tc)
        prof = Profile(f"{gpu}-{name}-transformers-{doc['dtype']}",
                       {"cpu": cpu_identity(), "describe": f"{doc['device']} (host {describe_cpu()})",
                        "device": doc["device"], "threads": torch.get_num_threads()},
                       "transformers", f"torch {doc['torch']}",
                       {"fingerprint": f"random-weight shape {name}", "dtype": doc["dtype"]},
                       {"fingerprint": f"random-weight shape {d['model']}", "dtype": doc["dtype"], "rows": "full"},
                       {ctx: tc}, {ctx: tc[kmax] / kmax}, {ctx: {k: v for k, v in dc.items() if k <= 8}},
                       dc[max(dc)] / max(dc), measured=time.strftime("%Y-%m-%d"),
                       source="scripts/gpu_check.py (random-weight shapes, median of "
                              f"{doc['reps']} forwards a point)",
                       notes=["tree forwards not measured: priced as a chain",
                              "prefill per token estimated as c_t(k_max) / k_max"])
        path = folder / f"{prof.name}.json"
        prof.save(path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    raise SystemExit(main())

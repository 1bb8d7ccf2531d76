"""The priced oracle (:mod:`pacer.bench.oracle`): exact against a brute-force search on small random cases, and
never slower than the rounds a method took on a recorded run."""

from __future__ import annotations

import json
import random

import pytest

from pacer.api import Decoder
from pacer.bench import data
from pacer.bench.limit import ORACLE_FILE, record_oracle, source_set
from pacer.bench.methods import parse_methods
from pacer.bench.oracle import (
    PLAIN,
    Source,
    lookup_lengths,
    priced_oracle,
    replay_seconds,
    round_time,
    run_lengths,
)
from pacer.bench.report import write_report
from pacer.bench.runner import Bench
from pacer.costs import ContextCosts, Costs
from pacer.tiny import tiny_pair


def context_costs(rng: random.Random) -> ContextCosts:
    """Random costs that change with the context: a target forward grows with ``k`` (steep or flat) and with the
    context; a draft token costs a random share of a one-token forward."""
    base, slope, growth = rng.uniform(0.5, 2.0), rng.uniform(0.0, 1.5), rng.uniform(0.0, 0.02)
    draft, check = rng.uniform(0.0, 0.8), rng.uniform(0.0, 0.05)

    def at(context: int) -> Costs:
        c1 = base * (1.0 + growth * context)
        return Costs(draft * c1, {k: c1 * (1.0 + slope * (k - 1)) for k in (1, 2, 4, 8, 16)})

    return ContextCosts(at, check)


def brute_force(prompt_len: int, tokens: int, sources: list[Source], costs: ContextCosts, i: int = 0) -> float:
    """Every sequence of rounds from position ``i``, one by one: a plain step, or ``n`` tokens of a source where it
    agrees that far and the round ends within the continuation."""
    if i == tokens:
        return 0.0
    c = costs.costs(prompt_len + i)
    best = c.target_cost(1) + brute_force(prompt_len, tokens, sources, costs, i + 1)
    for s in sources:
        for n in range(1, tokens - i):
            if n > s.agree[i]:
                break
            per = c.policy_per_check + (0.0 if s.free else c.draft)
            best = min(best, n * per + c.target_cost(n + 1) + brute_force(prompt_len, tokens, sources, costs,
                                                                            i + n + 1))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_the_oracle_equals_a_brute_force_search_on_small_cases(seed):
    rng = random.Random(seed)
    tokens = rng.randint(1, 9)
    # contexts across a step of ContextCosts (32 is priced at 64, 31 at 0): the costs change along the way
    prompt_len = rng.randint(32 - tokens, 31)
    costs = context_costs(rng)
    sources = [Source("draft", tuple(run_lengths([rng.random() < 0.7 for _ in range(tokens)]))),
               Source("lookup", tuple(rng.choice([0, 0, 1, 3, 9]) for _ in range(tokens)), free=True)]
    sources = sources[: rng.randint(0, 2)]
    path = priced_oracle(prompt_len, tokens, sources, costs)
    assert path.seconds == pytest.approx(brute_force(prompt_len, tokens, sources, costs), rel=1e-12)
    # its rounds are feasible, cover the continuation exactly and take the time it says
    agree = {s.name: s for s in sources}
    total, i = 0.0, 0
    for pos, name, n in path.rounds:
        assert pos == i and (name == PLAIN and n == 0 or 1 <= n <= agree[name].agree[i]) and i + n + 1 <= tokens
        total += round_time(costs.costs(prompt_len + i), n, name != PLAIN and agree[name].free)
        i += n + 1
    assert i == tokens and total == pytest.approx(path.seconds, rel=1e-12)
    assert path.plain_seconds == pytest.approx(sum(costs.costs(prompt_len + j).target_cost(1) for j in range(tokens)))
    assert path.seconds <= path.plain_seconds * (1 + 1e-12)


def test_run_lengths_and_lookup_lengths():
    assert run_lengths([True, True, False, True, False, False]) == [2, 1, 0, 1, 0, 0]
    # two-token continuations keyed by one token: after "1" the lookup proposes "2 3", then "4 5" after "3", then
    # "7 8" after "5": five agree, then 8 != 6; after "7" it proposes 8
    prompt, ref = [9, 1, 2, 3, 4, 5, 7, 8, 9, 1], [2, 3, 4, 5, 7, 6]
    assert lookup_lengths(prompt, ref, ngram=2, key_len=1) == [5, 4, 3, 2, 1, 0]
    assert lookup_lengths(prompt, ref, ngram=2, key_len=1, cap=2)[:3] == [2, 2, 2]
    # the output's own n-grams, once learnt ("7 8" after the first "7"), up to the continuation's end
    assert lookup_lengths([5, 6], [7, 8, 7, 8, 7, 8], ngram=2, key_len=1) == [0, 0, 0, 3, 2, 1]
    assert lookup_lengths([5, 6], [7, 8, 7, 8, 7, 8]) == [0] * 6  # the lookup's own 8-token continuations: none


PROMPT = "hello world, this is hello world, this is a test of the"


@pytest.fixture(scope="module")
def recorded():
    dec = Decoder(*tiny_pair("close"), threads=1)
    ids = dec.encode(PROMPT)
    ref = dec.generate(ids, "ar", 40).token_ids
    runs = {}
    for method, kw in (("sd", {"gamma": 2}), ("sd", {"gamma": 5}), ("heuristic", {}), ("lookup", {})):
        st = dec.generate(ids, method, 40, **kw).stats
        runs[f"{method}{kw}"] = (method, list(st.draft_lengths), [a + 1 for a in st.accepted_counts])
    draft = Source("draft", tuple(run_lengths(dec.make_drafter("sd").agreement(ids, ref))))
    lookup = Source("lookup", tuple(lookup_lengths(ids, ref)), free=True)
    return len(ids), ref, runs, draft, lookup


@pytest.mark.parametrize("seed", range(6))
def test_the_oracle_is_never_slower_than_a_recorded_method(recorded, seed):
    """Each method's rounds, priced alike, are one feasible path of the oracle's search."""
    prompt_len, ref, runs, draft, lookup = recorded
    costs = context_costs(random.Random(seed))
    for name, (method, drafted, committed) in runs.items():
        assert sum(committed) >= len(ref)
        free = method == "lookup"
        path = priced_oracle(prompt_len, len(ref), [lookup if free else draft], costs)
        took = replay_seconds(prompt_len, len(ref), drafted, committed, costs, free)
        assert path.seconds <= took * (1 + 1e-9), name
        assert priced_oracle(prompt_len, len(ref), [draft, lookup], costs).seconds <= path.seconds * (1 + 1e-12)


QUESTIONS = [data.Question("t", "1", "code", ("def f(x):\n    return f(x) + f(x) + f(",), chat=False),
             data.Question("t", "2", "chat", ("Say hi.", "Again."))]


def test_pacer_bench_reports_each_method_as_a_fraction_of_the_oracle(tmp_path):
    """The pass records every turn of ar's output once; no recorded method is faster than its source set's oracle
    on the same costs; the report divides each method's speedup by the oracle's, per question and kind."""
    dec = Decoder(*tiny_pair("close"), threads=1)
    specs = parse_methods("ar,sd:gamma=3,lookup,ouroboros")
    bench = Bench(dec, specs, QUESTIONS, tmp_path, 16, progress=False)
    bench.run()
    costs = context_costs(random.Random(7))
    assert record_oracle(dec, QUESTIONS, bench.records, costs, tmp_path, log=lambda s: None) == 3  # turns
    assert record_oracle(dec, QUESTIONS, bench.records, costs, tmp_path, log=lambda s: None) == 0  # recorded
    rows = {(r["question_id"], r["turn"]): r for r in map(json.loads, (tmp_path / ORACLE_FILE).open())}
    assert len(rows) == 3 and all(r["draft_forwards"] in (1, 2) for r in rows.values())
    assert rows[("1", 0)]["prompt_tokens"] == len(dec.encode(QUESTIONS[0].turns[0]))
    for rec in bench.records:
        name = source_set(rec["method"])
        if name not in ("draft", "lookup"):
            continue
        c = rec["choices"][0]
        for t, (ids, drafted, committed) in enumerate(zip(c["token_ids"], c["draft_lengths"],
                                                          c["accept_lengths_per_turn"], strict=True)):
            row = rows[(rec["question_id"], t)]
            assert row["tokens"] == len(ids) and all(len(v) == len(ids) for v in row["lengths"].values())
            plain = sum(costs.costs(row["prompt_tokens"] + j).target_cost(1) for j in range(len(ids)))
            assert row["sets"][name]["plain_seconds"] == pytest.approx(plain, rel=1e-12)
            took = replay_seconds(row["prompt_tokens"], len(ids), drafted, committed, costs, name == "lookup")
            assert row["sets"][name]["seconds"] <= took * (1 + 1e-9), (rec["method"], t)
    summary = write_report(tmp_path, bench.records, [s.label for s in specs], {})
    oracle = summary["priced_oracle"]
    overall = oracle["groups"]["overall"]
    assert {m: s["sources"] for m, s in overall.items()} == {"sd:gamma=3": "draft", "lookup": "lookup",
                                                             "ouroboros": "draft+phrase"}
    assert set(oracle["groups"]) == {"overall", "category:code", "category:chat"}
    assert len(oracle["questions"]) == 6
    for q in oracle["questions"]:
        assert q["of_oracle"] == pytest.approx(q["speedup"] / q["oracle_speedup"]) and q["oracle_speedup"] >= 1 - 1e-9
    assert "## Priced oracle" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["priced_oracle"]["pass"]["turns"] == 3

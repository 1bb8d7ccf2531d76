"""The cost-aware rule (pacer.policies.cost_aware, on pacer.costs) and this machine's calibration
(pacer.calibration): drafting goes on only where it pays on the measured costs, never at a loss where verification
is not free, and a calibration is measured once per machine and pair, re-measured whenever what it depends on changes,
and never trusted damaged."""

import json

import pytest
import torch

from pacer import Decoder, machine, timing
from pacer import calibration as cal_mod
from pacer.costs import Costs
from pacer.policies import DraftState, FixedPolicy, RoundResult
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.pricing import UNPRICED, CostMemory, SurvivalCalibrator, catch_up_pays, gain_pays
from pacer.tiny import tiny_pair

PROMPTS = ["hello world, this is", "def f(x):\n    return"]
#: verification costs k forwards (the AVX2 bf16 curve of the shared reference, in seconds)
LINEAR = Costs(draft=0.135, target={1: 0.365, 2: 0.659, 4: 1.28, 8: 2.471, 16: 4.877})
#: verification nearly free, draft a tenth of a target forward
FLAT = Costs(draft=0.03, target={1: 0.3, 2: 0.3, 8: 0.31, 17: 0.33})
DRAFTING = ["sd", "heuristic", "confidence", "entropy", "oracle", "ouroboros"]


def decoder(kind: str, costs: Costs) -> Decoder:
    return Decoder(*tiny_pair(kind), threads=1, costs=costs)


# --------------------------------------------------------------------------------------------- the rule alone
def test_first_token_pays_only_if_it_beats_plain_decoding():
    # flat: c_t(1) = c_t(2) = 0.3, c_d = 0.03: the first token pays iff S_1 * 0.3 >= 0.03, i.e. S_1 >= 0.1
    assert gain_pays([], 0.11, FLAT) and not gain_pays([], 0.09, FLAT)
    # proportional: even a certain token costs more (0.135 + 0.294) than the plain step it saves (0.365)
    assert not gain_pays([], 1.0, LINEAR)
    assert not any(gain_pays([1.0] * n, 1.0, LINEAR) for n in range(12))


def test_rule_stops_where_the_round_throughput_stops_rising():
    S = [0.9**i for i in range(1, 17)]
    stop = next(n for n in range(16) if not gain_pays(S[:n], S[n], FLAT))
    # brute force: the round length with the best expected tokens per second
    def rate(n):
        return (1 + sum(S[:n])) / (n * FLAT.draft + FLAT.target_cost(n + 1))
    best = max(range(17), key=rate)
    assert stop == best


def test_a_round_of_n_drafted_tokens_is_priced_at_c_t_of_n_plus_1():
    # a curve that bends at every k: c_t(n) and c_t(n + 1) differ everywhere, so pricing the round one forward short
    # (c_t(n), c_t(n + 1) - c_t(n)) moves the decision
    bent = Costs(draft=0.1, target={1: 1.0, 2: 1.1, 3: 1.5, 4: 2.5})
    # one token drafted (S_1 = 0.9): E = 1.9, T = c_d + c_t(2) = 1.2, dT = c_d + c_t(3) - c_t(2) = 0.5; the second
    # token pays iff S_2 * 1.2 >= 1.9 * 0.5, i.e. S_2 >= 0.7917 (at c_t(1), c_t(2): from 0.345; T alone at c_t(1): from
    # 0.864; dT alone at c_t(2) - c_t(1): from 0.317)
    assert gain_pays([0.9], 0.80, bent) and not gain_pays([0.9], 0.79, bent)
    # nothing drafted: E = 1, T = c_t(1) = 1.0, dT = c_d + c_t(2) - c_t(1) = 0.2: the first pays iff S_1 >= 0.2
    assert gain_pays([], 0.21, bent) and not gain_pays([], 0.19, bent)
    # a free (looked-up) token: dT = c_t(3) - c_t(2) = 0.4 against T = 1.2 (spent 0.1): pays iff S_2 >= 0.6333
    assert gain_pays([0.9], 0.64, bent, free=True) and not gain_pays([0.9], 0.63, bent, free=True)


@pytest.mark.parametrize("n", [0, 3, 6])
def test_rule_is_monotone_in_the_costs(n):
    S, nxt = [0.8**i for i in range(1, n + 1)], 0.8 ** (n + 1)
    said = [gain_pays(S, nxt, Costs(d, FLAT.target)) for d in (0.001, 0.01, 0.03, 0.1, 0.3, 1.0)]
    assert said == sorted(said, reverse=True)  # dearer draft tokens: once it stops paying it never pays again
    slopes = [Costs(0.03, {1: 0.3, 17: 0.3 + s * 16}) for s in (0.0, 0.01, 0.05, 0.1, 0.3)]
    said = [gain_pays(S, nxt, c) for c in slopes]
    assert said == sorted(said, reverse=True)
    assert not said[-1] and (said[0] or n == 6)  # at n = 6 even free verification stops paying (S_7 = 0.21)


def test_monotone_fit_of_a_noisy_curve():
    c = Costs(0.1, {1: 0.33, 2: 0.27, 4: 0.30, 8: 0.40}).monotone()
    assert c.target == pytest.approx({1: 0.30, 2: 0.30, 4: 0.30, 8: 0.40})  # 1..4 pooled, 8 untouched
    c = Costs(0.1, {1: 0.37, 2: 0.35, 3: 0.44, 4: 0.41, 6: 0.42, 8: 0.45}).monotone()
    assert c.target[2] == pytest.approx(0.36) and c.target[3] == pytest.approx(0.42333, abs=1e-4)
    assert list(c.target.values()) == sorted(c.target.values())


def test_survival_calibrator_learns_the_real_rate_and_reports_the_error():
    c = SurvivalCalibrator()
    assert c(0.75) == 0.75  # no observations: the raw score is trusted
    for _ in range(200):  # scores of 0.95 that survive only half the time
        c.update([0.95], 1)
        c.update([0.95], 0)
    assert abs(c(0.95) - 0.5) < 0.02
    assert abs(c.error - 0.45) < 1e-6
    assert c(0.15) == 0.15  # another bin is untouched
    c.update([None, 0.15], 2)  # a position without a score is skipped, the next one counted at its position
    assert c.seen[1] == 1 and c.hits[1] == 1


def fixed_state(n: int, prob: float = 0.9) -> DraftState:
    return DraftState(tokens=[1] * n, prob=[prob] * n, top_prob=[prob] * n, entropy=[0.1] * n)


def test_gate_uses_the_running_acceptance_and_learns_from_rounds():
    gate = CostAwarePolicy(FixedPolicy(gamma=16, min_draft=0), FLAT, refine=0.0, memory=CostMemory(0.9))
    lengths = []
    for _ in range(2):
        n = 0
        while gate.should_continue(fixed_state(n)):
            n += 1
        lengths.append(n)
        gate.update(fixed_state(n), RoundResult(n, 0))  # every first token rejected
    assert lengths[0] >= 4
    for _ in range(60):
        gate.update(fixed_state(4), RoundResult(4, 0))
    assert gate.alpha < 0.1
    assert not gate.should_continue(fixed_state(0))  # α ≈ 0: not even the first token pays


def test_a_rule_that_declined_to_draft_tries_again():
    """Only drafting rounds teach the rule, so an acceptance learnt low must not stop drafting for good: each round
    the rule declines fades the evidence towards the prior until a draft is tried; a draft that fails there makes it
    wait again; where even the prior does not pay (verification ∝ k) fading never makes it draft."""
    gate = CostAwarePolicy(FixedPolicy(gamma=16, min_draft=0), FLAT, refine=0.0, memory=CostMemory())
    for _ in range(30):  # a bad stretch: every first token rejected
        gate.update(fixed_state(1), RoundResult(1, 0))
    waits = []
    for _ in range(3):
        rounds = 0
        while not gate.should_continue(fixed_state(0)):
            gate.update(fixed_state(0), RoundResult(0, 0))
            rounds += 1
            assert rounds < 500, "the rule never drafts again"
        waits.append(rounds)
        gate.update(fixed_state(1), RoundResult(1, 0))  # the draft it tried fails too
    assert waits[0] > 20 and all(w > 0 for w in waits)  # it waits, and waits again after a failed try
    # rounds the budget left no room for (the rule was never asked) fade nothing
    before = list(gate.memory.trials)
    gate.update(fixed_state(0), RoundResult(0, 0))
    assert gate.memory.trials == before
    steep = CostAwarePolicy(FixedPolicy(gamma=16, min_draft=0), LINEAR, refine=0.0, memory=CostMemory())
    for _ in range(500):
        assert not steep.should_continue(fixed_state(0))
        steep.update(fixed_state(0), RoundResult(0, 0))


def test_a_decoder_whose_rule_learnt_a_low_acceptance_drafts_again():
    """The decoder keeps the rule's memory across generations (a server's requests): after a stretch of rejected
    drafts a generation with a draft that agrees goes back to drafting within it."""
    dec = decoder("same", FLAT)
    dec.generate(PROMPTS[0], "sd", max_new_tokens=4)
    (memory,) = dec.methods._cost_memory.values()
    for _ in range(30):
        memory.update([None], drafted=1, accepted=0)
    runs = [dec.generate(p, "sd", max_new_tokens=60).stats.draft_lengths for p in PROMPTS * 3]
    assert runs[0][0] == 0  # it starts by waiting ...
    assert sum(g > 0 for g in runs[-1]) >= len(runs[-1]) / 2, runs  # ... and drafts again
    assert memory.alpha(1) > 0.5


def test_gate_follows_the_loop_timings():
    """Measured rounds slower than calibrated (here: the draft 10x) shift the decision."""
    gates = [CostAwarePolicy(FixedPolicy(gamma=16, min_draft=0), FLAT, refine=r, memory=CostMemory(0.3, 1e6))
             for r in (0.5, 0.0)]  # α held at 0.3: only the costs differ
    for gate in gates:  # the same verdicts (so the same α), measured times only matter with refine > 0
        for _ in range(10):
            gate.update(fixed_state(4), RoundResult(4, 3, draft_seconds=4 * 10 * FLAT.draft, verify_seconds=0.3,
                                                    draft_forwards=4,
                                                    scored=5))
    assert gates[0].costs.draft > 3 * FLAT.draft and gates[1].costs.draft == FLAT.draft
    refined, fixed = (g.should_continue(fixed_state(0)) for g in gates)
    assert fixed and not refined  # 0.3 * c_t(1) pays a 0.03 s draft token, not a 0.12 s one


# ----------------------------------------------------------------------------------------- whole generations
@pytest.mark.parametrize("method", [*DRAFTING, "pacer+ouroboros-free"])
def test_proportional_costs_draft_nothing_and_stay_exact(method):
    dec = decoder("same", LINEAR)
    for prompt in PROMPTS:
        ar = dec.generate(prompt, "ar", max_new_tokens=24)
        if method == "pacer+ouroboros-free":  # an Ouroboros drafter under the entropy proxy
            res = dec.generate(prompt, "entropy", max_new_tokens=24, drafter=dec.make_drafter("ouroboros"))
        else:
            res = dec.generate(prompt, method, max_new_tokens=24)
        assert res.token_ids == ar.token_ids
        assert res.stats.draft_tokens == 0, (method, res.stats.draft_lengths)
        # every round of the rule's drafted nothing (the prefill's token came before them: no round of the rule's)
        assert res.extra["cost_aware"]["zero_rounds"] == res.extra["cost_aware"]["rounds"] == res.stats.rounds - 1


@pytest.mark.parametrize("method", ["sd", "heuristic", "confidence", "entropy", "oracle"])
def test_flat_costs_and_a_perfect_draft_draft_to_the_maximum(method):
    dec = decoder("same", Costs(draft=0.001, target={1: 1.0, 64: 1.0}))
    res = dec.generate(PROMPTS[0], method, max_new_tokens=60, max_draft=8,
                       **({"gamma": 8, "cost_aware": True} if method in ("sd", "heuristic") else {}))
    assert res.stats.acceptance_rate == 1.0
    # [0]: the prefill's token; [1]: the first drafting round, which pays the draft's prompt read; the last round is
    # cut by the token budget
    full = [g for g in res.stats.draft_lengths[2:-1]]
    assert full and set(full) == {8}, res.stats.draft_lengths


def test_learned_policies_draft_nothing_on_proportional_costs():
    from test_preverify import random_policy

    dec = decoder("close", LINEAR)
    ar = dec.generate(PROMPTS[0], "ar", max_new_tokens=20)
    for kind in ("pacer", "specdecpp"):
        pol = random_policy(kind, block=1, hidden=dec.draft_info.model.config.hidden_size)
        pol.threshold, pol.min_draft = None, 0
        gate = CostAwarePolicy(pol, LINEAR, refine=0.0)
        res = dec.generate(PROMPTS[0], kind, max_new_tokens=20, policy=gate, pricer=gate.pricer)
        assert res.token_ids == ar.token_ids and res.stats.draft_tokens == 0
        cheap = CostAwarePolicy(pol, Costs(1e-4, {1: 1.0, 64: 1.0}), refine=0.0)
        res = dec.generate(PROMPTS[0], kind, max_new_tokens=20, policy=cheap, pricer=cheap.pricer)
        assert res.token_ids == ar.token_ids and res.stats.draft_tokens > 0


def test_the_layer_reads_each_drafted_token_once_a_round_the_rules_update_included():
    """Under the cost rule the pre-verification layer feeds every drafted token to itself once (its memo of the
    draft): the rule's end-of-round update reuses the scores it decided with instead of re-reading the whole draft
    (a check per token a round, ~0.5 ms each on a 2-core CPU)."""
    from test_preverify import random_policy, rows_fed

    cheap = Costs(1e-4, {1: 1.0, 64: 1.0})
    dec = decoder("close", cheap)
    pol = random_policy("pacer", block=1, hidden=dec.draft_info.model.config.hidden_size)
    pol.threshold, pol.min_draft = None, 0
    rows = rows_fed(pol)
    res = dec.generate(PROMPTS[0], "pacer", max_new_tokens=20,
        policy=(rule := CostAwarePolicy(pol, cheap, refine=0.0)), pricer=rule.pricer)
    assert res.stats.draft_tokens > 3
    assert sum(rows) == res.stats.draft_tokens  # each drafted token read once, none re-read


def test_explicit_gamma_or_threshold_turns_the_rule_off():
    dec = decoder("same", LINEAR)
    res = dec.generate(PROMPTS[0], "sd", max_new_tokens=20, gamma=3)
    assert "cost_aware" not in res.extra and set(res.stats.draft_lengths[1:-1]) == {3}  # [0]: the prefill's
    res = dec.generate(PROMPTS[0], "confidence", max_new_tokens=20, options={"threshold": 0.0})
    assert "cost_aware" not in res.extra and res.stats.draft_tokens > 0
    res = dec.generate(PROMPTS[0], "sd", max_new_tokens=20, gamma=3, cost_aware=True)
    assert res.stats.draft_tokens == 0


def test_cost_aware_sampling_stays_exact_in_distribution():
    """Rejection sampling is exact for any stopping rule that looks only at the draft: with the rule on, the
    first sampled token's distribution over many seeds matches the target's (chi-square)."""
    from scipy.stats import chisquare

    from pacer.sampling import SamplingConfig

    dec = decoder("close", FLAT)
    ids = dec.encode("hello")
    with torch.inference_mode():
        p = torch.softmax(dec.target.model(input_ids=torch.tensor([ids], device=dec.device)).logits[0, -1].float(),
                          -1).cpu()
    counts = torch.zeros_like(p)
    drafted = 0
    for seed in range(600):
        res = dec.generate(ids, "confidence", max_new_tokens=4, sampling=SamplingConfig(1.0, seed=seed))
        counts[res.token_ids[0]] += 1
        drafted += res.stats.draft_tokens
    assert drafted > 0
    top = torch.argsort(p, descending=True)[:8]  # the 8 likeliest tokens and "any other" as categories
    obs = [*(float(counts[i]) for i in top), 600 - float(counts[top].sum())]
    exp = [*(float(p[i]) * 600 for i in top), 600 * (1 - float(p[top].sum()))]
    exp = [e * sum(obs) / sum(exp) for e in exp]  # float32 p: scipy refuses sums that differ by 1 ulp
    assert chisquare(obs, exp).pvalue > 0.001


# ------------------------------------------------------------------------------------------------ calibration
@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def counting(monkeypatch):
    calls = []
    real = cal_mod.measure

    def measure(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(cal_mod, "measure", measure)
    monkeypatch.setattr(cal_mod, "NOISY", 1e9)  # tiny models time in microseconds: never call them noisy here
    return calls


def test_calibration_is_cached_and_remeasured_when_its_key_changes(home, monkeypatch):
    calls = counting(monkeypatch)
    t, d = tiny_pair("close")
    a = cal_mod.load_or_measure(Decoder(t, d, threads=1), None, progress=False)
    assert calls == [1] and a.source == "measured" and a.costs.target_cost(1) > 0 and a.costs.draft > 0
    assert set(a.measured) >= {1, 2, 4}
    b = cal_mod.load_or_measure(Decoder(t, d, threads=1), None, progress=False)
    assert calls == [1] and b.source == "cache" and b.costs.target == a.costs.target
    # another CPU flag set (one no real machine reports: on an AVX2-only machine ["avx2"] is its own set)
    real = cal_mod.cpu_identity
    assert real()["flags"] != ["avx2", "avx512f", "amx_tile"]
    monkeypatch.setattr(cal_mod, "cpu_identity", lambda: {**real(), "flags": ["avx2", "avx512f", "amx_tile"]})
    cal_mod.load_or_measure(Decoder(t, d, threads=1), None, progress=False)
    assert calls == [1, 1]
    monkeypatch.setattr(cal_mod, "cpu_identity", real)
    # other threads, another draft vocabulary, another dtype
    cal_mod.load_or_measure(Decoder(t, d, threads=2), None, progress=False)
    assert len(calls) == 3
    torch.set_num_threads(1)
    cal_mod.load_or_measure(Decoder(t, d, threads=1), torch.arange(100), progress=False)
    assert len(calls) == 4
    t16 = type(t)(t.model, t.tokenizer, t.source, t.fingerprint, torch.bfloat16)
    cal_mod.load_or_measure(Decoder(t16, d, threads=1), None, progress=False)
    assert len(calls) == 5
    cal_mod.load_or_measure(Decoder(t, d, threads=1), None, progress=False)
    assert len(calls) == 5  # the first key is still cached


def test_a_cached_prefill_timed_cold_is_remeasured(home, monkeypatch):
    """A calibration cached before the prefill was timed warm may hold a cold first forward's prefill (the Zen 4's:
    71 ms a prompt token against 22 ms a token of its 17-token forward): one its own curve contradicts is
    measured again, with a note; a plausible one is used, and so is one measured warm whatever it costs (or every
    start would measure again)."""
    calls = counting(monkeypatch)
    dec = Decoder(*tiny_pair("close"), threads=1)
    first = cal_mod.load_or_measure(dec.pair, None, progress=False)
    c = first.costs
    bound = c.target[max(c.target)] / max(c.target)
    for prefill, warm, again in ((bound, False, False), (3 * bound, False, True), (3 * bound, True, False)):
        first.prefill = prefill
        payload = first.payload()
        assert payload.pop("prefill_warm") is True  # what measure() caches now
        cal_mod.STORE.put(first.key, {**payload, **({"prefill_warm": True} if warm else {})})
        cal = cal_mod.load_or_measure(dec.pair, None, progress=False)
        assert (cal.source == "measured") == again and calls == [1] * (1 + again)
        assert again == any("cold first forward" in n for n in cal.notes)
        calls.clear()
        calls.append(1)


@pytest.mark.parametrize("damage", ["garbage", "checksum", "truncated", "other-key"])
def test_a_damaged_cache_is_remeasured_with_a_note(home, monkeypatch, damage):
    calls = counting(monkeypatch)
    dec = Decoder(*tiny_pair("close"), threads=1)
    first = cal_mod.load_or_measure(dec.pair, None, progress=False)
    path = cal_mod.cache_path(first.key)
    doc = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\xff\x00 not json")
    elif damage == "checksum":
        doc["payload"]["costs"]["draft"] *= 10
        path.write_text(json.dumps(doc))
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
    else:
        doc["key"]["threads"] = 99
        path.write_text(json.dumps(doc))
    again = cal_mod.load_or_measure(dec.pair, None, progress=False)
    assert calls == [1, 1] and again.source == "measured"
    assert any("re-measuring" in n for n in again.notes)
    assert cal_mod.load(first.key)[0] is not None  # rewritten whole


def test_interrupted_calibration_is_conservative_and_writes_nothing(home, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cal_mod, "measure", interrupted)
    dec = Decoder(*tiny_pair("same"), threads=1)
    cal = dec.calibration(None)
    assert cal.source == "conservative" and "interrupted" in cal.notes[-1]
    assert not (home / "calibration").exists() or not list((home / "calibration").iterdir())
    res = dec.generate(PROMPTS[0], "sd", max_new_tokens=10)  # decodes plainly
    assert res.stats.draft_tokens == 0


def test_a_noisy_calibration_decides_no_later_run(home, monkeypatch):
    """A calibration measured while the machine was busy (once: c_t(1) 3.7 s against 0.2 s quiet) would decide every
    later run: it is used conservatively by the run that measured it and cached marked noisy, which no later run
    takes (each measures again, until one measures quiet and replaces it); a quiet calibration already cached stays
    over a noisy re-measurement."""
    monkeypatch.setattr(cal_mod, "NOISY", 1.0)  # every spread counts as noise
    dec = Decoder(*tiny_pair("close"), threads=1)
    cal = cal_mod.load_or_measure(dec.pair, None, progress=False)
    path = str(cal_mod.cache_path(cal.key))
    assert cal.noisy and "noisy" in cal.notes[-2]
    assert cal.notes[-1] == f"cached marked noisy in {path}: no later run decides on it, the next one measures again"
    assert cal.cached == path and cal.to_dict()["cached"] == path
    cached, why = cal_mod.load(cal.key)
    assert cached is None and "noisy" in why  # on disk, marked noisy: never taken
    again = cal_mod.load_or_measure(dec.pair, None, progress=False)
    assert again.source == "measured" and again.noisy  # measured again, not taken from the cache
    monkeypatch.setattr(cal_mod, "NOISY", 1e9)  # quiet now
    quiet = cal_mod.load_or_measure(dec.pair, None, progress=False)
    assert quiet.source == "measured" and not quiet.noisy and any("noisy" in n for n in quiet.notes)
    assert quiet.cached == path and cal_mod.load(cal.key)[0].costs == quiet.costs  # replaced, and taken from now on
    assert cal_mod.load_or_measure(dec.pair, None, progress=False).source == "cache"
    # pacer calibrate on a busy machine over a quiet cached calibration: that one stays for later runs
    monkeypatch.setattr(cal_mod, "NOISY", 1.0)
    busy = cal_mod.load_or_measure(dec.pair, None, refresh=True, progress=False)
    assert busy.noisy and busy.notes[-1] == f"not cached: later runs use the calibration cached in {path}"
    assert busy.cached == "" and cal_mod.load(cal.key)[0].costs == quiet.costs


def test_a_linear_curve_is_extrapolated_after_four_tokens(home, monkeypatch):
    """Where c_t(4) >= 2.5 c_t(1) the long forwards (seconds each on such a CPU) are not measured."""
    seen = []

    dec = Decoder(*tiny_pair("close"), threads=1)

    def slow_forward(cm, tokens, base, keep=1, tree=None):
        if base:  # a forward after a cache (not the prefill)
            seen.append((cm is dec.target, len(tokens)))
        return 0.01 * len(tokens)

    monkeypatch.setattr(timing, "timed", slow_forward)
    cal = cal_mod.measure(dec.pair, None)
    assert max(k for target, k in seen if target) == 4 and cal.measured == [1, 2, 3, 4]
    assert sorted(cal.costs.draft_curve) == [1, 2, 4, 8]  # the draft's curve, for phrase checks
    assert abs(cal.costs.target_cost(16) - 0.16) < 1e-9
    assert "not free" in cal.verdict()


def test_the_prefill_is_timed_warm(home, monkeypatch):
    """A model's first forward pays one-time costs (weights paged in, kernels chosen): the prefill per token is
    not timed on it (a cold first forward once priced a Zen 4's prompt token at 3x a 17-token forward's)."""
    dec = Decoder(*tiny_pair("close"), threads=1)
    forwarded: set[int] = set()
    for m in (dec.pair.target, dec.pair.draft_backend(None)):
        real = m.inner.forward

        def forward(*a, _real=real, _m=m, **k):
            forwarded.add(id(_m))
            return _real(*a, **k)

        monkeypatch.setattr(m.inner, "forward", forward)
    monkeypatch.setattr(dec.pair, "draft_backend", lambda rows, _d=m: _d)

    def timed(cm, tokens, base, keep=1, tree=None):  # before a warm-up forward of the model: 100 s, else 10 ms a token
        return 100.0 if id(cm) not in forwarded else 0.01 * len(tokens)

    monkeypatch.setattr(timing, "timed", timed)
    cal = cal_mod.measure(dec.pair, None)
    assert cal.prefill == pytest.approx(0.01) and cal.costs.draft_prefill == pytest.approx(0.01)


def test_cpu_identity_names_the_isa():
    cpu = machine.cpu_identity()
    assert cpu["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert machine.isa_level({"flags": ["avx2"]}) == "AVX2"
    assert machine.isa_level({"flags": ["avx2", "avx512f", "avx512_bf16"]}) == "AVX-512 BF16"
    assert machine.isa_level({"flags": ["avx512f", "amx_tile"]}) == "AMX"
    line = machine.describe_cpu({"model": "X", "family": "25", "model_id": "1", "flags": ["avx2"],
                                 "torch_kernels": "AVX2", "env": {"ATEN_CPU_CAPABILITY": "avx2"}})
    assert line == "X (family 25, model 1), AVX2, PyTorch kernels AVX2, ATEN_CPU_CAPABILITY=avx2"


def test_candidate_branches_pay_like_draft_tokens():
    """Branch tokens are scored only where their expected accepted tokens beat their priced cost: none after a
    round that drafted nothing, none on a curve where a scored token costs a forward, none where the tree kernel
    is dear or the branches never yield; on a flat curve with a useful yield, the flat part."""
    from pacer.decoding import Draft

    def room(costs, yield_=None, drafted=3):
        pol = CostAwarePolicy(FixedPolicy(gamma=4), costs)
        if yield_ is not None:  # 100 branch tokens read, yield_ of each accepted
            pol.memory.branch_update(100, int(100 * yield_))
        pol.pricer.S, pol.pricer.spent = [0.9, 0.8, 0.7][:drafted], drafted * costs.draft
        return pol.pricer.branch_room(drafted)

    assert room(LINEAR) == 0
    # nothing drafted: a pool's continuation of the committed text, its yield learnt apart from the branches'
    assert room(FLAT, drafted=0) >= 8 and room(LINEAR, drafted=0) == 0
    assert room(FLAT, yield_=0.0, drafted=0) >= 8  # the yield after a draft does not price it ...
    gentle = Costs(draft=0.03, target={1: 0.3, 17: 0.348})  # a scored token costs 1% of a forward
    pol = CostAwarePolicy(FixedPolicy(gamma=4), gentle)
    assert pol.pricer.branch_room(0) >= 8
    pol.memory.pool_update(1000, 0)
    assert pol.pricer.branch_room(0) == 0  # ... its own does
    assert UNPRICED.branch_room(0) == 0  # no cost model: none where nothing was drafted
    assert room(FLAT) >= 8  # FLAT: c_t(17) is 1.1 c_t(1)
    assert room(FLAT, yield_=0.0) == 0  # branches that never yield stop being scored
    dear_tree = Costs(FLAT.draft, FLAT.target, tree={k: 2 * FLAT.target_cost(k) for k in (2, 4, 8, 17)})
    assert room(dear_tree) == 0  # a masked forward taking a kernel twice as dear
    steep_after_8 = Costs(0.03, {1: 0.3, 2: 0.3, 8: 0.31, 9: 0.6, 17: 1.2})
    assert 1 <= room(steep_after_8) <= 8 - 4  # only up to the end of the flat part (k = 4 + b <= 8)
    assert UNPRICED.branch_room(3) > 1000  # no cost model: unbounded
    d = Draft([1, 2], None, DraftState(), branches=[[3, 4, 5], [6, 7, 8]])
    ids, tree = d.tree_inputs([0], room=3, total=4)
    assert d.branches == [[3, 4, 5], [6]] and ids == [0, 1, 2, 3, 4, 5, 6]
    ids, tree = d.tree_inputs([0], room=3, total=0)
    assert d.branches == [] and tree is None
    d = Draft([1, 2], None, DraftState(), branches=[[3, 4, 5]])
    ids, tree = d.tree_inputs([0], room=3, total=4)
    assert ids == [0, 1, 2, 3, 4, 5] and tree is None  # one branch after d_γ is a chain: no tree mask
    # a long unread span (a prompt's prefill): no tree mask over it - the first branch after d_γ alone, as a chain
    long = list(range(10, 10 + Draft.TREE_PENDING + 1))
    d = Draft([1, 2], None, DraftState(), branches=[[3, 4], [6, 7], [9]], anchors=[2, 2, 0])
    ids, tree = d.tree_inputs(long, room=3)
    assert ids == [*long, 1, 2, 3, 4] and tree is None and d.branches == [[3, 4]]
    d = Draft([1, 2], None, DraftState(), branches=[[9]], anchors=[0])
    ids, tree = d.tree_inputs(long, room=3)
    assert ids == [*long, 1, 2] and tree is None and d.branches == []
    d = Draft([1, 2], None, DraftState(), branches=[[3, 4], [6, 7]])
    ids, tree = d.tree_inputs(long[: Draft.TREE_PENDING], room=3)
    assert tree is not None and d.branches == [[3, 4], [6, 7]]  # a short one keeps its tree


def test_sibling_branches_pay_like_draft_tokens():
    """A sibling of d_{i+1} yields a token with probability (S_i - S_{i+1}) * hit: scored on a flat curve, the
    likeliest first; none on a curve where a scored token costs a forward, none that never hit, none after a round
    that drafted nothing."""

    def chosen(costs, hits, S=(0.9, 0.5, 0.45)):
        pol = CostAwarePolicy(FixedPolicy(gamma=4), costs)
        pol.pricer.S, pol.pricer.spent = list(S), len(S) * costs.draft
        return pol.pricer.sibling_room(DraftState(tokens=[1] * len(S), prob=list(S)), hits)

    assert chosen(FLAT, [0.5, 0.5, 0.5]) == [1, 0, 2]  # gains 0.2, 0.05, 0.025 (S_0 = 1)
    assert chosen(LINEAR, [0.5, 0.5, 0.5]) == []
    assert chosen(FLAT, [0.0, 0.0, 0.0]) == []
    assert chosen(FLAT, [0.5, 0.5], S=()) == []
    steep_after_4 = Costs(0.03, {1: 0.3, 4: 0.3, 5: 0.45, 8: 0.9})
    assert chosen(steep_after_4, [0.5, 0.5, 0.5]) == []  # k = 4 already: one more token costs half a forward
    # no cost model: every position, likeliest first by the draft's own survival
    st = DraftState(tokens=[1, 2, 3], prob=[0.9, 0.5, 0.99])
    assert UNPRICED.sibling_room(st, [0.5, 0.5, 0.0]) == [1, 0]


def test_what_the_rule_learns_carries_over_to_the_next_generation():
    dec = decoder("same", FLAT)
    first = dec.generate(PROMPTS[0], "sd", max_new_tokens=30)
    second = dec.generate(PROMPTS[0], "sd", max_new_tokens=30)
    assert first.token_ids == second.token_ids
    (memory,) = dec.methods._cost_memory.values()
    seen = sum(g > 0 for r in (first, second) for g in r.stats.draft_lengths)  # every drafting round, both runs
    assert memory.trials[1] == 4 + seen and memory.alpha(1) == pytest.approx((2.4 + seen) / (4 + seen))
    assert second.stats.draft_lengths[1] >= first.stats.draft_lengths[1]  # [0]: the prefill's
    assert second.extra["cost_aware"]["alpha"] > first.extra["cost_aware"]["alpha"]
    # a method with other drafter options (a bench's variants) learns apart: its branches are another drafter's
    dec.generate(PROMPTS[0], "ouroboros", max_new_tokens=4, options={"candidates": 1})
    dec.generate(PROMPTS[0], "ouroboros", max_new_tokens=4, options={"candidates": 3})
    assert len(dec.methods._cost_memory) == 3
    dec.generate(PROMPTS[0], "ouroboros", max_new_tokens=4, options={"candidates": 3, "draft_vocab": dec.draft_vocab})
    assert len(dec.methods._cost_memory) == 3  # the same rows: the same memory


def test_per_position_acceptance_counts_only_the_positions_that_were_reached():
    m = CostMemory(alpha=0.5, prior=2.0)
    m.update([None] * 4, drafted=4, accepted=1)  # d_1 accepted, d_2 rejected, d_3 and d_4 not reached
    assert m.trials[1:5] == [3.0, 3.0, 2.0, 2.0] and m.hits[1:5] == [2.0, 1.0, 1.0, 1.0]
    for _ in range(50):  # a rule that always drafts 1 token, always accepted: position 2 is never seen
        m.update([None], drafted=1, accepted=1)
    assert m.alpha(1) > 0.95
    assert m.alpha(3) == pytest.approx(m.alpha(2))  # never reached: α_3 leans on α_2 entirely
    assert m.alpha(2) > 0.5  # leans on α_1, not stuck at the 0.5 prior


def test_a_literal_rule_keeps_its_length_and_its_extras_are_priced():
    """A fixed γ or a threshold decides the length alone (even where the cost rule would draft nothing), while the
    branches and phrases an Ouroboros drafter adds are priced on the decoder's costs: none on a curve where a
    scored token costs a forward, the same as under the cost rule on a flat one; ``cost_aware=False`` opts out, and
    a method that adds nothing priced (``sd``) is left as it is. The literal rule is not wrapped: its pricer
    learns the round from the drafter's handshake (fails where the handshake does not tell the pricer what was
    drafted: the round's survivals and seconds stay empty)."""
    from pacer import methods
    from pacer.cli import cost_note
    from pacer.decoding.drafter import Proposal
    from pacer.drafters.pool import clear_shared_pools
    from pacer.pricing import token_seconds

    steep = Costs(LINEAR.draft, LINEAR.target, draft_curve={1: 0.135, 2: 0.27, 8: 1.08})  # c_d(k) ∝ k too
    for costs in (steep, FLAT):
        dec = decoder("close", costs)
        pol = dec.make_policy("ouroboros", gamma=4)
        assert type(pol) is FixedPolicy
        pricer = dec.pricer_of(pol)
        assert pricer.priced
        pricer.begin(True)
        p = Proposal(pol, 16, pricer=pricer)
        for n in range(4):  # γ = 4 drafted whatever the costs
            assert p.ask()
            p.state.tokens.append(n)
        assert not p.ask()
        assert len(pricer.S) == 4 - pol.min_draft and pricer.S[-1] < 1.0  # its survivals, as the handshake said
        assert pricer.spent == pytest.approx(4 * token_seconds(pricer.costs))
        assert (pricer.branch_room(4) == 0) == (costs is steep)
        assert (pricer.phrase_room(1, [0.9] * 4) == 0) == (costs is steep)
        assert methods.get("pacer+ouroboros").extras and not methods.get("pacer").extras
        assert isinstance(dec.make_policy("sd", gamma=4), FixedPolicy)
        assert dec.pricer_of(dec.make_policy("sd", gamma=4)) is UNPRICED
        assert isinstance(dec.make_policy("ouroboros", gamma=4, cost_aware=False), FixedPolicy)
        assert dec.pricer_of(dec.make_policy("ouroboros", gamma=4, cost_aware=False)) is UNPRICED
        assert isinstance(dec.make_policy("ouroboros", gamma=4, cost_aware=True).inner, FixedPolicy)
    # end to end: on the steep curves every round drafts γ and no branch is scored (unpriced, the same pool would
    # have some); on FLAT branches are
    for costs, branched in ((steep, False), (FLAT, True)):
        dec = decoder("close", costs)
        ids = dec.encode("abc abc abc abc abc")
        ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
        for aware in (None, False):
            clear_shared_pools()
            rounds = 0
            for _ in range(2):  # the second finds the first's output in the (warm) pool
                res = dec.generate(ids, "ouroboros", max_new_tokens=30, gamma=4, options={"candidates": 2},
                                   cost_aware=aware)
                assert res.token_ids == ar
                assert res.stats.draft_lengths[1] >= 4  # γ drafted (plus an accepted branch) after the prefill
                rounds += res.extra["drafter"]["candidate_rounds"]
                if aware is None:  # what the CLI says of it
                    assert res.extra["cost_aware"]["length"] is False
                    # the loop told the pricer every verified round (not the policy: a literal rule is not wrapped)
                    assert res.extra["cost_aware"]["rounds"] == res.stats.rounds - 1
                    assert "length is the literal rule's" in cost_note(res.extra["cost_aware"])
                else:
                    assert "cost_aware" not in res.extra
            assert (rounds > 0) == (branched or aware is False), (costs, aware)


def test_a_token_that_came_with_a_phrase_costs_no_draft_forward():
    S = [0.9, 0.8, 0.7]
    dear = Costs(draft=0.3, target=FLAT.target)  # a draft token as dear as a target forward
    assert not gain_pays(S, 0.6, dear)
    assert gain_pays(S, 0.6, dear, free=True)  # only its (nearly free) place in the verification
    # what was really spent on the round counts: three free phrase tokens leave the round cheaper
    assert gain_pays(S, 0.5, FLAT, spent=0.0) and not gain_pays(S, 0.5, Costs(0.3, FLAT.target), spent=0.9)


# ------------------------------------------------------------------------------------ the draft's catch-up
def test_catch_up_pays_against_what_the_remaining_tokens_save():
    """The draft's one-time catch-up (``catch_up`` tokens at ``c_pre`` each) must be repaid by what drafting saves
    over the tokens still to come: monotone in both, and not counted when either is unknown or free."""
    c = Costs(draft=0.03, target={1: 0.3, 2: 0.3, 8: 0.31}, draft_prefill=0.05)
    # one-token rounds with S_1 = 0.8 save 0.3 - 0.33 / 1.8 = 0.117 s a token: 100 tokens repay 0.05 * 233 s
    assert catch_up_pays(0.8, c, 200, 100) and not catch_up_pays(0.8, c, 260, 100)
    assert all(catch_up_pays(0.8, c, k, 100) >= catch_up_pays(0.8, c, k + 10, 100) for k in range(0, 400, 10))
    assert all(catch_up_pays(0.8, c, 200, r) <= catch_up_pays(0.8, c, 200, r + 5) for r in range(5, 300, 5))
    assert catch_up_pays(0.8, c, 10_000, 0)  # remaining unknown
    assert catch_up_pays(0.8, Costs(0.03, {1: 0.3, 2: 0.3}), 10_000, 10)  # no prefill cost measured
    assert not catch_up_pays(0.05, c, 1, 1000)  # nothing saved per token: never


def test_a_short_generation_after_a_long_prompt_does_not_pay_for_the_drafts_prefill():
    """With a draft prefill as dear as a target forward, a 16-token prompt is not worth catching up for 6 tokens
    (every round a plain decoding step, the draft never runs), but is for 60; the output is exact either way."""
    prompt = "def f(x):\n    ret"
    costs = Costs(draft=0.01, target={1: 1.0, 64: 1.0}, draft_prefill=1.0)
    dec = decoder("same", costs)
    for new, drafts in ((6, False), (60, True)):
        ar = dec.generate(prompt, "ar", max_new_tokens=new)
        res = dec.generate(prompt, "sd", max_new_tokens=new)
        assert res.token_ids == ar.token_ids
        assert (res.stats.draft_forwards > 0) == drafts, (new, res.stats.draft_lengths)
    free = decoder("same", Costs(draft=0.01, target={1: 1.0, 64: 1.0}))
    assert free.generate(prompt, "sd", max_new_tokens=6).stats.draft_forwards > 0


def test_phrases_pay_like_draft_tokens():
    """A phrase check is priced on the draft's curve: none where the longer forward costs more than the draft
    forwards the phrase is expected to save, the length with the best expected saving otherwise; no cost model:
    any length."""
    steep = Costs(0.036, {1: 0.25, 8: 0.26}, draft_curve={1: 0.036, 2: 0.041, 4: 0.047, 8: 0.2})
    pol = CostAwarePolicy(FixedPolicy(gamma=4), steep)
    assert pol.pricer.phrase_room(1, [0.9] * 6) == 3  # to k = 4: the curve is flat there, dear beyond
    assert pol.pricer.phrase_room(1, [0.1] * 6) == 0  # the draft rarely agrees: the longer forward does not pay
    flat = CostAwarePolicy(FixedPolicy(gamma=4), Costs(0.036, {1: 0.25, 8: 0.26}))  # no draft curve: c_d at any k
    assert flat.pricer.phrase_room(1, [0.1] * 6) == 6
    assert UNPRICED.phrase_room(1, [0.01] * 5) == 5
    assert Costs.from_dict(steep.to_dict()).draft_cost(3) == pytest.approx(0.044)


def test_a_calibration_cache_with_unusable_values_is_measured_again(tmp_path, monkeypatch):
    """Edited values with a recomputed checksum (a NaN draft, a negative target cost) are not trusted."""
    import pacer.calibration as cal_mod

    monkeypatch.setenv("PACER_HOME", str(tmp_path))
    key = {"format": cal_mod.FORMAT, "test": 1}
    good = cal_mod.Calibration(Costs(0.03, {1: 0.3, 2: 0.31}), 0.01, key)
    cal_mod.save(good)
    assert cal_mod.load(key)[0] is not None
    for costs in (Costs(float("nan"), {1: 0.3}), Costs(0.03, {1: 0.3, 2: -5.0}), Costs(0.03, {1: 0.3},
                                                                                         draft_prefill=-1.0)):
        cal_mod.save(cal_mod.Calibration(costs, 0.01, key))
        cal, why = cal_mod.load(key)
        assert cal is None and "unusable" in why


def test_gain_pays_prices_the_round_at_the_tokens_it_scores_on_a_sloped_curve():
    """A round that drafted ``n`` tokens scores ``n + 1``: pricing it with ``c_t(n)`` would draft on where the
    curve turns steep (here the third token would look nearly free)."""
    sloped = Costs(draft=0.1, target={1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0, 5: 3.0})
    assert gain_pays([0.9], 0.8, sloped)  # c_t(3) - c_t(2) = 0: a second token pays
    assert not gain_pays([0.9, 0.8], 0.7, sloped)  # the third makes it score 4: one more forward's worth
    E, T, dT = 2.7, 2 * 0.1 + 1.0, 0.1 + 2.0 - 1.0  # by hand: S_3 T < E dT
    assert 0.7 * T < E * dT


def test_the_cost_rule_decides_on_the_monotone_curve():
    """A measured c_t(2) < c_t(1) (a slower one-row kernel) must not make a hopeless first token look free."""
    dip = Costs(draft=0.03, target={1: 0.3, 2: 0.2, 4: 0.3, 8: 0.32})
    pol = CostAwarePolicy(FixedPolicy(gamma=4, min_draft=0), dip, refine=0.0, memory=CostMemory(alpha=0.05))
    assert pol.costs.target[1] == pol.costs.target[2] == pytest.approx(0.25)
    assert not pol.should_continue(DraftState())  # on the raw curve c_t(2) - c_t(1) < 0 would say "go"
    hopeful = CostAwarePolicy(FixedPolicy(gamma=4, min_draft=0), dip, refine=0.0, memory=CostMemory(alpha=0.9))
    assert hopeful.should_continue(DraftState())


def test_cpu_identity_reports_the_isa_flags_of_this_cpu():
    """The calibration key tells machines apart by their ISA flags: they must be read, not left empty."""
    from pathlib import Path

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    line = next((ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("flags", "Features")), "")
    present = set(line.partition(":")[2].split())
    want = [f for f in machine.ISA_FLAGS if f in present]
    if not want:
        pytest.skip("this CPU has none of the ISA flags pacer keys on")
    assert machine.cpu_identity()["flags"] == want


# --------------------------------------------------------------------------------------------- the regime line
def fixed(costs: Costs, alpha: float, n: int) -> float:
    """The speedup of drafting ``n`` tokens a round at a constant per-token acceptance ``alpha``."""
    return sum(alpha**i for i in range(n + 1)) / (n * costs.draft + costs.target_cost(n + 1)) * costs.target_cost(1)


def best_fixed(costs: Costs, alpha: float, max_draft: int = 16) -> tuple[int, float]:
    """The best constant draft length at a constant per-token acceptance, by brute force over every length."""
    n = max(range(max_draft + 1), key=lambda n: fixed(costs, alpha, n))
    return n, fixed(costs, alpha, n)


@pytest.mark.parametrize("costs", [FLAT, LINEAR, Costs(0.3, {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})],
                         ids=["flat", "linear", "growing"])
@pytest.mark.parametrize("alpha", [0.5, 0.75, 0.9])
def test_the_rules_prediction_is_the_best_length_at_a_constant_acceptance(costs, alpha):
    """Token by token, the rule stops where the best constant length does (a geometric acceptance has one peak)."""
    from pacer.pricing import predicted_round

    n, speedup = predicted_round(costs, alpha)
    assert speedup == pytest.approx(best_fixed(costs, alpha)[1]) == pytest.approx(fixed(costs, alpha, n))


def test_the_prediction_on_flat_and_steep_curves():
    from pacer.pricing import predicted_round

    assert predicted_round(LINEAR) == (0, 1.0)  # every round a plain decoding step
    n, speedup = predicted_round(FLAT)
    assert n >= 4 and speedup > 2.0


def test_the_typical_acceptance_is_the_default_pairs():
    """The shipped layer's validation report: a constant acceptance of ``TYPICAL_ACCEPTANCE`` gives what its best
    fixed draft length yields a round on its held-out rounds."""
    from pacer.policies.learned import default_checkpoint
    from pacer.pricing import TYPICAL_ACCEPTANCE

    cfg = json.loads((default_checkpoint("pacer") / "config.json").read_text())
    costs, v = Costs.from_dict(cfg["costs"]), cfg["validation"]
    g = v["best_fixed_gamma"]
    tokens = v["best_fixed_predicted_speedup"] * (g * costs.draft + costs.target_cost(g + 1)) / costs.target_cost(1)
    assert sum(TYPICAL_ACCEPTANCE**i for i in range(g + 1)) == pytest.approx(tokens, rel=0.01)


def test_the_regime_line_says_what_to_expect_from_the_measured_curve():
    from pacer.pricing import TYPICAL_ACCEPTANCE

    flat = cal_mod.regime(FLAT, "transformers", "bfloat16")
    n, speedup = best_fixed(FLAT, TYPICAL_ACCEPTANCE)
    assert flat.startswith("regime: verification nearly free on transformers bfloat16 (c_t(8) = 1.03 c_t(1))")
    assert f"drafting pays - expect about {speedup:.1f}x over plain decoding" in flat and f"{n} draft tokens" in flat
    assert "plainly" not in flat and "llama.cpp" not in flat

    steep = cal_mod.regime(LINEAR, "transformers", "bfloat16")
    assert steep.startswith("regime: verification not free on transformers bfloat16 (c_t(8) = 6.77 c_t(1))")
    assert "pacer decodes plainly here - expect about 1.0x" in steep and "pays" not in steep
    assert steep.endswith("llamacpp's plain decoding (--backend llamacpp) is your fastest path")
    on_llama = cal_mod.regime(LINEAR, "llamacpp", "Q4_K_M")
    assert "decodes plainly" in on_llama and "--backend llamacpp" not in on_llama

    # nearly flat, but the draft as dear as the target: the prediction, not the curve alone, decides
    dear = cal_mod.regime(Costs(draft=0.9, target={1: 1.0, 8: 1.1}), "transformers", "bfloat16")
    assert "verification nearly free" in dear and "decodes plainly" in dear and "a draft token costs 0.90" in dear
    # growing, yet short drafts pay
    grows = cal_mod.regime(Costs(0.3, {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}), "transformers", "bfloat16")
    assert "verification not free" in grows and "short drafts pay" in grows and "1 draft token a round" in grows


def test_the_curve_sentence_never_contradicts_the_regime():
    """``pacer calibrate`` prints the curve's sentence and the regime line one under the other: the sentence never
    says drafting pays (only the regime, which weighs the draft's cost too, says that), and where the curve alone
    rules drafting out the regime decodes plainly. The float32 case: c_t(8) = 1.8 c_t(1) with a draft token at
    0.28 of a target forward, a curve that looks cheap and a regime where nothing pays."""
    cases = [Costs(0.01, {1: 1.0, 8: 1.05}), Costs(0.28, {1: 1.0, 8: 1.81}), Costs(0.05, {1: 1.0, 8: 3.0}),
             Costs(0.05, {1: 1.0, 8: 6.0})]
    for c in cases:
        sentence = cal_mod.Calibration(c).verdict()
        line = cal_mod.regime(c, "transformers", "float32")
        assert "drafting pays" not in sentence, sentence
        if "cannot pay" in sentence:
            assert "decodes plainly" in line, (sentence, line)
    assert "nearly free" not in cal_mod.Calibration(cases[1]).verdict()  # 1.81 is past FREE_GROWTH

"""pacer's vLLM proposer without vLLM: prefix keying, per-row acceptance, the batch length rule, the n-gram lookup,
and the ``propose`` contract driven the way vLLM's model runner drives it (tests/test_vllm_engine.py runs it in
vLLM's real engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pacer.costs import Costs
from pacer.decoding.meter import TARGET, Call
from pacer.drafters.lookup import KEY_CONFIDENCE
from pacer.drafters.pool import PhrasePool, learn_committed
from pacer.errors import PacerError
from pacer.integrations.vllm import (
    DEFAULT_COSTS,
    PacerPlanner,
    PacerProposer,
    RowMemory,
    RowState,
    load_costs,
    lookup_draft,
    observed_acceptance,
    prefix_key,
    prefix_keys,
    survival,
)
from pacer.pricing import CostMemory, batch_lengths, gain_pays
from pacer.profiles import Profile

#: verification nearly free / growing like k (a CPU: nothing pays) / in between
FLAT = Costs(draft=0.0, target={1: 1.0, 64: 1.0})
LINEAR = Costs(draft=0.0, target={1: 1.0, 2: 2.0, 64: 64.0})
SLOPE = Costs(draft=0.0, target={1: 1.0, 65: 1.0 + 64 * 0.1})


def test_importing_the_integration_imports_no_vllm():
    code = "import sys, pacer, pacer.integrations.vllm; sys.exit('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_prefix_key_is_the_text_whatever_its_container():
    a = [5, 6, 7, 8]
    assert prefix_key(a) == prefix_key(np.array(a, dtype=np.int32)) == prefix_key(tuple(a))
    assert prefix_key(a) != prefix_key(a[:3]) and prefix_key(a) != prefix_key([5, 6, 7, 9])


def test_prefix_keys_hash_both_prefixes_in_one_pass():
    a = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int32)
    assert prefix_keys(a, 3) == (prefix_key(a[:5]), prefix_key(a))


def test_the_pool_learns_the_text_as_learn_committed_does():
    """The planner reads only each step's new tokens (and the n-gram context before them)."""
    planner = PacerPlanner(4, FLAT, ngram=3, key_len=2)
    ref = PhrasePool(3, 1 << 16, 2)
    text, seen = [1, 2, 3, 4, 5], 0
    rng = np.random.default_rng(0)
    for _ in range(12):
        new = rng.integers(0, 6, size=int(rng.integers(1, 4))).tolist()
        text = text + new
        planner.step([(np.array(text, dtype=np.int32), new)])
        seen = learn_committed(ref, text, seen, ref.add_sequence)
    (state,) = [s for states in planner.rows.states.values() for s in states]
    assert list(state.pool.entries) == list(ref.entries) and state.seen == len(text)


def test_row_memory_finds_a_row_by_its_previous_prefix_and_keeps_identical_texts_apart():
    rows = RowMemory()
    s1, s2 = RowState(PhrasePool()), RowState(PhrasePool())
    rows.put(prefix_key([1, 2, 3]), s1)
    rows.put(prefix_key([1, 2, 3]), s2)
    assert len(rows) == 2
    got = {id(rows.take(prefix_key([1, 2, 3]))), id(rows.take(prefix_key([1, 2, 3])))}
    assert got == {id(s1), id(s2)} and rows.take(prefix_key([1, 2, 3])) is None and len(rows) == 0
    # idle states are dropped, fresh ones kept
    old, new = RowState(PhrasePool(), last_call=1), RowState(PhrasePool(), last_call=100)
    rows = RowMemory(max_idle=10)
    rows.put(prefix_key([1]), old)
    rows.put(prefix_key([2]), new)
    rows.evict(105)
    assert rows.take(prefix_key([1])) is None and rows.take(prefix_key([2])) is new


def test_observed_acceptance():
    d = [10, 11, 12, 13]
    assert observed_acceptance(d, [10, 11, 99]) == (4, 2)  # rejected at d_3
    assert observed_acceptance(d, [99]) == (4, 0)
    assert observed_acceptance(d, [10, 11, 12, 13, 7]) == (4, 4)  # all accepted, then the bonus token
    assert observed_acceptance(d, [10, 11, 12]) == (2, 2)  # the scheduler verified only 2: d_3 was not checked
    assert observed_acceptance([], [5]) == (0, 0)


def test_acceptance_is_learned_per_row():
    st = RowState(PhrasePool())
    st.draft, st.raw = [1, 2, 3], [0.9, 0.8, 0.7]
    assert st.observe([1, 2, 9]) == (3, 2)
    assert (st.drafted, st.accepted, st.draft) == (3, 2, [])
    assert st.memory.calibrator.observations == 3
    other = RowState(PhrasePool())
    assert other.memory.calibrator.observations == 0


def test_lookup_draft_chains_continuations_with_the_key_confidence():
    pool = PhrasePool(ngram=4, capacity=1000, key_len=3)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    pool.add_sequence(text, "prompt")
    tokens, conf = lookup_draft(pool, text, 6)
    assert tokens == [4, 5, 6, 7, 8, 1]
    assert conf == [KEY_CONFIDENCE[3]] * 6
    assert lookup_draft(pool, [42], 4) == ([], [])
    assert lookup_draft(pool, text, 2)[0] == [4, 5]


def test_survival_is_the_calibrated_product_and_never_rises():
    raw, S = survival(CostMemory(), [0.8, 0.5, 0.9])
    assert raw == pytest.approx([0.8, 0.4, 0.36])
    assert S == pytest.approx(raw)  # an untrained calibrator trusts the raw score
    assert all(b <= a for a, b in zip(S, S[1:], strict=False))
    m = CostMemory()
    for _ in range(50):  # this row's tokens at raw 0.8 are always rejected
        m.update([0.8], 1, 0)
    assert survival(m, [0.8])[1][0] < 0.1


def test_allocate_is_gain_pays_for_one_row():
    S = [0.9, 0.8, 0.5, 0.3, 0.1]
    for costs in (FLAT, LINEAR, SLOPE, DEFAULT_COSTS):
        n = 0
        while n < len(S) and gain_pays(S[:n], S[n], costs, spent=0.0, free=True):
            n += 1
        assert batch_lengths([S], costs) == [n]
    assert batch_lengths([S], FLAT) == [5]
    assert batch_lengths([S], LINEAR) == [0]  # verification costs a forward per token: no draft pays


def test_allocate_gives_rows_different_lengths_in_one_step():
    rows = [[0.95, 0.9, 0.85, 0.8], [0.4, 0.2], [], [0.9, 0.3, 0.05]]
    lengths = batch_lengths(rows, SLOPE)
    assert lengths[2] == 0 and len(set(lengths)) > 2
    assert lengths[0] > lengths[1] and lengths[0] >= lengths[3]
    assert batch_lengths(rows, FLAT) == [4, 2, 0, 3]
    assert batch_lengths(rows, LINEAR) == [0, 0, 0, 0]
    # more rows decoding in the forward: each draft token competes with a larger batch's rate
    assert sum(batch_lengths(rows, SLOPE, decoding=16)) <= sum(lengths)


def test_load_costs():
    assert load_costs(None)[0] is DEFAULT_COSTS
    assert load_costs(SLOPE)[0] is SLOPE
    c, _ = load_costs({"target": {"1": 0.01, "8": 0.02}, "draft": 0.001})
    assert c.target == {1: 0.01, 8: 0.02} and c.draft == 0.001
    c, _ = load_costs({"name": "x", "costs": {"target": {"1": 0.5}}})
    assert c.target == {1: 0.5} and c.draft == 0.0
    with pytest.raises(PacerError, match="'name' is missing"):
        load_costs({"format": "pacer-profile/1", "costs": {"target": {"1": 0.5}}})
    c, _ = load_costs({"format": "pacer-calibration/2", "payload": {"costs": {"draft": 0.2, "target": {"1": 0.5}}}})
    assert c.target == {1: 0.5} and c.draft == 0.2  # pacer's calibration cache file
    with pytest.raises(PacerError, match="target"):
        load_costs({"draft": 0.1})
    with pytest.raises(PacerError, match=r"'target'\['1'\] is 0.0 \(want a number of seconds > 0 and <= 10000\)"):
        load_costs({"target": {"1": 0.0}})


BAD_NUMBERS = [float("nan"), float("inf"), float("-inf"), -0.5, 1e308, "0.5", True, None, [0.5], {"a": 1}]


@pytest.mark.parametrize("costs", [
    *({"target": {"1": 1.0, "8": v}} for v in [*BAD_NUMBERS, 0]),
    *({"target": {"1": 1.0}, field: v} for field in ("draft", "policy_per_check", "draft_prefill")
      for v in BAD_NUMBERS if v is not None),
    *({"target": {"1": 1.0}, field: {"2": v}} for field in ("tree", "draft_curve") for v in [*BAD_NUMBERS, 0]),
    *({"target": {"1": 1.0}, field: v} for field in ("tree", "draft_curve") for v in ("x", [1.0], 3)),
    {"target": {}}, {"target": []}, {"target": "fast"}, {"target": None}, {"target": {"0": 1.0}},
    {"target": {"-1": 1.0}}, {"target": {"x": 1.0}}, {"target": {"1.5": 1.0}},
    {"target": {"1": 1.0}, "targte": {"1": 1.0}}, {"costs": {"target": {"1": float("nan")}}},
    {"payload": {"costs": {"target": {"1": 1.0, "4": -2.0}}}},
], ids=lambda c: json.dumps(c)[:40])
def test_plain_costs_with_any_unusable_field_are_refused_in_one_line(tmp_path, costs):
    """NaN, infinite, negative or zero costs, a cost of the wrong type, an empty curve or an unknown field: refused
    when the proposer is built, naming the file and the field (a NaN target cost once switched speculation off
    without a word: every draft token then 'did not pay')."""
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    for given in (str(path), costs):
        with pytest.raises(PacerError) as e:
            load_costs(given)
        assert "\n" not in str(e.value) and "cost profile" in str(e.value)
    assert str(path) in str(pytest.raises(PacerError, load_costs, str(path)).value)
    with pytest.raises(PacerError):
        PacerProposer(_config(extra={"pacer": {"profile": str(path)}}))


def test_given_costs_objects_are_checked_too():
    with pytest.raises(PacerError, match="is NaN"):
        load_costs(Costs(draft=0.0, target={1: 1.0, 8: float("nan")}))
    with pytest.raises(PacerError, match="unusable"):
        load_costs(Profile("p", {}, "transformers", "", {}, None, {32: {}}, {}))  # a context row left empty
    for bad in (Costs(draft=0.0, target={1: 1.0, 8: -1.0}), Profile("p", {}, "transformers", "", {}, None, {32: {}},
                                                                        {})):
        with pytest.raises(PacerError):
            PacerPlanner(4, bad)  # the planner built directly checks them too


def test_load_costs_from_a_file(tmp_path):
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"target": {"1": 0.02, "16": 0.04}}))
    c, source = load_costs(str(p))
    assert c.target_cost(16) == 0.04 and source == str(p)
    with pytest.raises(PacerError, match="cannot read"):
        load_costs(tmp_path / "missing.json")


def test_a_pacer_profile_is_priced_at_the_batch_context():
    path = Path(__file__).resolve().parent.parent / "docs" / "profiles" / "zen4-avx512bf16-transformers-bf16.json"
    profile, source = load_costs(str(path))
    assert isinstance(profile, Profile) and str(path) in source
    planner = PacerPlanner(4, profile)
    short, long = planner.curve.costs(20), planner.curve.costs(2000)  # priced at 32 and 2016 tokens of context
    ref = profile.costs(32).monotone()
    assert [short.target_cost(k) for k in (1, 2, 4, 8, 16)] == pytest.approx([ref.target_cost(k) for k in
                                                                               (1, 2, 4, 8, 16)])
    # a batch's forward beyond the measured k: as the profile prices it, made non-decreasing in k
    assert short.target_cost(64) == pytest.approx(profile.price(Call(TARGET, 64, 32, False, 0.0)))
    assert all(short.target_cost(k) <= short.target_cost(k + 1) for k in range(1, 4096))
    assert long.target_cost(1) != short.target_cost(1)
    assert planner.curve.costs(2000) is long  # cached
    # the step logs the context it priced at
    planner.step([(np.arange(40) % 7, [3])])
    assert planner.last.context == 40


def _config(k=6, max_len=256, extra=None):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_len),
                           scheduler_config=SimpleNamespace(max_num_seqs=8),
                           additional_config=extra or {})


def _target(seq: list[int], salt: int) -> int:
    """A greedy 'target' whose next token depends on the last two: its output soon repeats."""
    return (seq[-1] * 7 + seq[-2] * 3 + salt) % 11


def _run(proposer: PacerProposer, prompts: list[list[int]], salts: list[int], max_new: int = 60):
    """Drive ``propose`` as vLLM's model runner does (token_ids_cpu / num_tokens_no_spec / sampled_token_ids,
    bookkeeping before proposing) with greedy verification; returns the outputs and each step's draft lengths."""
    n, max_len = len(prompts), proposer.planner.max_len
    ids = np.zeros((8, max_len), dtype=np.int32)
    num = np.zeros(8, dtype=np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
        num[i] = len(p)
    drafts: list[list[int]] = [[] for _ in range(n)]
    out: list[list[int]] = [[] for _ in range(n)]
    steps = []
    while min(len(o) for o in out) < max_new:
        sampled = []
        for i in range(n):
            seq = ids[i, : num[i]].tolist()
            got = []
            for d in drafts[i]:  # verify: accept while the draft is the target's greedy token
                t = _target(seq + got, salts[i])
                if t != d:
                    break
                got.append(d)
            got.append(_target(seq + got, salts[i]))
            ids[i, num[i] : num[i] + len(got)] = got
            num[i] += len(got)
            out[i] += got
            sampled.append(got)
        drafts = proposer.propose(sampled, num, ids)
        assert len(drafts) == n and all(len(d) <= proposer.k for d in drafts)
        steps.append([len(d) for d in drafts])
    return [o[:max_new] for o in out], steps


def _plain(prompt: list[int], salt: int, max_new: int) -> list[int]:
    seq = list(prompt)
    for _ in range(max_new):
        seq.append(_target(seq, salt))
    return seq[len(prompt) :]


def test_propose_follows_rows_across_steps_learns_and_drafts_ragged(tmp_path):
    log = tmp_path / "steps.jsonl"
    proposer = PacerProposer(_config(extra={"pacer": {"profile": {"target": {"1": 1.0, "65": 7.4}},
                                                      "log": str(log)}}))
    prompts, salts = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 3]], [1, 2, 1]  # rows 0 and 2: the same text
    out, steps = _run(proposer, prompts, salts)
    assert out == [_plain(p, s, 60) for p, s in zip(prompts, salts, strict=True)]
    assert any(len(set(s)) > 1 for s in steps)  # rows got different lengths in one step
    assert any(max(s) > 0 for s in steps)
    assert len(proposer.planner.rows) == 3  # one state per row, the twins kept apart, none leaked
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == len(steps) and lines[-1]["lengths"] == steps[-1]
    verified = sum(v or 0 for x in lines for v in x["verified"])
    accepted = sum(a or 0 for x in lines for a in x["accepted"])
    assert verified > 0 and 0 < accepted <= verified


def test_propose_drafts_nothing_where_verification_costs_a_forward_per_token(monkeypatch):
    monkeypatch.setenv("PACER_VLLM_PROFILE", "")
    proposer = PacerProposer(_config(extra={"pacer": {"profile": LINEAR.to_dict()}}))
    _, steps = _run(proposer, [[1, 2, 3], [4, 5, 6, 7]], [1, 2], max_new=30)
    assert all(max(s) == 0 for s in steps)


def test_propose_skips_prefilling_rows_and_stops_at_the_model_length():
    proposer = PacerProposer(_config(k=8, max_len=16, extra={"pacer": {"profile": FLAT.to_dict()}}))
    ids = np.zeros((4, 16), dtype=np.int32)
    text = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    ids[0, :12] = text
    ids[1, :12] = text
    num = np.array([12, 12, 0, 0], dtype=np.int32)
    out = proposer.propose([[3], []], num, ids)
    assert out[1] == [] and 0 < len(out[0]) <= 16 - 12 - 1
    assert out[0] == [1, 2, 3][: len(out[0])]


def test_settings_are_checked_and_the_environment_wins(tmp_path, monkeypatch):
    with pytest.raises(PacerError, match="unknown settings"):
        PacerProposer(_config(extra={"pacer": {"gamma": 3}}))
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"target": {"1": 2.0, "2": 4.0}}))
    monkeypatch.setenv("PACER_VLLM_PROFILE", str(p))
    proposer = PacerProposer(_config(extra={"pacer": {"profile": FLAT.to_dict()}}))
    assert proposer.planner.costs.target == {1: 2.0, 2: 4.0}


BAD_COUNTS = [0, -1, 3.7, "8", "four", True, None, [8], {"n": 8}, float("nan")]


def _bad_settings(tmp_path) -> list[tuple[str, dict, dict]]:
    """(setting named in the message, additional_config['pacer'], other parts of vllm_config) for every setting
    with every kind of bad value."""
    cases = [(name, {name: v}, {}) for name in ("ngram", "key_len", "max_idle") for v in BAD_COUNTS]
    cases += [("num_speculative_tokens", {}, {"k": v}) for v in BAD_COUNTS]
    cases += [("max_model_len", {}, {"max_len": v}) for v in BAD_COUNTS if v is not None]
    cases += [("max_num_seqs", {}, {"max_seqs": v}) for v in BAD_COUNTS if v is not None]
    (tmp_path / "a-file").write_text("")
    cases += [("log", {"log": v}, {}) for v in (3, ["x"], {"a": 1}, True, str(tmp_path),
                                                 str(tmp_path / "no-such-folder" / "steps.jsonl"),
                                                 str(tmp_path / "a-file" / "steps.jsonl"), "/proc/steps.jsonl")]
    cases += [("profile", {"profile": v}, {}) for v in (3, ["x"], str(tmp_path / "missing.json"), {"x": 1},
                                                         {"target": {"1": float("nan")}})]
    cases += [("pacer", {}, {"pacer": v}) for v in ("ngram=4", [1], 3)]
    return cases


def test_every_setting_is_checked_when_the_proposer_is_built(tmp_path):
    """A setting of the wrong type or range (once converted with a bare ``int()``, or checked at the first engine
    step, where an exception stops vLLM's engine at its first request): refused when vLLM builds the proposer, in
    one line naming the setting; nothing is left on disk."""
    for name, mine, other in _bad_settings(tmp_path):
        cfg = _config(k=other.get("k", 6), max_len=other.get("max_len", 256),
                      extra={"pacer": other["pacer"]} if "pacer" in other else {"pacer": mine})
        if "max_seqs" in other:
            cfg.scheduler_config.max_num_seqs = other["max_seqs"]
        with pytest.raises(PacerError) as e:
            PacerProposer(cfg)
            pytest.fail(f"{name}: {mine or other} accepted")
        msg = str(e.value)
        assert "\n" not in msg and name in msg, (mine, other, msg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_log_that_fails_later_is_said_once_and_the_engine_goes_on(tmp_path, caplog):
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "steps.jsonl"
    proposer = PacerProposer(_config(extra={"pacer": {"log": str(log), "profile": FLAT.to_dict()}}))
    assert not log.exists()  # checked, not left behind before the first step
    out, _ = _run(proposer, [[1, 2, 3]], [1], max_new=5)
    assert log.exists() and len(log.read_text().splitlines()) >= 1
    log.unlink()
    folder.rmdir()  # the folder goes away while the engine runs
    out, _ = _run(proposer, [[1, 2, 3]], [1], max_new=20)
    assert out == [_plain([1, 2, 3], 1, 20)] and proposer.log_path is None
    assert sum("cannot write the step log" in r.getMessage() for r in caplog.records) == 1


def test_planner_refuses_a_zero_k():
    with pytest.raises(PacerError):
        PacerPlanner(0)

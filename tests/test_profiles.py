"""Cost profiles and the profile clock: the clock's arithmetic, context and tree pricing, every call kind
priced (a missing one fails), another pair or backend refused in one line, the files round-trip and damaged ones are
refused, and on a fake backend whose forwards take the profile's times the clock reproduces the wall time."""

from __future__ import annotations

import json
import math
import time

import pytest

from pacer.decoding import Output, speculative_generate
from pacer.decoding.meter import DRAFT, TARGET, Call, MeteredBackend
from pacer.decoding.stats import GenerationStats
from pacer.drafters import TokenDrafter
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.errors import PacerError
from pacer.policies import FixedPolicy
from pacer.profiles import FORMAT, Profile, clock, default_name, doubtful_prefills
from pacer.sampling import SamplingConfig
from test_backend import FakeBackend

PAIR_T = {"fingerprint": "t" * 64, "dtype": "bfloat16"}
PAIR_D = {"fingerprint": "d" * 64, "dtype": "bfloat16", "rows": 32768}


def synthetic(**kw) -> Profile:
    """c_t(k) = 0.1 + 0.01 k at context 0..32, twice that at 1032; tree +50%; draft 0.02 + 0.005 (k - 1)."""
    args = dict(
        name="synthetic", machine={"describe": "a test machine", "threads": 2, "cpu": {"family": "25",
                                                                                      "model_id": "17",
                                                                                      "model": "AMD EPYC",
                                                                                      "flags": ["avx512_bf16"]}},
        backend="transformers", runtime="torch", target=dict(PAIR_T), draft=dict(PAIR_D),
        target_cost={32: {k: 0.1 + 0.01 * k for k in (1, 2, 4, 8)},
                     1032: {k: 2 * (0.1 + 0.01 * k) for k in (1, 2, 4, 8)}},
        target_prefill={32: 0.004, 1032: 0.002},
        draft_cost={32: {1: 0.02, 2: 0.025, 4: 0.035}},
        draft_prefill=0.001,
        tree_cost={32: {k: 1.5 * (0.1 + 0.01 * k) for k in (2, 4, 8)}},
    )
    args.update(kw)
    return Profile(**args)


def test_the_clock_is_the_hand_computed_sum_of_priced_forwards_plus_the_measured_overhead():
    p = synthetic()
    calls = [
        Call(TARGET, 20, 0, False, 0.5),      # the prompt: 20 <= 8? no: a prefill, 20 x prefill(20) = 20 x 0.004
        Call(DRAFT, 20, 0, False, 0.05),      # the draft reads the prompt: 20 x 0.001
        Call(DRAFT, 1, 20, False, 0.01),      # c_d at context 20 (clamped to 32's curve): 0.02
        Call(DRAFT, 2, 21, False, 0.01),      # 0.025
        Call(TARGET, 4, 20, False, 0.2),      # c_t(4) at 32: 0.14
        Call(TARGET, 6, 532, False, 0.2),     # context 532 halfway to 1032: c_t(6) = 1.5 x (0.1 + 0.06) = 0.24
        Call(TARGET, 4, 24, True, 0.3),       # tree: 1.5 x 0.14 = 0.21
        Call(TARGET, 12, 32, False, 0.3),     # beyond k=8: c_t(8) + 4 x prefill(32) = 0.18 + 0.016
        Call(DRAFT, 6, 40, False, 0.02),      # beyond the draft's k=4: 0.035 + 2 x 0.001
    ]
    want = [20 * 0.004, 20 * 0.001, 0.02, 0.025, 0.14, 1.5 * 0.16, 0.21, 0.18 + 4 * 0.004, 0.035 + 2 * 0.001]
    for c, w in zip(calls, want, strict=True):
        assert p.price(c) == pytest.approx(w), c
    wall = 3.0
    measured = sum(c.seconds for c in calls)
    assert clock(p, wall, calls) == pytest.approx(sum(want) + wall - measured)


def test_pricing_depends_on_the_context_and_the_tree_mask():
    p = synthetic()
    at = [p.price(Call(TARGET, 4, c, False, 0)) for c in (32, 282, 532, 782, 1032, 5000)]
    assert at == pytest.approx([0.14, 0.175, 0.21, 0.245, 0.28, 0.28])  # linear in context, clamped at the ends
    assert p.price(Call(TARGET, 4, 32, True, 0)) == pytest.approx(0.21)
    chain_only = synthetic(tree_cost={})
    assert chain_only.price(Call(TARGET, 4, 32, True, 0)) == pytest.approx(0.14)  # no tree curve: priced as a chain
    assert p.costs().tree[4] == pytest.approx(0.21) and p.costs().draft == pytest.approx(0.02)


def test_a_call_kind_the_profile_cannot_price_fails():
    p = synthetic(draft_cost={})
    with pytest.raises(PacerError, match="no draft costs"):
        clock(p, 1.0, [Call(TARGET, 1, 5, False, 0.1), Call(DRAFT, 1, 5, False, 0.01)])


def test_another_pair_backend_or_target_dtype_is_refused_in_one_line():
    p = synthetic()
    assert p.check_pair("transformers", dict(PAIR_T), dict(PAIR_D)) == []
    cases = [("llamacpp", PAIR_T, PAIR_D, "llamacpp backend"),
             ("transformers", {**PAIR_T, "fingerprint": "x"}, PAIR_D, "another target model"),
             ("transformers", PAIR_T, {**PAIR_D, "fingerprint": "x"}, "another draft model"),
             ("transformers", {**PAIR_T, "dtype": "float32"}, PAIR_D, "--dtype bfloat16")]
    for backend, t, d, needle in cases:
        with pytest.raises(PacerError, match=needle) as e:
            p.check_pair(backend, t, d)
        assert "\n" not in str(e.value)
    notes = p.check_pair("transformers", PAIR_T, {**PAIR_D, "rows": "full"})
    assert len(notes) == 1 and "rows" in notes[0]  # a draft vocabulary of its own: priced, with a note


def test_profile_files_round_trip_and_damaged_ones_are_refused(tmp_path):
    p = synthetic()
    path = tmp_path / "p.json"
    p.save(path)
    q = Profile.load(path)
    assert q == p and default_name(q) == "zen4-avx512bf16-transformers-bf16"
    doc = json.loads(path.read_text())
    for broken, needle in [({**doc, "format": "x"}, "not a pacer cost profile"),
                           ({k: v for k, v in doc.items() if k != "target_cost"}, "'target_cost' is missing"),
                           ({**doc, "target_cost": {"32": {"1": -1.0}}}, r"'target_cost'\['32'\]\['1'\] is -1.0"),
                           ({**doc, "draft_cost": {"32": {"1": float("nan")}}}, "is NaN")]:
        path.write_text(json.dumps(broken))
        with pytest.raises(PacerError, match=needle):
            Profile.load(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PacerError, match="cannot be read"):
        Profile.load(path)
    with pytest.raises(PacerError, match="does not exist"):
        Profile.load(tmp_path / "none.json")


def _damaged_profiles() -> list[tuple[str, object]]:
    """(field path, value) pairs: every field of a profile missing, empty, of the wrong type, NaN, infinite,
    negative or zero where a cost must be positive."""
    cases: list[tuple[str, object]] = []
    bad_numbers = [float("nan"), float("inf"), float("-inf"), -0.1, 1e308, "0.2", True, None, [0.2], {"x": 1}]
    for top in ("target_cost", "tree_cost", "draft_cost"):
        cases += [(f"{top}", "x"), (f"{top}", [1]), (f"{top}", 3), (f"{top}/32", {}), (f"{top}/32", [0.1]),
                  (f"{top}/32", None), (f"{top}/-5", {"1": 0.1}), (f"{top}/x", {"1": 0.1}),
                  (f"{top}/32/0", 0.1), (f"{top}/32/-1", 0.1), (f"{top}/32/1.5", 0.1), (f"{top}/32/one", 0.1)]
        cases += [(f"{top}/32/2", v) for v in [*bad_numbers, 0, 0.0]]
    cases += [("target_cost", None), ("target_cost", {}), ("draft_cost", {}), ("draft_cost", None)]
    cases += [("target_prefill", "x"), ("target_prefill", [1]), ("target_prefill/0", 0.01), ("target_prefill/x", 0.01)]
    cases += [("target_prefill/32", v) for v in [*bad_numbers, 0]]
    cases += [("draft_prefill", v) for v in bad_numbers if v is not None]
    cases += [("policy_check", "x"), ("policy_check/pacer", -1.0), ("policy_check/pacer", float("nan")),
              ("policy_check/pacer", "1")]
    cases += [(f, v) for f in ("name", "backend") for v in (None, "", 3, ["x"])]
    cases += [(f, v) for f in ("runtime", "measured", "source") for v in (3, ["x"], {"a": 1})]
    cases += [(f, v) for f in ("machine", "target") for v in (None, "x", 3, ["x"])]
    cases += [("draft", v) for v in ("x", 3, ["x"])]
    cases += [("notes", "x"), ("notes", [1]), ("notes", {"a": 1})]
    return cases


@pytest.mark.parametrize("where,value", _damaged_profiles(), ids=lambda x: repr(x)[:30])
def test_every_field_of_a_profile_is_checked_before_it_prices(tmp_path, where, value):
    """A profile is read by one checked reader: any field missing, empty, of the wrong type, NaN, infinite or
    out of range is one line naming the file and the field (a context row left empty once passed the checks and
    broke ``price()`` after the models loaded). A profile that loads prices every call kind."""
    doc = synthetic().to_dict()
    *parents, last = where.split("/")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    if value is None and not parents:
        del node[last]  # None at the top: the field missing
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PacerError) as e:
        p = Profile.load(path)
        # what loads must price: a call of every kind at several contexts
        for call in (Call(TARGET, 40, 0, False, 0), Call(TARGET, 3, 100, False, 0), Call(TARGET, 30, 100, True, 0),
                     Call(DRAFT, 40, 0, False, 0), Call(DRAFT, 9, 100, False, 0)):
            assert math.isfinite(p.price(call)) and p.price(call) > 0
        p.costs(100)
        pytest.fail(f"{where} = {value!r} was accepted")
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "export it again" in msg
    assert repr(where.split("/")[0]) in msg or where.split("/")[0] in msg, msg


def test_the_shipped_profiles_load_and_name_their_machine():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "docs" / "profiles"
    for name in ("zen4-avx512bf16-transformers-bf16", "zen4-avx512bf16-llamacpp-q4km"):
        p = Profile.load(root / f"{name}.json")
        assert p.name == name == default_name(p) and "family 25, model 17" in p.machine["describe"]
        assert {32, 512, 2048} <= set(p.target_cost) and p.draft_cost and not p.problems()
    for path in root.glob("*.json"):  # no prefill point its own curve contradicts (a cold first forward)
        p = Profile.load(path)
        assert doubtful_prefills(p.target_cost, p.target_prefill) == {}, path.name
    flat = Profile.load(root / "zen4-avx512bf16-transformers-bf16.json").costs()
    steep = Profile.load(root / "zen4-avx512bf16-llamacpp-q4km.json").costs()
    assert flat.verification_growth(8) <= 1.3 < 3 < steep.verification_growth(8)  # the flat-cost bar: 1.3


def test_a_prefill_its_curve_contradicts_is_doubtful():
    """A prefill of n tokens costs per token at most a token of the curve's longest forward after n cached (it
    reads the weights once for more tokens and attends to fewer): a point well above that is flagged, one just
    within the slack or below is not, each compared at its own context."""
    curve = {32: {1: 0.20, 16: 0.32}, 512: {1: 0.25, 16: 0.48}}  # 20 ms a token at 32, 30 ms at 512
    assert doubtful_prefills(curve, {32: 0.010, 512: 0.036}) == {}  # 0.5x and 1.2x their bounds
    bad = doubtful_prefills(curve, {32: 0.030, 128: 0.012, 512: 0.036})
    assert list(bad) == [32] and "1.50x" in bad[32] and "cold" in bad[32]
    assert list(doubtful_prefills(curve, {512: 0.040})) == [512]  # 1.33x the bound at its own context
    assert doubtful_prefills(curve, {4096: 1.0}) == {}  # beyond the contexts measured: not judged


class VirtualClock:
    """``time.perf_counter`` for a test: advances by ``tick`` a reading (the loop's own overhead) and by what a
    forward costs on the profile's machine when a :class:`Timed` backend runs one."""

    def __init__(self, tick: float = 1e-5) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


class Timed(FakeBackend):
    """A fake backend whose forward takes (on the virtual clock) what ``profile`` says it costs: a machine the
    profile describes exactly."""

    def __init__(self, *a, profile: Profile, role: str, clock: VirtualClock, **kw):
        super().__init__(*a, **kw)
        self.profile, self.role, self.clock = profile, role, clock

    def forward(self, ids, *, keep=0, hidden=False, tree=None):
        self.clock.now += self.profile.price(Call(self.role, len(ids), self.length, tree is not None, 0))
        return super().forward(ids, keep=keep, hidden=hidden, tree=tree)


@pytest.mark.parametrize("kind", ["token", "phrase"])
def test_with_the_machines_own_profile_the_clock_reproduces_the_wall_time(kind, monkeypatch):
    """The loop, the ledger and the clock together: on a machine whose forwards take exactly the profile's prices
    (a virtual clock) the clock gives the wall time; a machine twice as fast halves the forwards and keeps the
    overhead; leaving one call kind unpriced breaks the equality."""
    vc = VirtualClock()
    monkeypatch.setattr(time, "perf_counter", vc)
    p = synthetic()
    t = MeteredBackend(Timed(1, profile=p, role=TARGET, clock=vc), TARGET)
    d = MeteredBackend(Timed(2, agree_with=1, agree=0.8, profile=p, role=DRAFT, clock=vc), DRAFT)
    dr = TokenDrafter(d, t.vocab_size) if kind == "token" else \
        PhraseDrafter(d, t.vocab_size, PhraseOptions(warm_start=False))
    stats = GenerationStats()
    speculative_generate(t, dr, FixedPolicy(gamma=4), [1, 2, 3, 4, 5, 1, 2, 3], Output(40, set()),
                         SamplingConfig(), stats)
    assert {c.role for c in stats.calls} == {TARGET, DRAFT} and stats.wall_time > 1.0
    overhead = stats.wall_time - sum(p.price(c) for c in stats.calls)
    assert 0 < overhead < 0.01 * stats.wall_time  # ticks only
    assert clock(p, stats.wall_time, stats.calls) == pytest.approx(stats.wall_time, rel=1e-3)
    half = synthetic(target_cost={c: {k: v / 2 for k, v in row.items()} for c, row in p.target_cost.items()},
                     target_prefill={n: v / 2 for n, v in p.target_prefill.items()},
                     draft_cost={c: {k: v / 2 for k, v in row.items()} for c, row in p.draft_cost.items()},
                     draft_prefill=p.draft_prefill / 2,
                     tree_cost={c: {k: v / 2 for k, v in row.items()} for c, row in p.tree_cost.items()})
    forwards = sum(c.seconds for c in stats.calls)
    assert clock(half, stats.wall_time, stats.calls) == pytest.approx(forwards / 2 + overhead, rel=1e-3)
    drafts_unpriced = sum(p.price(c) for c in stats.calls if c.role == TARGET) + overhead
    assert clock(p, stats.wall_time, stats.calls) > drafts_unpriced + 0.01
    assert not math.isnan(clock(half, 0.0, [])) and FORMAT == "pacer-profile/1"


@pytest.mark.parametrize("field", ["target_cost", "tree_cost", "draft_cost", "target_prefill"])
@pytest.mark.parametrize("value", [float("nan"), -0.1, 0.0, float("inf")])
def test_a_profile_made_in_code_with_an_unusable_cost_is_refused_where_it_is_used(field, value, pairs):
    """A :class:`Profile` built in code never meets the file reader: its NaN, negative, zero or infinite cost is
    named by ``problems()`` and refused by every user of a profile object (the decoder, the vLLM proposer)."""
    from pacer import PacerError as Refused
    from pacer.integrations.vllm import load_costs

    good = synthetic()
    assert good.problems() == []
    rows = dict(getattr(good, field))
    if field == "target_prefill":
        rows[32] = value
    else:
        rows[32] = {**rows[32], 2: value}
    bad = synthetic(**{field: rows})
    problems = bad.problems()
    assert problems and str(value) in problems[0], problems
    with pytest.raises(Refused, match="unusable costs"):
        load_costs(bad)
    with pytest.raises(Refused, match="unusable costs"):
        pairs["close"].use_profile(bad)

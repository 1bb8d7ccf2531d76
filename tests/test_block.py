"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025;
:func:`pacer.sampling.verify_block`) keeps the target's distribution exactly, keeps at least as many tokens a round
as token-level verification, and is exact matching under greedy decoding.

Exact checks enumerate every draft block ``X_1..X_γ`` of a tiny vocabulary (``V = 3``, ``γ <= 3``) with its draft
probability, and every outcome of the uniforms: ``τ = i`` (the largest ``i`` with ``η_i < h_i``) has probability
``h_i · Π_{j > i} (1 - h_j)`` (``h_0 = 1``), from the rule's own :func:`~pacer.sampling.block_thresholds` and
:func:`~pacer.sampling.block_residual` in float64; the round's committed tokens, continued by the target to
``γ + 1`` tokens, must have the target's joint law to 1e-12. The target and the draft depend on the whole prefix
(a distribution per prefix). The rule's sampling itself (the uniforms, ``τ``'s choice, the draws) is checked by a
chi-square test against that exact law (:data:`test_sampling.ALPHA`), and end to end through
:meth:`pacer.Decoder.generate` by the token-level rule's own test (``test_sampling.check_generate_sampling``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from pacer import Decoder, PacerError, SamplingConfig
from pacer import sampling as S
from test_sampling import ALPHA, PROMPT, check_generate_sampling, chi2_pvalue

V = 3


# --------------------------------------------------------------------------------------- tiny tree-shaped pairs
def _dist(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def tree_pair(kind: str, depth: int, seed: int = 0, v: int = V) -> tuple[dict, dict]:
    """``(P, Q)``: the target's and the draft's next-token distribution after every prefix of up to ``depth``
    tokens (``P[prefix]``, a ``[v]`` array). ``kind``: ``random``; ``adversarial`` (the draft's mass where the
    target's is smallest, ``q ∝ p^-3``); ``q_zeros`` (the draft gives 0 to the target's likeliest token);
    ``p_zeros`` (the target gives 0 to a token, as after top-k); ``equal``; ``one_hot`` (a deterministic drafter,
    as prompt lookup: ``q`` one-hot at a token of its own); ``greedy`` (both one-hot)."""
    rng = np.random.default_rng(seed)
    P, Q = {}, {}
    for n in range(depth + 1):
        for pre in itertools.product(range(v), repeat=n):
            p = _dist(rng.dirichlet(np.ones(v)) + 0.02)
            q = _dist(rng.dirichlet(np.ones(v)))
            if kind == "adversarial":
                q = _dist(p**-3.0)
            elif kind == "q_zeros":
                q[p.argmax()] = 0.0
                q = _dist(q + (q.sum() == 0))
            elif kind == "p_zeros":
                p[p.argmin()] = 0.0
                p = _dist(p)
            elif kind == "equal":
                q = p.copy()
            elif kind in ("one_hot", "greedy"):
                q = np.eye(v)[rng.integers(v)]
                if kind == "greedy":
                    p = np.eye(v)[rng.integers(v)]
            P[pre], Q[pre] = p, q
    return P, Q


KINDS = ("random", "adversarial", "q_zeros", "p_zeros", "equal", "one_hot", "greedy")


def rows(D: dict, X: tuple, n: int) -> torch.Tensor:
    """``[n, v]`` float64: row ``i`` is ``D`` after ``X_1..X_i`` (``p``'s and ``q``'s layout in the rule)."""
    return torch.tensor(np.stack([D[tuple(X[:i])] for i in range(n)]), dtype=torch.float64)


def drafts(Q: dict, γ: int, v: int = V):
    """Every draft block of ``γ`` tokens the draft can draw, with its probability."""
    for X in itertools.product(range(v), repeat=γ):
        qX = math.prod(Q[X[:i]][X[i]] for i in range(γ))
        if qX > 0:
            yield X, qX


def round_law(P: dict, Q: dict, X: tuple) -> tuple[list[float], list[float], list[np.ndarray]]:
    """For the draft block ``X``: ``(w, P(τ = i) for i = 0..γ, the law of the target's token after τ = i)``, from
    the rule's own functions."""
    γ = len(X)
    p, q = rows(P, X, γ + 1), rows(Q, X, γ)
    w = S.block_weights([float(p[i, x]) for i, x in enumerate(X)], [float(q[i, x]) for i, x in enumerate(X)])
    h = S.block_thresholds(w, p, q)
    taus = [(h[t - 1] if t else 1.0) * math.prod(1.0 - h[j] for j in range(t, γ)) for t in range(γ + 1)]
    ys = []
    for t in range(γ + 1):
        r = p[γ] if t == γ else S.block_residual(w[t - 1] if t else 1.0, p[t], q[t])
        ys.append(_dist(r.numpy()) if float(r.sum()) > 0 else p[t].numpy())
    return w, taus, ys


def committed_law(P: dict, Q: dict, γ: int, v: int = V) -> dict[tuple, float]:
    """The law of a round's committed tokens ``X_1..X_τ, Y`` (sequences of 1 to ``γ + 1`` tokens)."""
    out: dict[tuple, float] = {}
    for X, qX in drafts(Q, γ, v):
        _, taus, ys = round_law(P, Q, X)
        for t, (pt, y) in enumerate(zip(taus, ys, strict=True)):
            for tok in range(v):
                if pt * y[tok] > 0:
                    key = (*X[:t], tok)
                    out[key] = out.get(key, 0.0) + qX * pt * y[tok]
    return out


def target_prob(P: dict, s: tuple) -> float:
    return math.prod(P[s[:k]][s[k]] for k in range(len(s)))


def law_error(P: dict, Q: dict, γ: int, v: int = V) -> float:
    """The largest gap between the round's committed tokens, continued by the target to ``γ + 1`` tokens, and the
    target's own ``γ + 1`` tokens, over every sequence."""
    law = committed_law(P, Q, γ, v)
    worst = 0.0
    for s in itertools.product(range(v), repeat=γ + 1):
        got = sum(law.get(s[: k + 1], 0.0) * math.prod(P[s[:j]][s[j]] for j in range(k + 1, γ + 1))
                  for k in range(γ + 1))
        worst = max(worst, abs(got - target_prob(P, s)))
    return worst


def expected_accepted(P: dict, Q: dict, γ: int, v: int = V) -> tuple[float, float]:
    """``E[τ]`` of a round of ``γ`` draft tokens under block and under token-level verification (there ``d_k`` is
    kept with probability ``Π_{j<=k} min(1, p_j / q_j)``)."""
    block = token = 0.0
    for X, qX in drafts(Q, γ, v):
        _, taus, _ = round_law(P, Q, X)
        block += qX * sum(t * pt for t, pt in enumerate(taus))
        keep = 1.0
        for i, x in enumerate(X):
            keep *= min(1.0, P[X[:i]][x] / Q[X[:i]][x])
            token += qX * keep
    return block, token


# ----------------------------------------------------------------------------------------------- exact laws
@pytest.mark.parametrize("γ", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_block_round_has_the_targets_law_exactly(kind, γ):
    P, Q = tree_pair(kind, γ, seed=γ)
    assert law_error(P, Q, γ) < 1e-12


def test_block_keeps_at_least_as_many_tokens_as_token_level():
    """On random pairs ``E[τ]`` under block verification is never below token-level's, above it somewhere; the two
    agree with one draft token (the same rule) and for a deterministic drafter (one-hot ``q``: no valid rule keeps
    ``d_1..d_k`` more often than the target's ``Π p_j(d_j)``, which token-level reaches)."""
    gains = []
    for seed in range(12):
        for kind in ("random", "adversarial", "q_zeros", "p_zeros"):
            P, Q = tree_pair(kind, 4, seed)
            for γ in (2, 3, 4):
                block, token = expected_accepted(P, Q, γ)
                assert block >= token - 1e-12, (kind, seed, γ)
                gains.append(block - token)
            block, token = expected_accepted(P, Q, 1)
            assert block == pytest.approx(token, abs=1e-12)
        P, Q = tree_pair("one_hot", 3, seed)
        block, token = expected_accepted(P, Q, 3)
        assert block == pytest.approx(token, abs=1e-12)
    assert max(gains) > 0.02


def test_the_papers_example():
    """Sun et al.'s Section 2: context-free ``p = (1/3, 2/3)``, ``q = (2/3, 1/3)``, ``γ = 2``: token-level keeps
    10/9 tokens a round on average, block verification 11/9."""
    P = {pre: np.array([1 / 3, 2 / 3]) for n in range(3) for pre in itertools.product(range(2), repeat=n)}
    Q = {pre: np.array([2 / 3, 1 / 3]) for pre in P}
    block, token = expected_accepted(P, Q, 2, v=2)
    assert token == pytest.approx(10 / 9, abs=1e-12) and block == pytest.approx(11 / 9, abs=1e-12)
    assert law_error(P, Q, 2, v=2) < 1e-12


def test_survival_is_the_weight_whatever_the_draft_length():
    """``P(τ >= i | X_1..X_i) = w_i`` however many tokens follow ``X_i``, even where the length is decided from the
    drafted tokens (a policy): so the cost rule's yield ``E_γ = 1 + Σ_{i<=γ} S_i`` with ``S_i = E[w_i]`` holds under
    block verification as it does under token-level (``S_i = E[Π min(1, p/q)]``), and its running acceptance,
    learnt from the rounds' ``τ`` of whatever lengths, estimates the ``S_i`` of the rule in use."""
    P, Q = tree_pair("random", 4, seed=3)

    def stop(X: tuple) -> bool:  # an adaptive length: 1 to 4 tokens, decided by the tokens drafted
        return len(X) == 4 or (len(X) >= 1 and (7 * sum(X) + len(X)) % 3 == 0)

    num: dict[tuple, float] = {}
    den: dict[tuple, float] = {}

    def walk(X: tuple, qX: float) -> None:
        if not stop(X):
            for x in range(V):
                walk((*X, x), qX * Q[X][x])
            return
        _, taus, _ = round_law(P, Q, X)
        for i in range(1, len(X) + 1):
            num[X[:i]] = num.get(X[:i], 0.0) + qX * sum(taus[i:])
            den[X[:i]] = den.get(X[:i], 0.0) + qX

    walk((), 1.0)
    assert {len(k) for k in num} == {1, 2, 3, 4}
    for pre in num:
        w, _, _ = round_law(P, Q, pre)
        assert num[pre] / den[pre] == pytest.approx(w[-1], abs=1e-12), pre


_THRESHOLDS = S.block_thresholds


def _unweighted_residual(w, p_row, q_row):
    """Planted bug: the residual after ``τ >= 1`` without the weight ``w_τ`` (token-level's ``max(p - q, 0)``)."""
    return (p_row - q_row).clamp_min(0.0)


def _thresholds_one_behind(w, p, q):
    """Planted bug: ``h_i`` from ``w_{i-1}`` instead of ``w_i``."""
    return [*_THRESHOLDS([1.0, *w[:-1]], p, q)[:-1], w[-1]]


def _rows_one_behind(w, p, q):
    """Planted bug: ``Z_i`` from ``p_i``, ``q_i`` (the rows of ``X_i`` itself) instead of ``p_{i+1}``, ``q_{i+1}``."""
    return _THRESHOLDS(w, torch.cat([p[:1], p[:-1]]), torch.cat([q[:1], q[:-1]]))


@pytest.mark.parametrize("name,mutant", [("block_residual", _unweighted_residual),
                                         ("block_thresholds", _thresholds_one_behind),
                                         ("block_thresholds", _rows_one_behind)])
def test_negative_control_planted_bugs_break_the_law(monkeypatch, name, mutant):
    """The exact check sees each planted bug in the residual computation (by a wide margin)."""
    P, Q = tree_pair("random", 3, seed=3)
    monkeypatch.setattr(S, name, mutant)
    assert max(law_error(P, Q, γ) for γ in (2, 3)) > 1e-3


# --------------------------------------------------------------------------------- the rule's own sampling
def sample_rounds(P: dict, Q: dict, γ: int, n: int, seed: int, verify=S.verify_block, v: int = V) -> dict:
    """Counts of the committed tokens of ``n`` rounds: the draft block drawn from ``Q``, verified by ``verify``."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    for _ in range(n):
        X: tuple = ()
        for _ in range(γ):
            X = (*X, int(rng.choice(v, p=Q[X])))
        p, q = rows(P, X, γ + 1).float(), rows(Q, X, γ).float()
        t, y = verify(list(X), q, p, gen)
        key = (*X[:t], y)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _pvalue(counts: dict, law: dict) -> float:
    keys = list(law)
    assert set(counts) <= set(keys), "a committed sequence of probability 0 occurred"
    return chi2_pvalue(np.array([counts.get(k, 0) for k in keys]), np.array([law[k] for k in keys]))


@pytest.mark.parametrize("kind", ["random", "adversarial", "p_zeros", "one_hot"])
def test_verify_block_samples_the_exact_law(kind):
    """``verify_block``'s rounds (its uniforms, ``τ``, the draws) against the exact law of the committed tokens."""
    P, Q = tree_pair(kind, 3, seed=5)
    assert _pvalue(sample_rounds(P, Q, 3, 6000, seed=1), committed_law(P, Q, 3)) > ALPHA


def _first_not_last(draft, q, p, gen):
    """Negative control: ``τ`` the smallest ``i`` with ``η_i < h_i`` (``γ`` when none) instead of the largest."""
    w = S.block_weights(*S._at(draft, p, q))
    h = S.block_thresholds(w, p, q)
    η = torch.rand(len(draft), generator=gen, dtype=torch.float64).tolist()
    τ = next((i for i in range(1, len(draft) + 1) if η[i - 1] < h[i - 1]), len(draft))
    if τ == len(draft):
        return τ, S.draw(p[τ], gen)
    return τ, S.draw(S.block_residual(w[τ - 1] if τ else 1.0, p[τ], q[τ]), gen)


def test_negative_control_the_chi_square_sees_the_wrong_tau():
    P, Q = tree_pair("random", 3, seed=5)
    assert _pvalue(sample_rounds(P, Q, 3, 6000, seed=1, verify=_first_not_last), committed_law(P, Q, 3)) < 1e-6


def test_block_is_exact_matching_on_one_hot_distributions():
    """Greedy decoding's distributions (one-hot ``p`` and ``q``): block verification keeps the longest prefix equal
    to the target's argmax and emits the target's argmax, whatever the uniforms: :func:`verify_greedy`'s verdict."""
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        γ, v = int(rng.integers(1, 6)), 5
        t = rng.integers(v, size=γ + 1)  # the target's argmax per row
        X = [int(t[i]) if rng.random() < 0.7 else int((t[i] + 1) % v) for i in range(γ)]
        p = torch.eye(v)[t]
        q = torch.eye(v)[X]
        got = S.verify_block(X, q, p, gen)
        assert got == S.verify_greedy(X, p)
        seen.add(got[0])
    assert seen == set(range(6))


# ---------------------------------------------------------------------------------- end to end: generate
def test_generate_block_matches_target_joint():
    """``test_sampling``'s end-to-end check (the first tokens of 2500 seeded generations of the tiny pair against
    the target's exact joint law, the adversarial draft carrying the residual) under block verification."""
    check_generate_sampling("negated", SamplingConfig(temperature=1.0, verify="block"))


def test_generate_block_negative_control(monkeypatch):
    """The end-to-end check sees a planted residual bug under block verification (the residual from ``p`` alone)."""
    import test_sampling as ts

    monkeypatch.setattr(S, "block_residual", lambda w, p_row, q_row: p_row)
    dec = ts._decoder("negated")
    cfg = SamplingConfig(temperature=1.0, verify="block")
    counts, drafted_counts, _, _ = ts.sample_first_tokens(dec, PROMPT, "sd", cfg, 800)
    assert chi2_pvalue(drafted_counts, ts.exact_drafted_joint(dec.target.model, PROMPT, cfg)) < 1e-6


@pytest.mark.parametrize("method,kw", [("sd", {"gamma": 4}), ("sd", {}), ("lookup", {}), ("ouroboros", {})])
def test_greedy_output_is_unchanged(close, method, kw):
    """Greedy decoding verifies by exact matching: the same tokens as plain decoding; block verification at
    temperature 0 is refused, not ignored (tests/test_verify_rule.py: every entry point alike)."""
    ar = close.generate(PROMPT, "ar", max_new_tokens=24).token_ids
    out = close.generate(PROMPT, method, max_new_tokens=24, sampling=SamplingConfig(verify="token"), **kw)
    assert out.token_ids == ar, method
    with pytest.raises(PacerError, match="needs sampling"):
        close.generate(PROMPT, method, max_new_tokens=24, sampling=SamplingConfig(verify="block"), **kw)


def test_seeded_block_sampling_is_reproducible(close):
    a, b, c = (close.generate(PROMPT, "sd", max_new_tokens=30, gamma=4,
                              sampling=SamplingConfig(0.9, seed=s, verify="block")) for s in (5, 5, 6))
    assert a.token_ids == b.token_ids and a.stats.accepted_counts == b.stats.accepted_counts
    assert a.token_ids != c.token_ids
    assert sum(a.stats.accepted_counts) > 0


def test_block_keeps_more_tokens_on_the_tiny_pair(close):
    """On the tiny close pair at T = 1 over 40 seeds, block verification accepts more draft tokens per round than
    token-level (a paired comparison of the same prompts and seeds; both are valid samples, not the same ones)."""
    acc = {}
    for verify in S.VERIFY_RULES:
        tot = rounds = 0
        for s in range(40):
            st = close.generate(PROMPT, "sd", max_new_tokens=24, gamma=6,
                                sampling=SamplingConfig(1.0, seed=s, verify=verify)).stats
            tot += st.accepted_tokens
            rounds += sum(1 for d in st.draft_lengths if d)
        acc[verify] = tot / rounds
    assert acc["block"] > acc["token"], acc


def test_branches_are_not_scored_under_sampling(close, monkeypatch):
    """Trees (Ouroboros's candidate branches) are greedy only: under sampling the loop scores no branch (the
    round's room for them is 0) and the phrase drafter proposes none, so block verification sees the chain alone.
    A drafter that proposes branches anyway gets the same target forwards, and the same output, as without them."""
    from pacer.drafters.token import TokenDrafter

    class Branching(TokenDrafter):
        def propose(self, tokens, policy, budget, sampling, gen, remaining=0, **kw):
            d = super().propose(tokens, policy, budget, sampling, gen, remaining)
            d.branches, d.anchors = [[1, 2, 3]], []
            return d

    fed: list = []
    inner = close.target.inner  # the backend under the meter
    forward_view = inner.forward_view

    def recording(ids, *args, **kw):
        fed.append((len(ids), kw.get("tree")))
        return forward_view(ids, *args, **kw)

    monkeypatch.setattr(inner, "forward_view", recording)
    cfg = SamplingConfig(0.8, seed=2, verify="block")
    plain = close.generate(PROMPT, "sd", max_new_tokens=24, gamma=4, sampling=cfg)
    plain_fed, fed[:] = list(fed), []
    branched = close.generate(PROMPT, "sd", max_new_tokens=24, gamma=4, sampling=cfg,
                              drafter=Branching(close.draft_backend(), close.make_drafter("sd").vocab))
    assert len(fed) > 3 and fed == plain_fed and all(tree is None for _, tree in fed)
    assert branched.token_ids == plain.token_ids and branched.stats.draft_tokens == plain.stats.draft_tokens
    ours = close.generate(PROMPT, "ouroboros", max_new_tokens=24, sampling=cfg, options={"candidates": 4})
    assert len(ours.token_ids) == 24 and ours.stats.draft_tokens > 0


def test_cost_rule_learns_the_acceptance_of_the_rule_in_use():
    """The cost-aware rule's memory (:class:`~pacer.pricing.CostMemory`) counts, per draft position,
    the rounds that reached it and those that kept it, from the accepted count the loop reports: under block
    verification exactly block's ``τ`` of each round (``GenerationStats``), so its ``α_i`` and survival are
    block's. A sampled generation learns from the initial memory (a seeded sample is reproducible:
    ``tests/test_seeds.py``), so each generation's memory holds that generation's rounds alone.
    Ouroboros with a fixed ``γ``: a literal rule whose pricer prices its extras and never declines a round."""
    from conftest import FLAT
    from pacer.request import MethodRequest
    from pacer.tiny import tiny_pair

    dec = Decoder(*tiny_pair("close"), threads=1, costs=FLAT)
    req = MethodRequest("ouroboros", gamma=4)
    rows = dec.make_drafter(req).vocab_rows()
    for verify in S.VERIFY_RULES:
        seen = 0
        for s in range(6):
            policy = dec.make_policy(req, rows, verify)
            pricer = dec.pricer_of(policy)  # a literal rule and its pricer: the pricer learns the rounds
            assert pricer.priced
            st = dec.generate(PROMPT, req, max_new_tokens=30, sampling=SamplingConfig(1.0, seed=s, verify=verify),
                              policy=policy).stats
            hits, trials = [0] * 6, [0] * 6
            for γ, n in zip(st.draft_lengths, st.accepted_counts, strict=True):
                for i in range(1, min(n + 1, γ) + 1):
                    trials[i] += 1
                    hits[i] += i <= n
            memory, seen = pricer.memory, seen + sum(trials)
            for i in range(1, 6):
                assert memory.trials[i] - memory.prior == trials[i], (verify, i)
                assert memory.hits[i] - memory.prior * memory.alpha0 == pytest.approx(hits[i]), (verify, i)
        assert seen > 20


# ------------------------------------------------------------------------------------------------ settings
def test_verify_setting_is_checked():
    assert SamplingConfig().verify == "token" and SamplingConfig(verify="block").verify == "block"
    with pytest.raises(PacerError, match="verify must be one of token, block"):
        SamplingConfig(0.7, verify="blocks")
    with pytest.raises(TypeError, match="verify"):
        SamplingConfig(0.7, verify=1)
    assert dataclasses.replace(SamplingConfig(0.7, verify="block"), seed=3).verify == "block"


def test_decoder_generate_takes_the_rule(close):
    out = close.generate(PROMPT, "sd", max_new_tokens=8, sampling=SamplingConfig(0.8, verify="block"))
    assert len(out.token_ids) == 8

"""Sampling-mode speculative decoding must reproduce the target's (warped) distribution exactly.

Statistical criterion used throughout: Pearson's chi-square goodness of fit of the observed counts against
the exact probabilities (cells with an expected count below 5 pooled into one cell), passing when the p-value
exceeds ``ALPHA = 1e-4``. Every run uses fixed seeds, so each test is deterministic; with a correct sampler a
given seed fails with probability 1e-4 per test (with 1e-3, one of the ~20 checks here drew p = 0.0009 after the
draws changed, and the same check passed at p = 0.23 with 150,000 draws: chance, not a bias). Outcomes of
probability 0 must never occur. The negative controls show that the same test rejects a slightly wrong verifier
with a p-value far below ``ALPHA`` at these sample sizes.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats as sps

from pacer import Decoder, PacerError, SamplingConfig
from pacer.backends.transformers import TransformersModel
from pacer.sampling import verify_sampling, warp
from pacer.tiny import tiny_model

ALPHA = 1e-4


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness-of-fit p-value of ``counts`` against ``probs`` (same shape, any dims)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    probs = probs / probs.sum()
    assert counts[probs == 0].sum() == 0, "an outcome of probability 0 occurred"
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs_cells, exp_cells = list(counts[big]), list(exp[big])
    small = (~big) & (probs > 0)
    if small.any():
        obs_cells.append(counts[small].sum())
        exp_cells.append(exp[small].sum())
    if len(obs_cells) < 2:
        return 1.0
    return float(sps.chisquare(obs_cells, exp_cells).pvalue)


# ----------------------------------------------------------------------------- direct: verify_sampling
V = 8


def _dist(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``(p1 [V], P2 [V, V], q1 [V], Q2 [V, V])``: target and draft for the first token and for the second
    given the first (row ``a`` of ``P2`` is ``p(x2 | x1 = a)``)."""
    rng = np.random.default_rng(1234)
    p1 = _dist(rng.dirichlet(np.ones(V)) + 0.01)
    P2 = np.stack([_dist(rng.dirichlet(np.ones(V)) + 0.01) for _ in range(V)])
    out = {}
    # an unrelated draft
    out["random"] = (
        p1,
        P2,
        _dist(rng.dirichlet(np.ones(V))),
        np.stack([_dist(rng.dirichlet(np.ones(V))) for _ in range(V)]),
    )
    # adversarial: the draft puts its mass where the target has little (q ∝ p^-3)
    out["adversarial"] = (p1, P2, _dist(p1**-3.0), np.stack([_dist(r**-3.0) for r in P2]))

    # the draft has zeros where the target is positive (on the target's 3 likeliest tokens)
    def zero_top(r, k=3):
        r = r.copy()
        r[np.argsort(-r)[:k]] = 0.0
        return _dist(r)

    out["q_zeros"] = (
        p1,
        P2,
        zero_top(np.ones(V) / V + p1),
        np.stack([zero_top(np.ones(V) / V + r) for r in P2]),
    )

    # the target has zeros where the draft is positive (as after top-k on the target only)
    def keep_top(r, k=3):
        z = np.zeros_like(r)
        i = np.argsort(-r)[:k]
        z[i] = r[i]
        return _dist(z)

    out["p_zeros"] = (
        keep_top(p1),
        np.stack([keep_top(r) for r in P2]),
        _dist(rng.dirichlet(np.ones(V))),
        np.stack([_dist(rng.dirichlet(np.ones(V))) for _ in range(V)]),
    )
    # identical distributions: every draft token is accepted
    out["equal"] = (p1, P2, p1, P2)
    return out


CASES = _cases()


def verify_residual_from_p(draft, q, p, gen):
    """A broken rule (negative control): on rejection it samples from ``p`` instead of the residual."""
    for i, x in enumerate(draft):
        r = torch.rand((), generator=gen).item()
        if r * float(q[i, x]) < float(p[i, x]):
            continue
        return i, int(torch.multinomial(p[i], 1, generator=gen))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=gen))


def simulate(case, n_draws: int, seed: int, verify=verify_sampling):
    """Two tokens of SD: a round drafting 2 tokens, then (if only 1 was emitted) a round drafting 1.

    Returns ``(joint [V, V] counts of the first two emitted tokens, joint counts over the rounds whose first
    draft token was accepted, number of accepted first draft tokens)``."""
    p1, P2, q1, Q2 = (torch.tensor(a, dtype=torch.float32) for a in case)
    bonus = torch.full((V,), 1.0 / V)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    cq1 = np.cumsum(case[2])
    cQ2 = np.cumsum(case[3], axis=1)
    joint = np.zeros((V, V), dtype=np.int64)
    joint_acc = np.zeros((V, V), dtype=np.int64)
    accepted = 0
    for _ in range(n_draws):
        d1 = min(int(np.searchsorted(cq1, rng.random(), side="right")), V - 1)
        d2 = min(int(np.searchsorted(cQ2[d1], rng.random(), side="right")), V - 1)
        n, x = verify([d1, d2], torch.stack([q1, Q2[d1]]), torch.stack([p1, P2[d1], bonus]), gen)
        emitted = [d1, d2][:n] + [x]
        if n >= 1:
            accepted += 1
            joint_acc[emitted[0], emitted[1]] += 1
        if len(emitted) == 1:  # the next round drafts one token after x1
            d = min(int(np.searchsorted(cQ2[x], rng.random(), side="right")), V - 1)
            n2, x2 = verify([d], Q2[x][None], torch.stack([P2[x], bonus]), gen)
            emitted.append(d if n2 == 1 else x2)
        joint[emitted[0], emitted[1]] += 1
    return joint, joint_acc, accepted


@pytest.mark.parametrize("name", list(CASES))
def test_verify_sampling_reproduces_target_distribution(name):
    p1, P2, q1, _ = CASES[name]
    n_draws = 12000
    joint, joint_acc, accepted = simulate(CASES[name], n_draws, seed=7)
    exact = p1[:, None] * P2
    # first emitted token ~ p1
    assert chi2_pvalue(joint.sum(1), p1) > ALPHA, (name, joint.sum(1) / n_draws, p1)
    # first two emitted tokens ~ p1(a) p(b | a)
    assert chi2_pvalue(joint, exact) > ALPHA, name
    # when the first draft token is accepted: x1 ~ min(p1, q1) (normalised), x2 ~ p(. | x1) (correction or d2)
    acc = np.minimum(p1, q1)
    assert accepted / n_draws == pytest.approx(acc.sum(), abs=4 * np.sqrt(0.25 / n_draws) + 1e-9)
    if accepted:
        assert chi2_pvalue(joint_acc, acc[:, None] * P2) > ALPHA, name
    if name == "equal":
        assert accepted == n_draws


def test_negative_control_wrong_residual_is_detected():
    """The chi-square test can see a plausible bug: the correction sampled from p instead of the residual."""
    joint, _, _ = simulate(CASES["adversarial"], 12000, seed=7, verify=verify_residual_from_p)
    p1 = CASES["adversarial"][0]
    assert chi2_pvalue(joint.sum(1), p1) < 1e-6


def test_verify_sampling_deterministic_cases():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    # q == p: always accepted, then the bonus comes from p[γ]
    for _ in range(50):
        assert verify_sampling([0, 2], p[:2].clone(), p, gen) == (2, 0)
    # a draft token the target gives probability 0 is always rejected; the correction avoids it
    q = torch.tensor([[0.0, 0.0, 1.0]])
    for _ in range(50):
        n, x = verify_sampling([2], q, p[[0, 1]], gen)
        assert n == 0 and x in (0, 1)
    # empty draft: one token from p[0]
    assert verify_sampling([], torch.zeros(0, 3), p[[2]], gen) == (0, 0)


# ------------------------------------------------------------------------ end to end: Decoder.generate
SMALL_VOCAB = 12
PROMPT = [1, 4, 2, 7]


def _small_target() -> torch.nn.Module:
    return tiny_model(3, vocab=SMALL_VOCAB, hidden=16, layers=1, init=0.2)


def _negated(model: torch.nn.Module) -> torch.nn.Module:
    """A draft whose logits are the target's negated: its mass sits where the target's is smallest."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.lm_head.weight.neg_()
    return m


def _decoder(draft: str, device: str = "cpu") -> Decoder:
    target = _small_target()
    d = (
        _negated(target)
        if draft == "negated"
        else tiny_model(41, vocab=SMALL_VOCAB, hidden=16, layers=1, init=1.0)
    )
    dec = Decoder(
        TransformersModel(target, None, "t", "t", torch.float32),
        TransformersModel(d, None, draft, draft, torch.float32),
        threads=1,
        device=device,
    )
    dec.eos.clear()  # always two tokens
    return dec


def reference_warp(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Temperature, then top-k, then top-p (the smallest most-likely set whose mass reaches p), in float64 numpy,
    written from the definitions and independent of :func:`pacer.sampling.warp` (which it checks)."""
    z = np.asarray(logits, dtype=np.float64) / cfg.temperature
    keep = np.ones_like(z, dtype=bool)
    if cfg.top_k:
        keep &= z >= np.sort(z, axis=-1)[..., -cfg.top_k, None]
    p = np.where(keep, np.exp(z - z.max(-1, keepdims=True)), 0.0)
    p /= p.sum(-1, keepdims=True)
    if cfg.top_p < 1.0:
        out = np.zeros_like(p)
        for row, q in zip(out.reshape(-1, p.shape[-1]), p.reshape(-1, p.shape[-1]), strict=True):
            mass = 0.0
            for i in np.argsort(-q, kind="stable"):
                if mass >= cfg.top_p or q[i] == 0:
                    break
                row[i], mass = q[i], mass + q[i]
        p = out / out.sum(-1, keepdims=True)
    return p


@torch.inference_mode()
def exact_joint(model: torch.nn.Module, prompt: list[int], cfg: SamplingConfig) -> np.ndarray:
    """``p(x1) * p(x2 | x1)`` of the warped target, from target forwards (warped by :func:`reference_warp`)."""
    ids = torch.tensor([prompt + [a] for a in range(SMALL_VOCAB)], device=model.device)
    logits = model(input_ids=ids).logits.double().cpu().numpy()  # [V, len + 1, V]
    p1 = reference_warp(logits[0, -2], cfg)
    p2 = reference_warp(logits[:, -1], cfg)
    return p1[:, None] * p2


@torch.inference_mode()
def exact_drafted_joint(model: torch.nn.Module, prompt: list[int], cfg: SamplingConfig) -> np.ndarray:
    """``P(x2, x3) = Σ_a p(a) p(x2 | a) p(x3 | a, x2)`` of the warped target: the two tokens a generation's first
    drafting round gives (its first token comes from the prefill alone)."""
    n = SMALL_VOCAB
    ids = torch.tensor([prompt + [a, b] for a in range(n) for b in range(n)], device=model.device)
    logits = model(input_ids=ids).logits.double().cpu().numpy().reshape(n, n, len(prompt) + 2, -1)
    p1 = reference_warp(logits[0, 0, -3], cfg)
    p2 = reference_warp(logits[:, 0, -2], cfg)
    p3 = reference_warp(logits[:, :, -1], cfg)
    return np.einsum("a,ab,abc->bc", p1, p2, p3)


def sample_first_tokens(dec: Decoder, prompt: list[int], method: str, cfg: SamplingConfig, seeds: int,
                        **kw) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(counts of (x1, x2), counts of (x2, x3), drafted, accepted)`` over ``seeds`` seeded generations of
    ``method`` with ``gamma=2``: the prefill gives x1, and the first drafting round has room for two draft tokens
    (x2 and x3 come from it)."""
    c12 = np.zeros((SMALL_VOCAB, SMALL_VOCAB))
    c23 = np.zeros_like(c12)
    drafted = accepted = 0
    for s in range(seeds):
        c = dataclasses.replace(cfg, seed=s)  # its verification rule too
        x = dec.generate(prompt, method, max_new_tokens=4, gamma=2, sampling=c, **kw)
        c12[x.token_ids[0], x.token_ids[1]] += 1
        c23[x.token_ids[1], x.token_ids[2]] += 1
        drafted += x.stats.draft_tokens
        accepted += x.stats.accepted_tokens
    return c12, c23, drafted, accepted


E2E = [
    ("negated", SamplingConfig(temperature=1.0)),
    ("sharp", SamplingConfig(temperature=1.0, top_k=4)),
    ("negated", SamplingConfig(temperature=0.8, top_p=0.7)),
    ("sharp", SamplingConfig(temperature=1.3, top_k=6, top_p=0.9)),
]


@pytest.mark.parametrize(
    "draft,cfg", E2E, ids=[f"{d}-T{c.temperature}-k{c.top_k}-p{c.top_p}" for d, c in E2E]
)
def test_generate_sampling_matches_target_joint(draft, cfg):
    check_generate_sampling(draft, cfg)


def check_generate_sampling(draft: str, cfg: SamplingConfig, device: str = "cpu", seeds: int = 2500) -> None:
    """The first three tokens of ``generate`` over ``seeds`` seeds are distributed as the target's: the joint of
    the first two (the prefill's token and the first drafted position) and of the two the first drafting round
    gives (tests on other devices call it too: ``tests/test_device.py``)."""
    dec = _decoder(draft, device)
    exact = exact_joint(dec.target.model, PROMPT, cfg)
    counts, drafted_counts, drafted, accepted = sample_first_tokens(dec, PROMPT, "sd", cfg, seeds)
    assert drafted >= 2 * seeds  # the first drafting round always drafts 2 tokens
    assert chi2_pvalue(counts.sum(1), exact.sum(1)) > ALPHA, (counts.sum(1) / seeds, exact.sum(1))
    assert chi2_pvalue(counts, exact) > ALPHA
    assert chi2_pvalue(drafted_counts, exact_drafted_joint(dec.target.model, PROMPT, cfg)) > ALPHA
    # the adversarial drafts are mostly rejected, so the residual path carries the test
    assert accepted / drafted < 0.5


def test_generate_sampling_negative_control(monkeypatch):
    """The same end-to-end check rejects SD whose corrections come from p instead of the residual."""
    import pacer.decoding.loop

    monkeypatch.setattr(pacer.decoding.loop, "verify_sampling", verify_residual_from_p)
    dec = _decoder("negated")
    cfg = SamplingConfig(temperature=1.0)
    counts, drafted_counts, _, _ = sample_first_tokens(dec, PROMPT, "sd", cfg, 800)
    assert chi2_pvalue(counts, exact_joint(dec.target.model, PROMPT, cfg)) < 1e-6
    assert chi2_pvalue(drafted_counts, exact_drafted_joint(dec.target.model, PROMPT, cfg)) < 1e-6


# --------------------------------------------------------------------------------------------- warping
def _kept(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs > 0).flatten().tolist())


def test_warp_greedy_and_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert torch.allclose(warp(logits, SamplingConfig()), torch.softmax(logits, -1))
    assert torch.allclose(warp(logits, SamplingConfig(temperature=0.5)), torch.softmax(logits / 0.5, -1))
    assert torch.allclose(
        warp(logits.to(torch.bfloat16), SamplingConfig(1.0)), torch.softmax(logits, -1), atol=1e-3
    )
    assert warp(logits, SamplingConfig(1.0)).dtype == torch.float32


def test_warp_top_k_keeps_k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 30, generator=g)
    for k in (1, 2, 7, 29):
        pr = warp(logits, SamplingConfig(temperature=0.9, top_k=k))
        for row, lg in zip(pr, logits, strict=True):
            assert _kept(row) == set(torch.topk(lg, k).indices.tolist())
            # renormalised, proportional to the tempered softmax on the kept set
            ref = torch.softmax(lg / 0.9, -1)[torch.topk(lg, k).indices]
            assert torch.allclose(row[torch.topk(lg, k).indices], ref / ref.sum(), atol=1e-6)
    # k >= V and k = 0 disable the filter
    for k in (0, 30, 100):
        assert torch.allclose(warp(logits, SamplingConfig(1.0, top_k=k)), torch.softmax(logits, -1))


def test_warp_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))
    for top_p, kept in (
        (0.4, {1}),
        (0.7, {1, 3}),
        (0.85, {1, 3, 2}),
        (0.99, {0, 1, 2, 3}),
        (1.0, {0, 1, 2, 3}),
    ):
        pr = warp(logits, SamplingConfig(1.0, top_p=top_p))
        assert _kept(pr) == kept, top_p
        assert float(pr.sum()) == pytest.approx(1.0)
    # random logits: the kept set is the shortest prefix (by probability) whose mass reaches top_p
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        lg = torch.randn(20, generator=g) * 2
        top_p = float(torch.rand((), generator=g)) * 0.98 + 0.01
        pr64 = torch.softmax(lg.double(), -1)
        order = torch.argsort(pr64, descending=True)
        cum = pr64[order].cumsum(0)
        if (cum - top_p).abs().min() < 1e-5:
            continue  # too close to a boundary for float32
        m = int((cum < top_p).sum()) + 1
        assert _kept(warp(lg, SamplingConfig(1.0, top_p=top_p))) == set(order[:m].tolist())


def test_warp_top_k_then_top_p():
    """top-p acts on the distribution left by top-k (the order transformers uses)."""
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert _kept(warp(logits, SamplingConfig(1.0, top_p=0.5))) == {0, 1}
    assert _kept(warp(logits, SamplingConfig(1.0, top_k=2, top_p=0.5))) == {0}  # 0.4/0.7 >= 0.5


def test_sampling_config_validation():
    for kwargs in ({"temperature": -0.1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(PacerError):
            SamplingConfig(**kwargs)
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.7).greedy


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=5), SamplingConfig(1.3, top_p=0.6),
                                 SamplingConfig(0.9, top_k=8, top_p=0.8)], ids=str)
def test_warp_matches_the_definitions(cfg):
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 3
    np.testing.assert_allclose(warp(logits, cfg).double().numpy(), reference_warp(logits.numpy(), cfg), atol=1e-6)


def test_draw_samples_the_weights_exactly_and_never_a_zero():
    """``draw`` (inverse transform on a float64 cumulative sum) has the law of ``torch.multinomial``: unnormalised
    weights with zeros and a tiny mass, 100,000 draws; a zero weight is never drawn. Negative controls: the same
    inverse transform without scaling the uniform by the total, and one off by one in the search."""
    from pacer.sampling import draw

    w = torch.tensor([0.9, 0.0, 0.6, 0.003, 0.3, 0.75, 0.0, 0.15, 0.3, 0.0003])  # sums to 3.0033
    p = (w / w.sum()).numpy().astype(np.float64)
    gen = torch.Generator().manual_seed(11)
    n = 100_000
    counts = np.bincount([draw(w, gen) for _ in range(n)], minlength=len(w))
    assert counts[p == 0].sum() == 0
    assert chi2_pvalue(counts, p) > ALPHA

    def unscaled(weights, g):
        c = torch.cumsum(weights, 0, dtype=torch.float64)
        u = torch.rand(1, generator=g, dtype=torch.float64)
        return min(int(torch.searchsorted(c, u, right=True)), c.numel() - 1)

    def shifted(weights, g):  # an off-by-one in the search
        c = torch.cumsum(weights, 0, dtype=torch.float64)
        u = torch.rand(1, generator=g, dtype=torch.float64) * c[-1]
        return min(int(torch.searchsorted(c, u, right=True)) + 1, c.numel() - 1)

    for broken in (unscaled, shifted):
        gen = torch.Generator().manual_seed(11)
        bad = np.bincount([broken(w, gen) for _ in range(20_000)], minlength=len(w))
        assert bad[p == 0].sum() > 0 or chi2_pvalue(bad, p) <= ALPHA


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324, 1e-12])
def test_a_tiny_temperature_is_the_argmax_not_an_overflow(temperature, close):
    """``logits / 1e-40`` overflows to ±inf and the draw once returned the vocabulary's last id (EOS: empty text):
    a tiny τ is the limit of sampling, the argmax (ties shared), so a generation at it is plain greedy decoding's,
    for plain and speculative decoding."""
    row = torch.tensor([[1.0, 5.0, 3.0, -2.0, 4.0]])
    assert warp(row, SamplingConfig(temperature)).tolist() == [[0.0, 1.0, 0.0, 0.0, 0.0]]
    tied = warp(torch.tensor([[7.0, 1.0, 7.0]]), SamplingConfig(temperature))
    assert tied.tolist() == [[0.5, 0.0, 0.5]]
    greedy = close.generate("hello world, this is", "ar", max_new_tokens=12).token_ids
    cfg = SamplingConfig(temperature, seed=3)
    for method in ("ar", "sd"):
        assert close.generate("hello world, this is", method, max_new_tokens=12, sampling=cfg).token_ids == greedy

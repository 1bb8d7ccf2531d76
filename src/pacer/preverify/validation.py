"""What the pre-verification layer is worth on held-out rounds, against what a rule gets from the same rounds.

Terms (per validation round ``r``, drafted to ``m_r`` tokens while collecting):

* ``s[r, i]`` - the *survival target* through position ``i`` (1-based): greedy rounds - 1 if ``d_1..d_i`` were all
  accepted, else 0; sampled rounds - ``Π_{j<=i} min(1, p_j(d_j) / q_j(d_j))``, the probability that rejection
  sampling accepts all of them (soft labels: the expectation over the verifier's coin flips, with less variance than
  one realisation).
* ``E[tokens | L] = 1 + Σ_{i<=L} s[r, i]`` - expected committed tokens if the round had drafted ``L`` tokens (greedy:
  ``min(n*, L) + 1``), at cost ``L·c_d + c_t(L + 1) + checks·c_p``. A policy's *predicted speedup* is
  ``Σ_r E[tokens] / Σ_r cost · c_t(1)`` (plain decoding: one token per ``c_t(1)``).
* ``oracle`` - per round the length maximising ``E[tokens | L] / cost(L)`` (greedy: drafting exactly to the first
  mismatch, or 0 when that does not pay): the limit of any length policy.
* Rules (training-free, each at its best threshold for these rounds and costs, so they are not handicapped):
  ``confidence`` stops after the first token with ``max q < θ``; ``entropy`` after the first with ``H(q) > θ``;
  ``cumprob`` after the first where the product of the drafted tokens' ``q`` falls below ``θ``. These thresholds,
  chosen on the validation split (held-out collection prompts, never benchmark questions), are what ``pacer train``
  records in a checkpoint (``rules``) and ``pacer bench`` runs as ``entropy:threshold=validation``.
* ``features-only`` - a logistic model of per-token acceptance on the layer's scalar inputs only (``q``, entropy,
  top-2 margin, position, history, temperature): what the rules' inputs can give when *learned*. The layer must beat
  it, or its hidden-state inputs earn nothing.
* ``ECE`` - expected calibration error of block (or survival) scores against the survival target, 10 equal-width bins.

Cost profiles (``profiles``): ``measured`` (this collection's machine), ``flat`` (``c_t(k) = c_t(1)``), ``linear``
(``c_t(k) = k·c_t(1)``, an AVX2 CPU in bf16) and ``gpu`` (an *assumed* GPU-like curve: ``c_t(k)`` growing 1% a token,
``c_d = 0.3 c_t(1)``), all with the measured ``c_d / c_t(1)`` unless said otherwise.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..costs import Costs
from ..pricing import round_seconds

#: rule -> (the scalar it reads, stop when the value is ``below``/``above`` θ, whether the value is the running
#: product over the draft so far)
RULES = {"confidence": ("top_prob", "below", False), "entropy": ("entropy", "above", False),
         "cumprob": ("prob", "below", True)}


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks); NaN when one class is absent."""
    pos, neg = labels == 1, labels == 0
    if not pos.any() or not neg.any():
        return float("nan")
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * neg.sum()))


def survival_cumsum(surv: np.ndarray) -> np.ndarray:
    """``[R, M] -> [R, M + 1]``: ``c[r, L] = Σ_{i<=L} s[r, i]`` (``c[r, 0] = 0``)."""
    return np.concatenate([np.zeros((surv.shape[0], 1)), np.cumsum(surv, 1)], 1)


def predicted_speedup(lengths: np.ndarray, csum: np.ndarray, costs: Costs, checks: np.ndarray | None = None) -> float:
    """Predicted speedup over plain decoding of drafting ``lengths[r]`` tokens in round ``r`` (module docstring)."""
    lengths = lengths.astype(np.int64)
    tokens = csum[np.arange(len(lengths)), lengths] + 1
    cost = np.array([round_seconds(costs, int(L), checks=0 if checks is None else c)
                     for L, c in zip(lengths, lengths if checks is None else checks, strict=True)])
    return float(tokens.sum() / cost.sum() * round_seconds(costs, 0))


def oracle_lengths(csum: np.ndarray, m: np.ndarray, costs: Costs) -> np.ndarray:
    """Per round, the length ``0..m_r`` with the most expected tokens per second."""
    M = csum.shape[1] - 1
    cost = np.array([round_seconds(costs, L, checks=0) for L in range(M + 1)])
    rate = (csum + 1) / cost[None, :]
    rate[np.arange(M + 1)[None, :] > m[:, None]] = -1.0
    return rate.argmax(1)


def rule_lengths(values: np.ndarray, m: np.ndarray, thr: float, stop_when: str, min_draft: int = 1) -> np.ndarray:
    """Length per round when drafting stops after the first token (at or beyond ``min_draft``) whose value is
    ``below``/``above`` ``thr`` (that token is still drafted, as the policies do)."""
    bad = values < thr if stop_when == "below" else values > thr
    M = values.shape[1]
    bad[:, : max(min_draft, 1) - 1] = False
    bad &= np.arange(M)[None, :] < m[:, None]
    first = np.where(bad.any(1), bad.argmax(1) + 1, m)
    return np.minimum(first, m)


def survival_lengths(token_probs: np.ndarray, m: np.ndarray, thr: float, min_draft: int = 1) -> np.ndarray:
    """Stop after token ``i`` once ``1 - Π_{j<=i} σ_j`` exceeds ``thr`` (the SpecDec++ rule)."""
    surv = np.cumprod(token_probs, 1)
    return rule_lengths(1 - surv, m, thr, "above", min_draft)


def best_over(thresholds, lengths_for, csum: np.ndarray, costs: Costs, checks_for=None) -> dict:
    """The threshold with the highest predicted speedup, with its speedup and mean draft length."""
    best = None
    for thr in thresholds:
        L = lengths_for(thr)
        s = predicted_speedup(L, csum, costs, None if checks_for is None else checks_for(L))
        if best is None or s > best[0]:
            best = (s, float(thr), L)
    return {"predicted_speedup": round(best[0], 4), "threshold": round(best[1], 5),
            "mean_draft": round(float(best[2].mean()), 3), "lengths": best[2]}


def ece(scores: np.ndarray, targets: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: ``Σ_b (n_b / n) |mean score_b - mean target_b|`` over equal-width bins."""
    if len(scores) == 0:
        return float("nan")
    idx = np.minimum((scores * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.sum() / len(scores) * abs(float(scores[sel].mean()) - float(targets[sel].mean()))
    return total


def fit_features_only(scalars: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, epochs: int = 200,
                      seed: int = 0) -> nn.Module:
    """Logistic regression of per-token acceptance ``y`` (soft targets allowed) on normalised scalars ``[R, M, S]``
    over ``mask``; full-batch L-BFGS-free Adam, deterministic for a seed."""
    torch.manual_seed(seed)
    model = nn.Linear(scalars.shape[-1], 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x, t = scalars[mask], y[mask]
    for _ in range(epochs):
        loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(-1), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def profiles(costs: Costs, max_k: int) -> dict[str, Costs]:
    """The cost curves of the module docstring, from the measured ``costs`` (:meth:`pacer.costs.Costs.shapes`)."""
    return {"measured": costs, **costs.shapes(max_k)}


def rule_values(rule: str, scalars: np.ndarray, scalar_names: list[str]) -> np.ndarray:
    """``[R, M]``: the value ``rule`` compares with its threshold after each drafted token (``cumprob``: the running
    product of ``q(d_i)``), as its live policy (:mod:`pacer.policies.rules`) reads it."""
    feat, _, running = RULES[rule]
    v = scalars[..., scalar_names.index(feat)]
    return np.cumprod(v, 1) if running else v


def rule_survival(scalars: np.ndarray, scalar_names: list[str]) -> dict[str, np.ndarray]:
    """Survival proxies of the training-free rules, ``[R, M]`` (only their order matters for AUC):
    ``confidence`` - ``Π_{j<=i} max q_j``; ``entropy`` - ``exp(-Σ_{j<=i} H(q_j))``; ``cumprob`` -
    ``Π_{j<=i} q_j(d_j)``."""
    out = {}
    if "top_prob" in scalar_names:
        out["confidence"] = np.cumprod(scalars[..., scalar_names.index("top_prob")], 1)
    if "prob" in scalar_names:
        out["cumprob"] = np.cumprod(scalars[..., scalar_names.index("prob")], 1)
    if "entropy" in scalar_names:
        out["entropy"] = np.exp(-np.cumsum(scalars[..., scalar_names.index("entropy")], 1))
    return out


def survival_auc(estimates: dict[str, np.ndarray], hard: np.ndarray, valid: np.ndarray) -> dict[str, float]:
    """ROC-AUC of each survival estimate against the realised survival ``hard [R, M]`` over ``valid`` positions."""
    return {k: round(roc_auc(v[valid], hard[valid]), 4) for k, v in estimates.items()}


def compare(layer_lengths, csum: np.ndarray, m: np.ndarray, scalars: np.ndarray, scalar_names: list[str],
            survivals: dict[str, np.ndarray], costs: Costs, min_draft: int = 1) -> dict:
    """Predicted speedups on the same rounds and costs: the layer as it runs (``layer_lengths(costs) -> (threshold,
    lengths, checks)``, its threshold chosen for these costs), each rule at its best threshold, each per-token survival
    estimate in ``survivals`` (stop after the first token whose estimate falls below a threshold, best threshold:
    e.g. ``features-only`` and the layer's own per-token survival), the best fixed γ and the oracle; plus ``vs_*``
    ratios of the layer's speedup to the others'."""
    thr, L, checks = layer_lengths(costs)
    out = {"layer": {"threshold": thr, "predicted_speedup": round(predicted_speedup(L, csum, costs, checks), 4),
                     "mean_draft": round(float(L.mean()), 3)}}
    for rule, (feat, how, _) in RULES.items():
        if feat not in scalar_names:
            continue
        v = rule_values(rule, scalars, scalar_names)
        grid = np.unique(np.quantile(v, np.linspace(0, 1, 41)))
        out[rule] = best_over(grid, lambda t, v=v, how=how: rule_lengths(v, m, t, how, min_draft), csum, costs)
    grid = 1 / (1 + np.exp(-np.linspace(-7, 9, 81)))
    for name, surv in survivals.items():
        out[name] = best_over(grid, lambda t, surv=surv: rule_lengths(surv, m, t, "below", min_draft), csum, costs,
                              checks_for=lambda L: L)
    fixed = {g: predicted_speedup(np.minimum(m, g), csum, costs) for g in range(0, int(m.max()) + 1)}
    g = max(fixed, key=fixed.get)
    out["fixed"] = {"predicted_speedup": round(fixed[g], 4), "gamma": g}
    Lo = oracle_lengths(csum, m, costs)
    out["oracle"] = {"predicted_speedup": round(predicted_speedup(Lo, csum, costs), 4),
                     "mean_draft": round(float(Lo.mean()), 3)}
    for v in out.values():
        v.pop("lengths", None)
    s = out["layer"]["predicted_speedup"]
    for k in (*RULES, "features-only", "oracle"):
        if k in out:
            out[f"vs_{k}"] = round(s / out[k]["predicted_speedup"], 4)
    return out

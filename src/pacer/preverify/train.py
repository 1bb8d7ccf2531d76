"""``pacer train`` / ``pacer tune``: fit the pre-verification layer (or the SpecDec++ head) and choose its threshold.

Data: the rounds recorded by ``pacer collect`` (every round drafted ``max_draft`` tokens), greedy and sampled. Split:
by prompt, seeded (``val_frac`` of the prompts held out). Targets: greedy rounds - the hard labels (token accepted
given its prefix was, over ``cond_valid``; a block passes when it and every earlier one were accepted); sampled
rounds - the soft labels: ``min(1, p/q)`` per token (defined at every position: ``p`` is scored on the draft's own
prefix) and their running product as the block's survival (:mod:`validation`). Loss: class-weighted binary
cross-entropy (each class weighs half of the total), for PACER on both the per-token and the block targets; for the
SpecDec++ head on the per-token target.

Threshold (and block size) are chosen to maximise the *throughput predicted by a cost model from measured costs*:
on the validation rounds, a policy with threshold θ drafts ``L(θ)`` tokens in a round whose fixed-length draft had
``n*`` leading accepted tokens; that round then yields ``min(n*, L) + 1`` tokens at cost
``L · c_draft + c_target(L + 1) + policy overhead`` (``c_target(k)``: one target forward scoring ``k`` tokens,
nearly flat in ``k`` on CPUs). Predicted speedup over plain decoding = (tokens / cost) · c_target(1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save
from torch import nn

from ..bounds import MAX_EPOCHS, MAX_WIDTH, Count, non_finite
from ..costs import BadField, Costs
from ..errors import PacerError
from ..io import atomic_write_bytes
from ..policies.learned import check_cost, load_checkpoint, write_config
from .collect import load_dataset
from .features import SCALAR_GROUPS, FeatureSpec, needs_target_hidden
from .layer import PreVerifier, TokenHead, param_count
from .validation import (
    RULES,
    compare,
    ece,
    fit_features_only,
    oracle_lengths,
    predicted_speedup,
    profiles,
    roc_auc,
    rule_survival,
    survival_auc,
    survival_cumsum,
    survival_lengths,
)


# --------------------------------------------------------------------------------------------------------- data
@dataclass
class Rounds:
    """Recorded rounds padded to ``M = max_draft``: hidden ``[R, M, D]``, scalars ``[R, M, S]``, labels ``[R, M]``,
    ``valid [R, M]`` (position exists), ``cond [R, M]`` (prefix accepted), ``n_star [R]`` (accepted count),
    ``m [R]`` (drafted), ``prompt [R]``, ``soft [R, M]`` (``min(1, p/q)``), ``temperature [R]`` (0: greedy),
    ``category [R]`` (index into :data:`pacer.data.mix.CATEGORIES`, -1: not recorded)."""

    hidden: torch.Tensor
    scalars: torch.Tensor
    accepted: torch.Tensor
    valid: torch.Tensor
    cond: torch.Tensor
    n_star: torch.Tensor
    m: torch.Tensor
    prompt: torch.Tensor
    soft: torch.Tensor
    temperature: torch.Tensor
    category: torch.Tensor

    def select(self, idx: torch.Tensor) -> Rounds:
        return Rounds(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    def __len__(self) -> int:
        return int(self.n_star.shape[0])

    @property
    def sampled(self) -> torch.Tensor:
        return self.temperature > 0

    def survival(self) -> torch.Tensor:
        """``[R, M]`` survival targets (hard for greedy rounds, running product of ``soft`` for sampled ones)."""
        soft = torch.cumprod(torch.where(self.valid, self.soft, 0.0), 1)
        return torch.where(self.sampled[:, None], soft, self.accepted)

    def token_targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token conditional acceptance targets ``[R, M]`` and where they are defined."""
        y = torch.where(self.sampled[:, None], self.soft, self.accepted)
        return y, torch.where(self.sampled[:, None], self.valid, self.cond)


def to_rounds(data: dict[str, torch.Tensor], max_draft: int, target_hidden: bool = False) -> Rounds:
    """Pad a collection's token rows into rounds; with ``target_hidden`` (the collection must have recorded it) each
    token's hidden states are followed by the target's hidden state of its round (``FeatureSpec.target_hidden``)."""
    rid = data["round"].long()
    uniq, inv = torch.unique(rid, return_inverse=True)
    R, M = len(uniq), max_draft
    pos = data["position"].long() - 1
    keep = pos < M
    inv, pos = inv[keep], pos[keep]
    D, S = data["hidden"].shape[1], data["scalars"].shape[1]
    target = data.get("round_target_hidden") if target_hidden else None
    if target_hidden and target is None:
        raise PacerError("the features read the target's hidden state, which this collection did not record; "
                         "use a collection made with pacer collect --target-hidden")
    hidden = torch.zeros(R, M, D + (target.shape[1] if target is not None else 0))
    if target is not None:
        rows = torch.searchsorted(uniq, data["round_target_id"].long())
        if len(rows) != R or not torch.equal(uniq[rows.clamp_max(R - 1)], data["round_target_id"].long()):
            raise PacerError("the collection's per-round target hidden states do not match its rounds; collect "
                             "again into a new --out folder")
        hidden[rows, :, D:] = target.float()[:, None, :]
    scalars = torch.zeros(R, M, S)
    acc = torch.zeros(R, M)
    valid = torch.zeros(R, M, dtype=torch.bool)
    cond = torch.zeros(R, M, dtype=torch.bool)
    prompt = torch.zeros(R, dtype=torch.long)
    soft = torch.zeros(R, M)
    temperature = torch.zeros(R)
    category = torch.full((R,), -1, dtype=torch.long)
    soft[inv, pos] = data["soft"][keep].float()
    if "temperature" in data:  # collections before the mix recorded greedy rounds only
        temperature[inv] = data["temperature"][keep].float()
        category[inv] = data["category"][keep].long()
    hidden[inv, pos, :D] = data["hidden"][keep].float()
    scalars[inv, pos] = data["scalars"][keep].float()
    acc[inv, pos] = data["accepted"][keep].float()
    valid[inv, pos] = True
    cond[inv, pos] = data["cond_valid"][keep].bool()
    prompt[inv] = data["prompt"][keep].long()
    return Rounds(hidden, scalars, acc, valid, cond, acc.sum(1).long(), valid.sum(1).long(), prompt, soft,
                  temperature, category)


def split(rounds: Rounds, val_frac: float, seed: int) -> tuple[Rounds, Rounds]:
    prompts = torch.unique(rounds.prompt)
    g = torch.Generator().manual_seed(seed)
    perm = prompts[torch.randperm(len(prompts), generator=g)]
    n_val = max(1, int(round(len(prompts) * val_frac)))
    val_p = set(perm[:n_val].tolist())
    is_val = torch.tensor([int(p) in val_p for p in rounds.prompt.tolist()])
    return rounds.select(~is_val), rounds.select(is_val)


# ------------------------------------------------------------------------------------------------------ metrics
def precision_recall(scores: np.ndarray, labels: np.ndarray, thr: float) -> tuple[float, float]:
    """Precision/recall of the *fail* class (score < thr predicts a failing block): what stops drafting."""
    pred_fail = scores < thr
    fail = labels == 0
    tp = float((pred_fail & fail).sum())
    return (tp / pred_fail.sum() if pred_fail.any() else float("nan"),
            tp / fail.sum() if fail.any() else float("nan"))


# ----------------------------------------------------------------------------------------------------- costs
def simulate(lengths: np.ndarray, n_star: np.ndarray, costs: Costs, checks: np.ndarray | None = None) -> float:
    """Predicted speedup over plain decoding of drafting ``lengths[r]`` tokens in greedy rounds with ``n_star[r]``
    leading accepted tokens (:func:`validation.predicted_speedup` with hard survival)."""
    M = int(max(lengths.max(), n_star.max()))
    surv = (np.arange(1, M + 1)[None, :] <= n_star[:, None]).astype(float)
    return predicted_speedup(lengths, survival_cumsum(surv), costs, checks)


def stop_lengths(block_scores: np.ndarray, m: np.ndarray, block: int, thr: float, min_draft: int) -> np.ndarray:
    """Draft length per round when drafting stops after the first block scoring below ``thr`` (blocks ending at or
    beyond the drafted length ``m`` do not stop anything: the round drafted ``m``)."""
    K = block_scores.shape[1]
    ends = (np.arange(K) + 1) * block
    bad = (block_scores < thr) & (ends[None, :] >= min_draft) & (ends[None, :] < m[:, None])
    return np.where(bad.any(1), ends[bad.argmax(1)], m).astype(np.int64)


# --------------------------------------------------------------------------------------------------- training
def _weights(labels: torch.Tensor, weighted: bool = True) -> torch.Tensor | None:
    if not weighted:
        return None
    pos = labels.mean().clamp(1e-3, 1 - 1e-3)
    return torch.where(labels > 0.5, 0.5 / pos, 0.5 / (1 - pos))


def _normaliser(r: Rounds) -> tuple[torch.Tensor, torch.Tensor]:
    s = r.scalars[r.valid]
    return s.mean(0), s.std(0).clamp_min(1e-4)


def fit(kind: str, train: Rounds, block: int, epochs: int, seed: int, lr: float = 2e-3, d: int = 64,
        log=print, weighted: bool = True, token_weight: float = 0.5, rank: int = 0, dropout: float = 0.0,
        weight_decay: float = 1e-2, context: bool = True) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Train a ``pacer`` PreVerifier or a ``specdecpp`` TokenHead; returns the model and the scalar normaliser."""
    torch.manual_seed(seed)
    mu, sd = _normaliser(train)
    D, S, M = train.hidden.shape[2], train.scalars.shape[2], train.hidden.shape[1]
    model = PreVerifier(D, S, block, d, max_draft=M, rank=rank, dropout=dropout, context=context) \
        if kind == "pacer" else \
        TokenHead(D, S, d, rank=rank, dropout=dropout)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(seed)
    R = len(train)
    bs = 64
    for ep in range(epochs):
        perm = torch.randperm(R, generator=g)
        total = 0.0
        for i in range(0, R, bs):
            b = train.select(perm[i : i + bs])
            x_s = (b.scalars - mu) / sd
            y_t, mask = b.token_targets()  # conditional token targets, where defined
            if kind == "pacer":
                tok, blk = model(b.hidden, x_s)
                lt = nn.functional.binary_cross_entropy_with_logits(tok[mask], y_t[mask],
                                                                    weight=_weights(y_t[mask], weighted))
                k = blk.shape[1]
                ends = torch.arange(1, k + 1) * block - 1
                y_b = b.survival()[:, ends]
                m_b = b.valid[:, ends]
                lb = nn.functional.binary_cross_entropy_with_logits(blk[m_b], y_b[m_b],
                                                                    weight=_weights(y_b[m_b], weighted))
                loss = lb + token_weight * lt
            else:
                logit = model(b.hidden[mask], x_s[mask])
                loss = nn.functional.binary_cross_entropy_with_logits(logit, y_t[mask],
                                                                      weight=_weights(y_t[mask], weighted))
            if not bool(torch.isfinite(loss)):
                raise PacerError(f"training diverged: the loss is {float(loss.detach())} at epoch {ep + 1} (non-finite "
                                 f"features in the collection, or settings that overflow); no checkpoint is written: "
                                 f"check the collection (pacer collect again) and the training settings")
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
        if (bad := non_finite(model.named_parameters())) is not None:
            raise PacerError(f"training diverged: the layer's weight {bad} is not finite after epoch {ep + 1}; no "
                             f"checkpoint is written: check the collection and the training settings")
        if log and (ep + 1) % max(1, epochs // 5) == 0:
            log(f"  [{kind} b={block}] epoch {ep + 1}/{epochs} loss {total / R:.4f}")
    model.eval()
    return model, mu, sd


@torch.no_grad()
def scores(kind: str, model: nn.Module, r: Rounds, mu: torch.Tensor, sd: torch.Tensor) -> np.ndarray:
    """PACER: block pass probabilities ``[R, M // b]``; SpecDec++: per-token acceptance probabilities ``[R, M]``."""
    x_s = (r.scalars - mu) / sd
    if kind == "pacer":
        _, blk = model(r.hidden, x_s)
        return torch.sigmoid(blk).numpy()
    return torch.sigmoid(model(r.hidden, x_s)).numpy()


@torch.no_grad()
def token_survival(kind: str, model: nn.Module, r: Rounds, mu: torch.Tensor, sd: torch.Tensor) -> np.ndarray:
    """``[R, M]``: the model's survival estimate through every position, ``Π_{j<=i} σ(token logit_j)`` (PACER's
    token head, the SpecDec++ head)."""
    x_s = (r.scalars - mu) / sd
    logits = model(r.hidden, x_s)[0] if kind == "pacer" else model(r.hidden, x_s)
    return torch.sigmoid(logits).cumprod(-1).numpy()


def _sweep(kind: str, sc: np.ndarray, m: np.ndarray, csum: np.ndarray, block: int, costs: Costs,
           min_draft: int) -> tuple[list, tuple]:
    """Predicted speedup per threshold; the best ``(speedup, threshold, lengths, checks)``."""
    grid = 1 / (1 + np.exp(-np.linspace(-7, 9, 161)))  # uniform in logit space: fine near 0 and near 1
    sims, best = [], None
    for thr in grid:
        if kind == "pacer":
            L = stop_lengths(sc, m, block, thr, min_draft)
            checks = np.ceil(L / block)
        else:
            L = survival_lengths(sc, m, thr, min_draft)  # the SpecDec++ rule
            checks = L
        sp = predicted_speedup(L, csum, costs, checks)
        sims.append((sp, float(thr), float(L.mean())))
        if best is None or sp > best[0]:
            best = (sp, float(thr), L, checks)
    return sims, best


def evaluate(kind: str, model, val: Rounds, mu, sd, block: int, costs: Costs, min_draft: int = 1,
             baseline: nn.Module | None = None, scalar_names: list[str] | None = None,
             rule_scalars: torch.Tensor | None = None) -> dict:
    """Validation metrics, the cost-model-optimal threshold and, with ``baseline`` (the features-only model), the
    comparison of :func:`validation.compare` for every cost profile, and for the measured costs per group (greedy /
    sampled rounds, prompt category). The rules read ``rule_scalars`` (named ``scalar_names``; default: the
    model's own ``val.scalars``), the recorded scalars where the model reads fewer."""
    sc = scores(kind, model, val, mu, sd)
    m = val.m.numpy()
    surv = val.survival().numpy()
    csum = survival_cumsum(surv)
    sims, best = _sweep(kind, sc, m, csum, block, costs, min_draft)
    res: dict = {"threshold": best[1], "predicted_speedup": round(best[0], 4),
                 "mean_draft": round(float(best[2].mean()), 3),
                 "sweep": [{"threshold": t, "predicted_speedup": round(sp, 4), "mean_draft": round(ml, 3)}
                           for sp, t, ml in sims]}
    hard = val.accepted.numpy()
    if kind == "pacer":
        K = sc.shape[1]
        ends = np.arange(1, K + 1) * block - 1
        y, target = hard[:, ends], surv[:, ends]
        ok = val.valid.numpy()[:, ends]
        s_flat, y_flat, t_flat = sc[ok], y[ok], target[ok]
        per_pos = []
        for k in range(K):
            sel = ok[:, k]
            if sel.any():
                per_pos.append({"block": k + 1, "n": int(sel.sum()), "mean_score": round(float(sc[sel, k].mean()), 4),
                                "pass_rate": round(float(target[sel, k].mean()), 4),
                                "auc": round(roc_auc(sc[sel, k], y[sel, k]), 4)})
        res["calibration"] = per_pos
    else:
        y_t, mask = val.token_targets()
        c = mask.numpy()
        s_flat, y_flat, t_flat = sc[c], hard[c], y_t.numpy()[c]
    res["auc"] = round(roc_auc(s_flat, y_flat), 4)  # against what verification decided (the hard realisation)
    res["ece"] = round(ece(s_flat, t_flat), 4)
    p, rcl = precision_recall(s_flat, y_flat, res["threshold"] if kind == "pacer" else 0.5)
    res["fail_precision"], res["fail_recall"] = round(float(p), 4), round(float(rcl), 4)
    fixed = {g: predicted_speedup(np.minimum(m, g), csum, costs) for g in range(0, int(m.max()) + 1)}
    res["best_fixed_gamma"] = max(fixed, key=fixed.get)
    res["best_fixed_predicted_speedup"] = round(max(fixed.values()), 4)
    res["oracle_predicted_speedup"] = round(predicted_speedup(oracle_lengths(csum, m, costs), csum, costs), 4)
    if baseline is None or scalar_names is None:
        return res
    with torch.no_grad():
        base = torch.sigmoid(baseline((val.scalars - mu) / sd).squeeze(-1)).cumprod(-1).numpy()
    raw = (val.scalars if rule_scalars is None else rule_scalars).numpy()
    survivals = {"features-only": base, "layer-per-token": token_survival(kind, model, val, mu, sd)}
    res["survival_auc"] = survival_auc({**survivals, **rule_survival(raw, scalar_names)}, hard > 0.5,
                                       val.valid.numpy())

    def groups(sel: np.ndarray, cst: Costs) -> dict:
        return compare(lambda c: _sweep(kind, sc[sel], m[sel], csum[sel], block, c, min_draft)[1][1:],
                       csum[sel], m[sel], raw[sel], scalar_names, {k: v[sel] for k, v in survivals.items()}, cst,
                       min_draft)

    everything = np.ones(len(val), dtype=bool)
    res["compare"] = {name: groups(everything, c) for name, c in profiles(costs, int(m.max())).items()}
    from ..data.mix import CATEGORIES

    sel = {"greedy": ~val.sampled.numpy(), "sampled": val.sampled.numpy(),
           **{c: val.category.numpy() == i for i, c in enumerate(CATEGORIES)}}
    res["groups"] = {name: {"rounds": int(g.sum()), **{p: groups(g, c) for p, c in profiles(costs, int(m.max())).items()
                                                       if p in ("measured", "flat")}}
                     for name, g in sel.items() if g.sum() >= 20}
    return res


def _chosen(data: str, rounds: int, mode: str | None = None) -> str:
    """How a threshold recorded by :func:`rule_thresholds` / :func:`layer_thresholds` was chosen."""
    return (f"highest predicted speedup on the validation split of {data} ({rounds} {mode + ' ' if mode else ''}"
            f"rounds of held-out collection prompts, never benchmark questions) under the checkpoint's costs")


def _by_mode(groups: dict | None, name: str, data: str, suffix: str = "") -> dict:
    """``name``'s threshold chosen on the validation split's greedy rounds and on its sampled ones alone, from the
    validation report's per-group comparisons (the modes it has)."""
    out = {}
    for mode in ("greedy", "sampled"):
        g = (groups or {}).get(mode)
        m = (g or {}).get("measured", {}).get(name)
        if m and "threshold" in m:
            out[mode] = {"threshold": round(m["threshold"], 5), "predicted_speedup": m["predicted_speedup"],
                         "mean_draft": m["mean_draft"], "rounds": g["rounds"],
                         "chosen": _chosen(data, g["rounds"], mode) + suffix}
    return out


def rule_thresholds(compared: dict, rounds: int, data: str, groups: dict | None = None) -> dict:
    """The training-free rules' thresholds chosen by the fair protocol: each rule's threshold of highest predicted
    speedup on the validation split (held-out collection prompts, never benchmark questions) under the checkpoint's
    costs - as the layer's own threshold is chosen - with how it was chosen (``pacer bench`` runs them as
    ``rule:threshold=validation`` and says so in its report). ``groups`` (the validation report's per-group
    comparisons): each rule also gets ``by_mode``, its threshold chosen the same way on the split's greedy rounds
    and on its sampled ones alone (a greedy benchmark runs the greedy one: the rules' best, not a compromise)."""
    suffix = ", as the layer's threshold"
    out = {}
    for rule in RULES:
        if rule in compared:
            c = compared[rule]
            out[rule] = {"threshold": c["threshold"], "predicted_speedup": c["predicted_speedup"],
                         "mean_draft": c["mean_draft"], "chosen": _chosen(data, rounds) + suffix}
            if by_mode := _by_mode(groups, rule, data, suffix):
                out[rule]["by_mode"] = by_mode
    return out


def layer_thresholds(groups: dict | None, data: str) -> dict:
    """The layer's own threshold chosen per decoding mode as :func:`rule_thresholds` chooses the rules', for
    ``pacer bench``'s ``pacer:threshold=validation``: the layer at its best in each mode, as the rules are."""
    return _by_mode(groups, "layer", data)


def without_scalars(spec: FeatureSpec, names: tuple[str, ...] | list[str]) -> tuple[FeatureSpec, torch.Tensor]:
    """``spec`` without the scalars ``names`` and the indices of the scalars it keeps; a one-line error for a name
    the collection did not record."""
    unknown = [n for n in names if n not in spec.scalar_names]
    if unknown:
        raise PacerError(f"scalar(s) {', '.join(unknown)} not recorded in this collection (recorded: "
                         f"{', '.join(spec.scalar_names)})")
    keep = [i for i, n in enumerate(spec.scalar_names) if n not in names]
    if not keep:
        raise PacerError("leave at least one scalar feature")
    return replace(spec, scalar_names=tuple(spec.scalar_names[i] for i in keep)), torch.tensor(keep)


#: ablation group of the target's hidden state (not a scalar group)
TARGET_HIDDEN = "target-hidden"
ABLATION_GROUPS = (*SCALAR_GROUPS, TARGET_HIDDEN)


def ablation(kind: str, tr: Rounds, va: Rounds, spec: FeatureSpec, groups: list[str], full: dict, block: int,
             epochs: int, seed: int, costs: Costs, min_draft: int, log=print, **fit_kw) -> dict:
    """For each group of :data:`ABLATION_GROUPS` the model reads (a group of scalars, or the target's hidden
    state), the same model trained and evaluated (threshold chosen the same way, same split and seed) without that
    group: its predicted speedup under ``costs`` and its ratio to the full model's (``full``: the full model's
    validation report), its block AUC and survival AUC. A ratio below 1 says the group helped."""
    out = {}
    for g in groups:
        if g == TARGET_HIDDEN:  # the target's hidden state, after the draft's in every token's hidden
            if not spec.target_hidden:
                continue
            present = [f"target hidden state ({spec.target_hidden} values)"]
            D = spec.hidden_dim
            tr_g, va_g = replace(tr, hidden=tr.hidden[..., :D]), replace(va, hidden=va.hidden[..., :D])
        elif g not in SCALAR_GROUPS:
            raise PacerError(f"unknown ablation group '{g}' (known: {', '.join(ABLATION_GROUPS)})")
        else:
            present = [n for n in SCALAR_GROUPS[g] if n in spec.scalar_names]
            if not present:
                continue
            _, keep = without_scalars(spec, present)
            tr_g, va_g = replace(tr, scalars=tr.scalars[..., keep]), replace(va, scalars=va.scalars[..., keep])
        if log:
            log(f"ablation: without {g} ({', '.join(present)})")
        model, mu, sd = fit(kind, tr_g, block, epochs, seed, log=None, **fit_kw)
        ev = evaluate(kind, model, va_g, mu, sd, block, costs, min_draft)
        surv = token_survival(kind, model, va_g, mu, sd)
        auc = survival_auc({"layer-per-token": surv}, va_g.accepted.numpy() > 0.5, va_g.valid.numpy())
        out[g] = {"dropped": present, "predicted_speedup": ev["predicted_speedup"],
                  "vs_full": round(ev["predicted_speedup"] / full["predicted_speedup"], 4),
                  "mean_draft": ev["mean_draft"], "auc": ev["auc"],
                  "survival_auc": auc["layer-per-token"]}
    return out


def save_checkpoint(out: Path, kind: str, model: nn.Module, mu, sd, config: dict) -> None:
    """``weights.safetensors`` + ``config.json``, each written atomically (config last: it marks completeness)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    tensors["norm.mean"], tensors["norm.std"] = mu.contiguous(), sd.contiguous()
    atomic_write_bytes(out / "weights.safetensors", save(tensors))
    import hashlib

    config = {**config, "kind": kind, "params": param_count(model),
              "weights_sha256": hashlib.sha256((out / "weights.safetensors").read_bytes()).hexdigest()}
    write_config(out, config)


def train(data_dir: Path, out: Path, kind: str = "pacer", block: int = 4, epochs: int = 20, seed: int = 0,
          val_frac: float = 0.2, costs: Costs | None = None, min_draft: int = 1, d: int = 64,
          hidden_layers: tuple[int, ...] | None = None, log=print, weighted: bool = True,
          token_weight: float = 0.5, rank: int = 8, dropout: float = 0.5, weight_decay: float = 0.05,
          check_seconds: float | None = None, drop_scalars: tuple[str, ...] = (), ablate: tuple[str, ...] = (),
          context: bool = True, target_hidden: bool = True) -> dict:
    """Train, evaluate and save one checkpoint; returns its config (with the validation report).

    The cost of one policy check enters the cost model that picks the threshold; it is measured on this machine
    (:func:`check_cost`) unless ``check_seconds`` is given. A measured time varies run to run, so the chosen
    threshold can too; with ``check_seconds`` fixed, training with the same seed is reproducible. ``drop_scalars``:
    scalar features the model does not read (the checkpoint's spec names the rest); ``ablate``: groups of
    :data:`ABLATION_GROUPS` (``all``: every one) to retrain without, one at a time, for
    the checkpoint's ``ablation`` report (:func:`ablation`); ``target_hidden``: read the target's hidden state where
    the collection recorded it."""
    if kind not in ("pacer", "specdecpp"):
        raise PacerError(f"unknown kind '{kind}' (use pacer or specdecpp)")
    if block not in (1, 2, 4, 8, 16):
        raise PacerError(f"--block must be one of 1, 2, 4, 8, 16, got {block}")
    Count("--d", 1, MAX_WIDTH).check(d)
    Count("--rank", 0, MAX_WIDTH).check(rank)
    Count("--epochs", 1, MAX_EPOCHS).check(epochs)
    if not (math.isfinite(token_weight) and token_weight >= 0):  # NaN passes a bare `< 0`
        raise PacerError(f"--token-weight must be a finite number >= 0, got {token_weight}")
    if not 0.0 < val_frac < 1.0:
        raise PacerError(f"--val-frac must be in (0, 1), got {val_frac}")
    data, manifest = load_dataset(data_dir)
    try:
        spec = FeatureSpec.from_dict(manifest.get("feature_spec"))
        if costs is None and "costs" in manifest:
            costs = Costs.from_dict(manifest["costs"], free_draft=True)
    except BadField as e:
        raise PacerError(f"the collection {data_dir}: its manifest's {e}; collect it again (pacer collect)") from None
    missing = [L for L in hidden_layers or () if L not in spec.hidden_layers]
    if missing:
        raise PacerError(f"--layers {','.join(map(str, missing))}: not recorded in {data_dir} (recorded: "
                         f"{','.join(map(str, spec.hidden_layers))})")
    if costs is None:
        raise PacerError("no measured costs: pass --costs FILE (made by `pacer tune --measure-costs`)")
    if hidden_layers is not None:  # ablation: keep a subset of the recorded layers
        H = spec.hidden_size
        cols = [c for L in hidden_layers for c in range(spec.hidden_layers.index(L) * H,
                                                         (spec.hidden_layers.index(L) + 1) * H)]
        data["hidden"] = data["hidden"][:, cols]
        spec = replace(spec, hidden_layers=tuple(hidden_layers))
    if not target_hidden:
        spec = replace(spec, target_hidden=0)
    rounds = to_rounds(data, spec.max_draft, target_hidden=needs_target_hidden(spec))
    raw_names = list(spec.scalar_names)  # the rules read the draft's scalars whatever the model reads
    if drop_scalars:
        spec, keep = without_scalars(spec, drop_scalars)
    groups = list(ABLATION_GROUPS) if "all" in ablate else list(ablate)
    unknown = [g for g in groups if g not in ABLATION_GROUPS]
    if unknown:
        raise PacerError(f"unknown ablation group(s) {', '.join(unknown)} (known: {', '.join(ABLATION_GROUPS)}, "
                         f"all)")
    tr, va_raw = split(rounds, val_frac, seed)
    if not len(tr) or not len(va_raw):  # an untrained layer, or a threshold chosen on nothing
        n = len(torch.unique(rounds.prompt))
        raise PacerError(f"the collection {data_dir} holds {n} prompt(s): too few to train on some and hold out "
                         f"--val-frac {val_frac} of them for validation; collect more (pacer collect --n)")
    va = va_raw
    if drop_scalars:
        tr, va = replace(tr, scalars=tr.scalars[..., keep]), replace(va_raw, scalars=va_raw.scalars[..., keep])
    t0 = time.perf_counter()
    model, mu, sd = fit(kind, tr, block, epochs, seed, d=d, log=log, weighted=weighted, token_weight=token_weight,
                        rank=rank, dropout=dropout, weight_decay=weight_decay, context=context)
    secs = time.perf_counter() - t0
    check = check_cost(kind, model, spec) if check_seconds is None else check_seconds
    costs = Costs(costs.draft, costs.target, check)
    y_t, mask = tr.token_targets()
    baseline = fit_features_only((tr.scalars - mu) / sd, y_t, mask, seed=seed)
    report = evaluate(kind, model, va, mu, sd, block, costs, min_draft, baseline, raw_names, va_raw.scalars)
    fit_kw = {"d": d, "weighted": weighted, "token_weight": token_weight, "rank": rank, "dropout": dropout,
              "weight_decay": weight_decay, "context": context}
    ablated = ablation(kind, tr, va, spec, groups, report, block, epochs, seed, costs, min_draft, log, **fit_kw) \
        if groups else None
    cfg = {
        "format": "pacer-preverifier/1",
        "data": {k: manifest[k] for k in ("source", "temperatures", "mix", "max_new_tokens") if k in manifest},
        "feature_spec": spec.to_dict(),
        "block": block if kind == "pacer" else 1,
        "d": d,
        "rank": rank,
        **({"context": False} if kind == "pacer" and not context else {}),
        "params": param_count(model),
        "check_seconds": check,
        "check_cost_vs_draft_token": round(check / costs.draft, 5),
        "threshold": report["threshold"],
        "min_draft": min_draft,
        "max_draft": spec.max_draft,
        "backend": manifest.get("backend", "transformers"),
        "draft_fingerprint": manifest["draft"],
        "target_fingerprint": manifest["target"],
        "costs": costs.to_dict(),
        "train": {"data": str(data_dir), "rounds_train": len(tr), "rounds_val": len(va), "epochs": epochs,
                  "seed": seed, "val_frac": val_frac, "seconds": round(secs, 1), "class_weighted": weighted,
                  "token_loss_weight": token_weight, "dropout": dropout, "weight_decay": weight_decay,
                  "prompts": int(manifest["prompts_done"])},
        "validation": {k: v for k, v in report.items() if k != "sweep"},
        "sweep": report["sweep"],
        "rules": rule_thresholds(report["compare"]["measured"], len(va), str(data_dir), report.get("groups")),
        "threshold_by_mode": layer_thresholds(report.get("groups"), str(data_dir)),
    }
    if drop_scalars:
        cfg["train"]["dropped_scalars"] = list(drop_scalars)
    if ablated is not None:
        cfg["ablation"] = ablated
    if out is not None:
        save_checkpoint(out, kind, model, mu, sd, cfg)
    return cfg


def retune(ckpt: Path, data_dir: Path, costs: Costs, min_draft: int | None = None, held_out: bool = False) -> dict:
    """Re-choose the threshold of an existing checkpoint for new costs (e.g. measured on another machine, or with a
    reduced draft vocabulary). It is tuned on the validation split of ``data_dir``, or on all of it with
    ``held_out`` (a collection none of whose prompts trained the checkpoint)."""
    model, mu, sd, cfg = load_checkpoint(ckpt)
    data, manifest = load_dataset(data_dir)
    spec = FeatureSpec.from_dict(cfg["feature_spec"])
    rounds = to_rounds(data, spec.max_draft, target_hidden=needs_target_hidden(spec))
    va = rounds if held_out else split(rounds, cfg["train"]["val_frac"], cfg["train"]["seed"])[1]
    md = cfg["min_draft"] if min_draft is None else min_draft
    costs = costs.chain(float(cfg["check_seconds"]) if "check_seconds" in cfg else None)
    report = evaluate(cfg["kind"], model, va, mu, sd, cfg["block"], costs, md)
    cfg.update(threshold=report["threshold"], costs=costs.to_dict(), min_draft=md,
               validation={k: v for k, v in report.items() if k != "sweep"}, sweep=report["sweep"],
               tuned={"data": str(data_dir), "rounds": len(va), "held_out": held_out,
                      "draft_vocab": manifest.get("draft_vocab", "not recorded")})
    write_config(ckpt, cfg)
    return cfg

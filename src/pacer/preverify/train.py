"""``pacer train`` / ``pacer tune``: fit the pre-verification layer (or the SpecDec++ head) and choose its threshold.

Data: the rounds recorded by ``pacer collect`` (every round drafted ``max_draft`` tokens). Split: by prompt, seeded
(``val_frac`` of the prompts held out). Loss: class-weighted binary cross-entropy (each class weighs half of the
total), for PACER on both the per-token conditional labels (token accepted given its prefix was, over ``cond_valid``)
and the block labels (the block's last token's ``accepted``: the block and all before it accepted); for the
SpecDec++ head on the conditional per-token label over the tokens whose prefix was accepted (``cond_valid``).

Threshold (and block size) are chosen to maximise the *throughput predicted by a cost model from measured costs*:
on the validation rounds, a policy with threshold θ drafts ``L(θ)`` tokens in a round whose fixed-length draft had
``n*`` leading accepted tokens; that round then yields ``min(n*, L) + 1`` tokens at cost
``L · c_draft + c_target(L + 1) + policy overhead`` (``c_target(k)``: one target forward scoring ``k`` tokens,
nearly flat in ``k`` on CPUs). Predicted speedup over plain decoding = (tokens / cost) · c_target(1).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save
from torch import nn

from ..costs import Costs
from ..errors import PacerError
from ..io import atomic_write_bytes, atomic_write_text
from .collect import load_dataset
from .features import FeatureSpec
from .layer import PreVerifier, TokenHead, param_count


# --------------------------------------------------------------------------------------------------------- data
@dataclass
class Rounds:
    """Recorded rounds padded to ``M = max_draft``: hidden ``[R, M, D]``, scalars ``[R, M, S]``, labels ``[R, M]``,
    ``valid [R, M]`` (position exists), ``cond [R, M]`` (prefix accepted), ``n_star [R]`` (accepted count),
    ``m [R]`` (drafted), ``prompt [R]``."""

    hidden: torch.Tensor
    scalars: torch.Tensor
    accepted: torch.Tensor
    valid: torch.Tensor
    cond: torch.Tensor
    n_star: torch.Tensor
    m: torch.Tensor
    prompt: torch.Tensor

    def select(self, idx: torch.Tensor) -> Rounds:
        return Rounds(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    def __len__(self) -> int:
        return int(self.n_star.shape[0])


def to_rounds(data: dict[str, torch.Tensor], max_draft: int) -> Rounds:
    rid = data["round"].long()
    uniq, inv = torch.unique(rid, return_inverse=True)
    R, M = len(uniq), max_draft
    pos = data["position"].long() - 1
    keep = pos < M
    inv, pos = inv[keep], pos[keep]
    D, S = data["hidden"].shape[1], data["scalars"].shape[1]
    hidden = torch.zeros(R, M, D)
    scalars = torch.zeros(R, M, S)
    acc = torch.zeros(R, M)
    valid = torch.zeros(R, M, dtype=torch.bool)
    cond = torch.zeros(R, M, dtype=torch.bool)
    prompt = torch.zeros(R, dtype=torch.long)
    hidden[inv, pos] = data["hidden"][keep].float()
    scalars[inv, pos] = data["scalars"][keep].float()
    acc[inv, pos] = data["accepted"][keep].float()
    valid[inv, pos] = True
    cond[inv, pos] = data["cond_valid"][keep].bool()
    prompt[inv] = data["prompt"][keep].long()
    return Rounds(hidden, scalars, acc, valid, cond, acc.sum(1).long(), valid.sum(1).long(), prompt)


def split(rounds: Rounds, val_frac: float, seed: int) -> tuple[Rounds, Rounds]:
    prompts = torch.unique(rounds.prompt)
    g = torch.Generator().manual_seed(seed)
    perm = prompts[torch.randperm(len(prompts), generator=g)]
    n_val = max(1, int(round(len(prompts) * val_frac)))
    val_p = set(perm[:n_val].tolist())
    is_val = torch.tensor([int(p) in val_p for p in rounds.prompt.tolist()])
    return rounds.select(~is_val), rounds.select(is_val)


# ------------------------------------------------------------------------------------------------------ metrics
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


def precision_recall(scores: np.ndarray, labels: np.ndarray, thr: float) -> tuple[float, float]:
    """Precision/recall of the *fail* class (score < thr predicts a failing block): what stops drafting."""
    pred_fail = scores < thr
    fail = labels == 0
    tp = float((pred_fail & fail).sum())
    return (tp / pred_fail.sum() if pred_fail.any() else float("nan"),
            tp / fail.sum() if fail.any() else float("nan"))


# ----------------------------------------------------------------------------------------------------- costs
def simulate(lengths: np.ndarray, n_star: np.ndarray, costs: Costs, checks: np.ndarray | None = None) -> float:
    """Predicted speedup over plain decoding of drafting ``lengths[r]`` tokens in each round ``r``."""
    tokens = np.minimum(n_star, lengths) + 1
    cost = lengths * costs.draft + np.array([costs.target_cost(int(L) + 1) for L in lengths])
    if checks is not None:
        cost = cost + checks * costs.policy_per_check
    return float(tokens.sum() / cost.sum() * costs.target_cost(1))


def stop_lengths(block_scores: np.ndarray, m: np.ndarray, block: int, thr: float, min_draft: int) -> np.ndarray:
    """Draft length per round when drafting stops after the first block scoring below ``thr``."""
    R, K = block_scores.shape
    out = np.empty(R, dtype=np.int64)
    for r in range(R):
        L = int(m[r])
        for k in range(K):
            end = (k + 1) * block
            if end >= m[r]:
                break
            if end >= min_draft and block_scores[r, k] < thr:
                L = end
                break
        out[r] = L
    return out


def specdec_lengths(token_probs: np.ndarray, m: np.ndarray, thr: float, min_draft: int) -> np.ndarray:
    """SpecDec++ rule: stop after token i once P(some of d_1..d_i rejected) = 1 - Π σ_j exceeds ``thr``."""
    surv = np.cumprod(token_probs, axis=1)
    out = np.empty(len(m), dtype=np.int64)
    for r in range(len(m)):
        L = int(m[r])
        for i in range(int(m[r]) - 1):
            if i + 1 >= min_draft and 1 - surv[r, i] > thr:
                L = i + 1
                break
        out[r] = L
    return out


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
        weight_decay: float = 1e-2) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Train a ``pacer`` PreVerifier or a ``specdecpp`` TokenHead; returns the model and the scalar normaliser."""
    torch.manual_seed(seed)
    mu, sd = _normaliser(train)
    D, S, M = train.hidden.shape[2], train.scalars.shape[2], train.hidden.shape[1]
    model = PreVerifier(D, S, block, d, max_draft=M, rank=rank, dropout=dropout) if kind == "pacer" else \
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
            if kind == "pacer":
                tok, blk = model(b.hidden, x_s)
                mask = b.cond  # conditional token labels: defined where the prefix was accepted
                lt = nn.functional.binary_cross_entropy_with_logits(tok[mask], b.accepted[mask],
                                                                    weight=_weights(b.accepted[mask], weighted))
                k = blk.shape[1]
                ends = torch.arange(1, k + 1) * block - 1
                y_b = b.accepted[:, ends]
                m_b = b.valid[:, ends]
                lb = nn.functional.binary_cross_entropy_with_logits(blk[m_b], y_b[m_b],
                                                                    weight=_weights(y_b[m_b], weighted))
                loss = lb + token_weight * lt
            else:
                mask = b.cond
                logit = model(b.hidden[mask], x_s[mask])
                loss = nn.functional.binary_cross_entropy_with_logits(logit, b.accepted[mask],
                                                                      weight=_weights(b.accepted[mask], weighted))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
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


def evaluate(kind: str, model, val: Rounds, mu, sd, block: int, costs: Costs, min_draft: int = 1) -> dict:
    """Validation metrics and the cost-model-optimal threshold."""
    sc = scores(kind, model, val, mu, sd)
    m, n_star = val.m.numpy(), val.n_star.numpy()
    grid = 1 / (1 + np.exp(-np.linspace(-7, 9, 161)))  # uniform in logit space: fine near 0 and near 1
    sims = []
    for thr in grid:
        if kind == "pacer":
            L = stop_lengths(sc, m, block, thr, min_draft)
            checks = np.ceil(L / block)
        else:
            L = specdec_lengths(sc, m, thr, min_draft)
            checks = L
        sims.append((simulate(L, n_star, costs, checks), float(thr), float(L.mean())))
    best = max(sims)
    res: dict = {"threshold": best[1], "predicted_speedup": round(best[0], 4), "mean_draft": round(best[2], 3),
                 "sweep": [{"threshold": t, "predicted_speedup": round(s, 4), "mean_draft": round(ml, 3)}
                           for s, t, ml in sims]}
    if kind == "pacer":
        K = sc.shape[1]
        ends = np.arange(1, K + 1) * block - 1
        y = val.accepted.numpy()[:, ends]
        ok = val.valid.numpy()[:, ends]
        s_flat, y_flat = sc[ok], y[ok]
        res["auc"] = round(roc_auc(s_flat, y_flat), 4)
        per_pos = []
        for k in range(K):
            sel = ok[:, k]
            if sel.any():
                per_pos.append({"block": k + 1, "n": int(sel.sum()), "mean_score": round(float(sc[sel, k].mean()), 4),
                                "pass_rate": round(float(y[sel, k].mean()), 4),
                                "auc": round(roc_auc(sc[sel, k], y[sel, k]), 4)})
        res["calibration"] = per_pos
    else:
        c = val.cond.numpy()
        s_flat, y_flat = sc[c], val.accepted.numpy()[c]
        res["auc"] = round(roc_auc(s_flat, y_flat), 4)
    p, rcl = precision_recall(s_flat, y_flat, res["threshold"] if kind == "pacer" else 0.5)
    res["fail_precision"], res["fail_recall"] = round(float(p), 4), round(float(rcl), 4)
    fixed = {g: simulate(np.minimum(m, g), n_star, costs) for g in range(1, int(m.max()) + 1)}
    res["best_fixed_gamma"] = max(fixed, key=fixed.get)
    res["best_fixed_predicted_speedup"] = round(max(fixed.values()), 4)
    res["oracle_predicted_speedup"] = round(simulate(n_star, n_star, costs), 4)
    return res


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
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")


def train(data_dir: Path, out: Path, kind: str = "pacer", block: int = 4, epochs: int = 20, seed: int = 0,
          val_frac: float = 0.2, costs: Costs | None = None, min_draft: int = 1, d: int = 64,
          hidden_layers: tuple[int, ...] | None = None, log=print, weighted: bool = True,
          token_weight: float = 0.5, rank: int = 8, dropout: float = 0.5, weight_decay: float = 0.05,
          check_seconds: float | None = None) -> dict:
    """Train, evaluate and save one checkpoint; returns its config (with the validation report).

    The cost of one policy check enters the cost model that picks the threshold; it is measured on this machine
    (:func:`check_cost`) unless ``check_seconds`` is given. A measured time varies run to run, so the chosen
    threshold can too; with ``check_seconds`` fixed, training with the same seed is reproducible."""
    if kind not in ("pacer", "specdecpp"):
        raise PacerError(f"unknown kind '{kind}' (use pacer or specdecpp)")
    if block not in (1, 2, 4, 8, 16):
        raise PacerError(f"--block must be one of 1, 2, 4, 8, 16, got {block}")
    if not 0.0 < val_frac < 1.0 or epochs < 1:
        raise PacerError(f"--val-frac must be in (0, 1) and --epochs >= 1, got {val_frac} and {epochs}")
    data, manifest = load_dataset(data_dir)
    spec = FeatureSpec.from_dict(manifest["feature_spec"])
    missing = [L for L in hidden_layers or () if L not in spec.hidden_layers]
    if missing:
        raise PacerError(f"--layers {','.join(map(str, missing))}: not recorded in {data_dir} (recorded: "
                         f"{','.join(map(str, spec.hidden_layers))})")
    if costs is None:
        if "costs" not in manifest:
            raise PacerError("no measured costs: pass --costs FILE (made by `pacer tune --measure-costs`)")
        costs = Costs.from_dict(manifest["costs"])
    if hidden_layers is not None:  # ablation: keep a subset of the recorded layers
        H = spec.hidden_size
        cols = [c for L in hidden_layers for c in range(spec.hidden_layers.index(L) * H,
                                                         (spec.hidden_layers.index(L) + 1) * H)]
        data["hidden"] = data["hidden"][:, cols]
        spec = FeatureSpec(tuple(hidden_layers), H, spec.max_draft, spec.scalar_names)
    rounds = to_rounds(data, spec.max_draft)
    tr, va = split(rounds, val_frac, seed)
    t0 = time.perf_counter()
    model, mu, sd = fit(kind, tr, block, epochs, seed, d=d, log=log, weighted=weighted, token_weight=token_weight,
                        rank=rank, dropout=dropout, weight_decay=weight_decay)
    secs = time.perf_counter() - t0
    check = check_cost(kind, model, spec) if check_seconds is None else check_seconds
    costs = Costs(costs.draft, costs.target, check)
    report = evaluate(kind, model, va, mu, sd, block, costs, min_draft)
    cfg = {
        "format": "pacer-preverifier/1",
        "feature_spec": spec.to_dict(),
        "block": block if kind == "pacer" else 1,
        "d": d,
        "rank": rank,
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
    }
    if out is not None:
        save_checkpoint(out, kind, model, mu, sd, cfg)
    return cfg


@torch.inference_mode()
def check_cost(kind: str, model: nn.Module, spec: FeatureSpec, reps: int = 30) -> float:
    """Median seconds of one policy check as the policy runs it: the layer over a full draft (PACER) or one
    token (SpecDec++), plus building the scalar features."""
    import statistics

    from ..policies import DraftState
    from .features import RoundHistory, scalar_features

    m = spec.max_draft if kind == "pacer" else 1
    state = DraftState(tokens=[0] * m, prob=[0.5] * m, top_prob=[0.6] * m, entropy=[1.0] * m)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")  # where the layer runs
    h = torch.randn(m, spec.hidden_dim, device=device)
    hist = RoundHistory()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        s = scalar_features(state, spec, hist).to(device)
        if kind == "pacer":
            model(h[None], s[None])
        else:
            model(h, s)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_costs(decoder) -> Costs:
    """This machine's costs for ``decoder`` with its draft vocabulary, measured afresh (:mod:`pacer.calibration`)."""
    return decoder.calibration(decoder.draft_rows(decoder.draft_vocab), refresh=True).costs


def retune(ckpt: Path, data_dir: Path, costs: Costs, min_draft: int | None = None, held_out: bool = False) -> dict:
    """Re-choose the threshold of an existing checkpoint for new costs (e.g. measured on another machine, or with a
    reduced draft vocabulary). It is tuned on the validation split of ``data_dir``, or on all of it with
    ``held_out`` (a collection none of whose prompts trained the checkpoint)."""
    from .policy import load_checkpoint

    model, mu, sd, cfg = load_checkpoint(ckpt)
    data, manifest = load_dataset(data_dir)
    spec = FeatureSpec.from_dict(cfg["feature_spec"])
    rounds = to_rounds(data, spec.max_draft)
    va = rounds if held_out else split(rounds, cfg["train"]["val_frac"], cfg["train"]["seed"])[1]
    md = cfg["min_draft"] if min_draft is None else min_draft
    costs = Costs(costs.draft, costs.target, float(cfg.get("check_seconds", costs.policy_per_check)))
    report = evaluate(cfg["kind"], model, va, mu, sd, cfg["block"], costs, md)
    cfg.update(threshold=report["threshold"], costs=costs.to_dict(), min_draft=md,
               validation={k: v for k, v in report.items() if k != "sweep"}, sweep=report["sweep"],
               tuned={"data": str(data_dir), "rounds": len(va), "held_out": held_out,
                      "draft_vocab": manifest.get("draft_vocab", "not recorded")})
    atomic_write_text(Path(ckpt) / "config.json", json.dumps(cfg, indent=2) + "\n")
    return cfg

"""The ``pacer`` and ``specdecpp`` draft-length policies, checkpoint loading, and what one check costs
(:func:`check_cost`, which training records in a checkpoint too).

``pacer``: drafts in blocks of ``b`` tokens; at every block boundary the pre-verification layer scores the block
(with the earlier blocks of the same draft as context) and drafting goes on only if the block passes
(``score >= threshold``). The whole failing block still goes to the target: verification costs the same.

``specdecpp``: after every token, stops once the head's probability that some drafted token is rejected,
``1 - Π_j σ_j``, exceeds the threshold.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import load_file

from .. import native
from ..bounds import non_finite
from ..costs import BadField, Costs, read_count, read_seconds, show_value
from ..errors import PacerError
from ..preverify.features import (
    SCALARS,
    FeatureSpec,
    RoundHistory,
    needs_target_hidden,
    needs_target_state,
    scalar_features,
)
from ..preverify.layer import PrefixState, PreVerifier, TokenHead
from ..rounds import DraftState, RoundResult
from .base import DraftPolicy

if TYPE_CHECKING:
    from ..pair import Pair

DEFAULT_CHECKPOINTS = {"pacer": "pacer-default", "specdecpp": "specdecpp-default"}


def default_checkpoint(kind: str, backend: str = "transformers") -> Path:
    """The shipped checkpoint of ``kind`` for features computed by ``backend`` (llama.cpp gives only the final
    hidden state, so its checkpoints read other features: ``pacer-llamacpp``)."""
    from .. import backends

    suffix = backends.get(backend).checkpoint_suffix
    name = f"{kind}-{suffix}" if suffix else DEFAULT_CHECKPOINTS[kind]
    return Path(str(resources.files("pacer") / "checkpoints" / name))


KINDS = ("pacer", "specdecpp")
#: the attention heads of :class:`pacer.preverify.layer.PreVerifier` (its ``d`` must be a multiple)
HEADS = 2


def config_sha256(cfg: dict) -> str:
    """The checksum a checkpoint's ``config.json`` records of the rest of itself (``config_sha256``)."""
    rest = {k: v for k, v in cfg.items() if k != "config_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def write_config(path: Path | str, cfg: dict) -> None:
    """Write a checkpoint's ``config.json`` (atomically) with the checksum of its content: every writer goes
    through here, so that :func:`read_config` can tell a file edited by hand."""
    from ..io import atomic_write_text

    cfg = {k: v for k, v in cfg.items() if k != "config_sha256"}
    atomic_write_text(Path(path) / "config.json", json.dumps({**cfg, "config_sha256": config_sha256(cfg)},
                                                             indent=2) + "\n")


def _threshold(t: object, name: str, unit: bool = False) -> None:
    """A threshold read from a checkpoint: a finite number (in ``[0, 1]`` with ``unit``: the layer's)."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or \
            (unit and not 0.0 <= t <= 1.0):
        raise BadField(f"{name} threshold is {show_value(t)} (want {'a number in [0, 1]' if unit else 'a number'})")


def _entries(d: dict, key: str, where: str = "") -> list[tuple[str, dict]]:
    """The ``{name: {...}}`` entries of an optional object field (:class:`BadField` where it is not one)."""
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, dict) or not all(isinstance(e, dict) for e in v.values()):
        raise BadField(f"{where}{key!r} is {show_value(v)} (want an object of objects)")
    return list(v.items())


def _check_config(cfg: object, whole: bool = True) -> tuple[dict, FeatureSpec | None]:
    """Every field a checkpoint's config is read for, of the right type and range (:class:`BadField` otherwise).
    ``whole``: a checkpoint to load (its spec, kind, weights' checksum, sizes and threshold required); else only
    the fields present are checked (``--validation`` reads the thresholds alone)."""
    if not isinstance(cfg, dict):
        raise BadField(f"it holds {show_value(cfg)}, not an object")

    def has(key: str) -> bool:
        return whole or key in cfg

    spec = FeatureSpec.from_dict(cfg.get("feature_spec")) if has("feature_spec") else None
    max_draft = spec.max_draft if spec is not None else None
    kind = cfg.get("kind")
    if has("kind") and kind not in KINDS:
        raise BadField(f"'kind' is {show_value(kind)} (want one of {', '.join(KINDS)})")
    digest = cfg.get("weights_sha256")
    if has("weights_sha256") and (not isinstance(digest, str) or len(digest) != 64):
        raise BadField(f"'weights_sha256' is {show_value(digest)} (want the weights' sha256)")
    for key in ("backend", "draft_fingerprint", "target_fingerprint"):
        if key in cfg and not isinstance(cfg[key], str | None):
            raise BadField(f"{key!r} is {show_value(cfg[key])} (want a string)")
    if has("d"):
        d = read_count(cfg.get("d"), "'d'", 1)
        if kind == "pacer" and d % HEADS:
            raise BadField(f"'d' is {d} (want a multiple of the layer's {HEADS} attention heads)")
    if (kind == "pacer" and has("block")) or "block" in cfg:
        block = read_count(cfg.get("block"), "'block'", 1)
        if max_draft is not None and block > max_draft:
            raise BadField(f"'block' is {block}, more than the features' max_draft {max_draft}")
    if not isinstance(cfg.get("context", True), bool):
        raise BadField(f"'context' is {show_value(cfg['context'])} (want true or false)")
    read_count(cfg.get("rank", 0), "'rank'", 0)
    md = read_count(cfg.get("min_draft", 1), "'min_draft'", 0)
    if max_draft is not None and md > max_draft:
        raise BadField(f"'min_draft' is {md}, more than the features' max_draft {max_draft}")
    if has("threshold"):
        _threshold(cfg.get("threshold"), "'threshold'", unit=True)
    for mode, v in _entries(cfg, "threshold_by_mode"):
        _threshold(v.get("threshold"), f"'threshold_by_mode'[{mode!r}]", unit=True)
    for rule, v in _entries(cfg, "rules"):
        _threshold(v.get("threshold"), f"'rules'[{rule!r}]")
        for mode, m in _entries(v, "by_mode", f"'rules'[{rule!r}]"):
            _threshold(m.get("threshold"), f"'rules'[{rule!r}]['by_mode'][{mode!r}]")
    if "check_seconds" in cfg:
        read_seconds(cfg["check_seconds"], "'check_seconds'", zero=True)
    if "costs" in cfg:
        try:
            Costs.from_dict(cfg["costs"], free_draft=True)
        except BadField as e:
            raise BadField(f"'costs': {e}") from None
    for key in ("train", "validation"):
        if key in cfg and not isinstance(cfg[key], dict):
            raise BadField(f"{key!r} is {show_value(cfg[key])} (want an object)")
    return cfg, spec


def read_config(path: Path | str, whole: bool = True) -> tuple[dict, FeatureSpec | None]:
    """``(config, feature spec)`` of the checkpoint in ``path``: the one checked reader of ``config.json``. Its
    ``config_sha256`` (written by :func:`write_config`) must match (a config written before the checksum existed
    is taken as it is), and every field it is read for must be of the right type and range; otherwise one line
    naming the file and the field (:class:`PacerError`). ``whole``: see :func:`_check_config`."""
    from ..io import read_json

    cfg_path = Path(path) / "config.json"
    if not cfg_path.exists():
        raise PacerError(f"'{path}' is not a pre-verifier checkpoint (no config.json); make one with `pacer train`")
    cfg = read_json(cfg_path, "checkpoint config", "it is corrupt: retrain or restore it")
    want = cfg.get("config_sha256") if isinstance(cfg, dict) else None
    if want is not None and want != config_sha256(cfg):
        raise PacerError(f"checkpoint config {cfg_path} was changed by hand (its config_sha256 does not match); "
                         f"retrain or restore it")
    try:
        return _check_config(cfg, whole)
    except BadField as e:
        raise PacerError(f"checkpoint config {cfg_path} is unusable: {e}; retrain or restore it") from None


def load_checkpoint(path: Path | str, draft_fingerprint: str | None = None, draft=None):
    """``(model, mu, sd, config)``; refuses a missing/corrupt checkpoint (its config read by :func:`read_config`,
    its weights checked against their sha256), one made for another draft model, or one whose features the draft
    (``draft``: a :class:`pacer.models.LoadedModel`: its backend, layers, hidden size) cannot give."""
    path = Path(path)
    cfg_path, w_path = path / "config.json", path / "weights.safetensors"
    if not cfg_path.exists() or not w_path.exists():
        raise PacerError(f"'{path}' is not a pre-verifier checkpoint (needs config.json and weights.safetensors); "
                         f"make one with `pacer train`")
    cfg, spec = read_config(path)
    assert spec is not None  # a whole checkpoint's
    kind = cfg["kind"]
    digest = hashlib.sha256(w_path.read_bytes()).hexdigest()
    if digest != cfg.get("weights_sha256"):
        raise PacerError(f"checkpoint weights {w_path} are corrupt (sha256 mismatch); retrain or restore them")
    made_on = cfg.get("backend", "transformers")
    if draft is not None and made_on != draft.backend:
        raise PacerError(f"checkpoint {path} reads features of the {made_on} backend, not of {draft.backend}; use a "
                         f"checkpoint trained on this backend (pacer collect/train --backend {draft.backend})")
    if draft_fingerprint is not None and cfg.get("draft_fingerprint") != draft_fingerprint:
        raise PacerError(
            f"checkpoint {path} was trained for draft model {str(cfg.get('draft_fingerprint'))[:16]}..., not for "
            f"this draft ({draft_fingerprint[:16]}...); collect and train one for this pair (pacer collect/train)"
        )
    if draft is not None:
        spec.check_fits(draft.layers, draft.hidden_size, f"this draft (checkpoint {path})")
    try:
        tensors = load_file(str(w_path))
    except Exception as e:  # safetensors raises several types on a damaged file
        raise PacerError(f"checkpoint weights {w_path} cannot be read ({e}); retrain or restore them") from e
    if (bad := non_finite(tensors)) is not None:  # NaN scores would stop or go on silently
        raise PacerError(f"checkpoint {path} holds non-finite weights ({bad}: NaN or infinite); retrain it (pacer "
                         f"train) from a sound collection")
    S = len(spec.scalar_names)
    if kind == "pacer":
        model = PreVerifier(spec.input_dim, S, cfg["block"], cfg["d"], max_draft=spec.max_draft,
                            rank=cfg.get("rank", 0), context=cfg.get("context", True))
    elif kind == "specdecpp":
        model = TokenHead(spec.input_dim, S, cfg["d"], rank=cfg.get("rank", 0))
    else:
        raise PacerError(f"checkpoint {path} has unknown kind '{kind}'")
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise PacerError(f"checkpoint {path} does not match its config ({str(e).splitlines()[0]})") from e
    model.eval()
    return model, tensors["norm.mean"], tensors["norm.std"], cfg


@torch.inference_mode()
def check_cost(kind: str, model: torch.nn.Module, spec: FeatureSpec, reps: int = 30) -> float:
    """Median seconds of one policy check as the policy runs it: building one token's scalar features and feeding
    it to the layer after the draft's earlier tokens (PACER: :meth:`PreVerifier.extend`, averaged over a draft
    of ``max_draft`` tokens) or scoring it alone (SpecDec++)."""
    import statistics

    m = spec.max_draft if kind == "pacer" else 1
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")  # where the layer runs
    h = torch.randn(m, spec.input_dim, device=device)
    hist = RoundHistory()
    times = []
    for _ in range(reps):
        memo, state = PrefixState(), DraftState()
        t = time.perf_counter()
        for i in range(m):  # the draft grows token by token, as in a round
            state.tokens.append(0)
            state.prob.append(0.5)
            state.top_prob.append(0.6)
            state.entropy.append(1.0)
            s = scalar_features(state, spec, hist, i).to(device)
            if kind == "pacer":
                model.extend(memo, h[i : i + 1], s)
            else:
                model(h[i : i + 1], s)
        times.append((time.perf_counter() - t) / m)
    return statistics.median(times)


#: :func:`check_cost` measured once per process for each (kind, weights, block, features): a policy is built for
#: every generation, and re-measuring (~20 ms on a 2-core CPU) would cost each request that and let the cost
#: rule's ``c_p`` - and so its decisions - drift between identical requests
_CHECK_SECONDS: dict[tuple, float] = {}


class _LearnedPolicy(DraftPolicy):
    """Shared parts: the feature spec, the scalar normaliser, the round history."""

    def __init__(self, model, mu, sd, cfg: dict, threshold: float | None = None, min_draft: int | None = None,
                 max_draft: int | None = None) -> None:
        spec = FeatureSpec.from_dict(cfg["feature_spec"])
        super().__init__(cfg.get("min_draft", 1) if min_draft is None else min_draft,
                         spec.max_draft if max_draft is None else max_draft)
        self.model, self.mu, self.sd, self.cfg, self.spec = model, mu, sd, cfg, spec
        self._mu_np, self._sd_np = mu.float().cpu().numpy(), sd.float().cpu().numpy()
        self._fns = [SCALARS[name] for name in spec.scalar_names]  # the raw scalars of a token, in order
        #: where the layer runs (with its normaliser): the CPU for a loaded checkpoint, whatever the draft's device
        self.device = mu.device
        #: ``None`` after construction: no threshold, the layer's survival score feeds the cost-aware rule
        #: (:mod:`pacer.policies.cost_aware`); the constructor's ``None`` means the checkpoint's threshold
        self.threshold: float | None = float(cfg["threshold"] if threshold is None else threshold)
        if not 0.0 <= self.threshold <= 1.0:
            raise PacerError(f"threshold must be in [0, 1], got {self.threshold}")
        self.hidden_layers = spec.hidden_layers
        self.needs_target_state = needs_target_state(spec)
        self.needs_target_hidden = needs_target_hidden(spec)
        self.hist = RoundHistory()
        key = (self.name, cfg.get("weights_sha256") or id(model), getattr(model, "block_size", 1), spec)
        if key not in _CHECK_SECONDS:
            _CHECK_SECONDS[key] = check_cost(self.name, model, spec, reps=10)
        self.check_seconds = _CHECK_SECONDS[key]

    def reset(self) -> None:
        self.hist.reset()

    def update(self, state: DraftState, result: RoundResult) -> None:
        self.hist.update(result.drafted, result.accepted, result.target_entropy, result.target_margin,
                         result.target_hidden)

    def inputs(self, state: DraftState, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states ``[n - start, D]`` and normalised scalars ``[n - start, S]`` of tokens ``start..n-1``, on
        the layer's device (the draft's hidden states, e.g. on a GPU, are moved in one transfer per check), each
        followed by the target's hidden state of the round where the layer reads it."""
        hidden = torch.stack(state.hidden[start:])[:, : self.spec.hidden_dim].to(self.device, torch.float32)
        if self.spec.target_hidden:
            t = self.hist.target_row(self.spec.target_hidden).to(self.device)
            hidden = torch.cat([hidden, t.expand(hidden.shape[0], -1)], 1)
        scalars = (scalar_features(state, self.spec, self.hist, start).to(self.device) - self.mu) / self.sd
        return hidden, scalars

    def inputs_numpy(self, state: DraftState, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`inputs` as float32 numpy arrays, for a layer on the CPU, without torch operations (each costs
        microseconds, and a check runs right after a draft forward has left the caches cold)."""
        rows = state.hidden[start:]
        hidden = np.stack([h.numpy() for h in rows]) if len(rows) > 1 else rows[0].numpy()[None]
        hidden = hidden[:, : self.spec.hidden_dim]
        if self.spec.target_hidden:
            t = self.hist.target_row(self.spec.target_hidden).numpy()
            hidden = np.concatenate([hidden, np.broadcast_to(t, (hidden.shape[0], t.shape[0]))], 1)
        scalars = np.array([self._raw_scalars(state, i) for i in range(start, state.n)],
                           np.float32).reshape(-1, len(self._fns))
        return hidden.astype(np.float32, copy=False), (scalars - self._mu_np) / self._sd_np

    def _raw_scalars(self, state: DraftState, i: int) -> list[float]:
        """Token ``i``'s scalar features before normalisation (``spec.scalar_names``' order)."""
        return [f(state, i, self.spec, self.hist) for f in self._fns]


class PacerPolicy(_LearnedPolicy):
    name = "pacer"

    def __init__(self, model: PreVerifier, mu, sd, cfg: dict, threshold: float | None = None,
                 min_draft: int | None = None, max_draft: int | None = None, block_size: int | None = None) -> None:
        super().__init__(model, mu, sd, cfg, threshold, min_draft, max_draft)
        self.block_size = block_size or model.block_size
        model.block_size = self.block_size
        self._new_memo()
        # the native check's inputs: a reused array of a token's raw scalars, the normaliser
        self._raw = (ctypes.c_float * max(len(self._fns), 1))()
        self._raw_addr = ctypes.addressof(self._raw)
        self._mu_c = np.ascontiguousarray(self._mu_np, np.float32)
        self._sd_c = np.ascontiguousarray(self._sd_np, np.float32)
        self._mu_addr, self._sd_addr = self._mu_c.ctypes.data, self._sd_c.ctypes.data
        self._cpu = None

    def block_score(self, state: DraftState) -> float:
        """The layer's score that the draft survives through its last complete block (``P(d_1..d_{b·j}`` all
        accepted``)``, ``j = ⌊n / b⌋``; 1.0 before the first block). The layer reads each drafted token once: a
        check feeds only the tokens drafted since the last (:meth:`PreVerifier.extend`); a draft that is not the
        one it has read starts over. On a CPU with :mod:`pacer.native` built, each token goes from the draft's
        state into the layer in one native call (:meth:`_check_native`)."""
        memo = self._memo
        if self._memo_of is not state or memo.n > state.n or self._memo_tokens != state.tokens[: memo.n]:
            memo = self._new_memo(state)
        if memo.n < state.n:
            logit = self._check_native(state, memo)
            if logit is False:
                logit = self._check(state, memo)
            self._memo_tokens = state.tokens[: memo.n]
            self._score = 1.0 if logit is None else 0.5 * (1.0 + math.tanh(0.5 * logit))  # σ, no overflow
        return self._score

    @torch.inference_mode()
    def _check(self, state: DraftState, memo: PrefixState) -> float | None:
        if self.device.type == "cpu" and all(h.device.type == "cpu" for h in state.hidden[memo.n :]):
            h, s = self.inputs_numpy(state, memo.n)  # numpy's rows straight into the CPU check
        else:
            h, s = self.inputs(state, memo.n)
        return self.model.extend(memo, h, s)

    def _check_native(self, state: DraftState, memo: PrefixState) -> float | None | bool:
        """Tokens ``memo.n..n-1`` straight from ``state`` into the layer's native check, one call each: the
        hidden row by its address, the raw scalars into a reused array (normalised in the call). ``False`` where
        it does not apply (no native kernels, the layer not on the CPU, the target's hidden state appended, a
        row that is not a float32 CPU row, a draft longer than the layer's positions): :meth:`_check` then."""
        k = native.kernels()
        if k is None or self.device.type != "cpu" or self.spec.target_hidden or state.n > self.spec.max_draft:
            return False
        rows = state.hidden[memo.n :]
        if not all(h.is_cpu and h.dtype == torch.float32 and h.dim() == 1 and h.is_contiguous()
                   and h.numel() >= self.spec.hidden_dim for h in rows):
            return False
        if memo.n == 0 or self._cpu is None:  # the layer's current weights, looked up once a draft
            self._cpu = self.model.cpu()
        cpu = self._cpu
        if cpu.pos.shape[0] < state.n:
            return False
        logit = None
        for i, h in enumerate(rows, start=memo.n):
            self._raw[:] = self._raw_scalars(state, i)
            logit = cpu.check(k, memo, h.data_ptr(), self._raw_addr, self._mu_addr, self._sd_addr, self.block_size)
        return logit

    def _new_memo(self, state: DraftState | None = None) -> PrefixState:
        self._memo, self._memo_of, self._memo_tokens, self._score = PrefixState(), state, [], 1.0
        return self._memo

    def should_continue(self, state: DraftState) -> bool:
        if state.n == 0 or state.n % self.block_size:
            return True  # decide at block boundaries only
        if state.n > self.spec.max_draft:
            return False
        return self.threshold is None or self.block_score(state) >= self.threshold

    def survival(self, state: DraftState) -> float:
        return self.block_score(state)

    def update(self, state: DraftState, result: RoundResult) -> None:
        super().update(state, result)
        self._new_memo()

    def reset(self) -> None:
        super().reset()
        self._new_memo()

    def describe(self) -> str:
        thr = "cost-aware" if self.threshold is None else f"{self.threshold:.2f}"
        return f"pacer(b={self.block_size}, threshold={thr}, min={self.min_draft}, max={self.max_draft})"


class SpecDecPPPolicy(_LearnedPolicy):
    name = "specdecpp"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.new_round()

    def new_round(self) -> None:
        """``survive`` = Π σ over this round's first ``scored`` draft tokens."""
        self.survive, self.scored = 1.0, 0

    def reset(self) -> None:
        super().reset()
        self.new_round()

    def update(self, state: DraftState, result: RoundResult) -> None:
        super().update(state, result)
        self.new_round()  # the loop asks from ``min_draft`` on, so ``n == 0`` cannot mark a round's start

    @torch.inference_mode()
    def _score_to(self, state: DraftState) -> float:
        """``Π σ_j`` over ``d_1..d_n``, scoring each token once (tokens below min_draft too, as the offline
        evaluation does)."""
        if state.n > self.scored:
            h, s = self.inputs(state, self.scored)
            self.survive *= float(torch.sigmoid(self.model(h, s)).prod())
            self.scored = state.n
        return self.survive

    def should_continue(self, state: DraftState) -> bool:
        if state.n == 0:
            return True
        if state.n > self.spec.max_draft:
            return False
        survive = self._score_to(state)
        return self.threshold is None or 1.0 - survive <= self.threshold

    def survival(self, state: DraftState) -> float:
        return self._score_to(state)


def make_learned_policy(kind: str, path: Path | str | None, draft_fingerprint: str | None, bounds: dict,
                        opts: dict, draft=None, target=None) -> DraftPolicy:
    """The ``kind`` policy of checkpoint ``path`` (``None``: the shipped one of the draft's backend); ``target``
    (a :class:`pacer.models.LoadedModel`): a checkpoint that reads the target's hidden state must have been
    trained for it (checked here, before any generation)."""
    ckpt = Path(path) if path else default_checkpoint(kind, draft.backend if draft is not None else "transformers")
    model, mu, sd, cfg = load_checkpoint(ckpt, draft_fingerprint, draft)
    if cfg["kind"] != kind:
        raise PacerError(f"checkpoint {ckpt} is a '{cfg['kind']}' checkpoint, not '{kind}'")
    size = FeatureSpec.from_dict(cfg["feature_spec"]).target_hidden
    if size and target is not None and (cfg.get("target_fingerprint") != target.fingerprint
                                        or target.hidden_size != size):
        raise PacerError(f"checkpoint {ckpt} reads the hidden state of target model "
                         f"{str(cfg.get('target_fingerprint'))[:16]}..., not of this target "
                         f"({target.fingerprint[:16]}...); collect and train one for this pair (pacer collect "
                         f"--target-hidden, pacer train)")
    cls = PacerPolicy if kind == "pacer" else SpecDecPPPolicy
    extra = {"block_size": opts.pop("block")} if kind == "pacer" and "block" in opts else {}
    if opts:
        known = "threshold, path, block" if kind == "pacer" else "threshold, path"
        raise PacerError(f"unknown {kind} option(s): {', '.join(opts)} (known: {known})")
    return cls(model, mu, sd, cfg, **bounds, **extra)


def load_policy(pair: Pair, kind: str, bounds: dict, opts: dict) -> DraftPolicy:
    """The policy of a loaded ``pair`` (for ``Decoder.make_policy``): ``opts`` may hold ``path``
    (checkpoint), ``threshold`` (absent: the checkpoint's; ``None``: none, for the cost-aware rule), ``block``."""
    opts = dict(opts)
    given = set(opts)  # "threshold": None asks for no threshold (the cost-aware rule decides)
    path = opts.pop("path", None)
    thr = opts.pop("threshold", None)
    if pair.draft_info is None:
        raise PacerError(f"method '{kind}' needs a draft model")
    backend = pair.draft_info.backend
    if path is None and not (default_checkpoint(kind, backend) / "config.json").exists():
        raise PacerError(f"no shipped {kind} checkpoint for the {backend} backend; pass a checkpoint folder as the "
                         f"option path (--preverifier)")
    pol = make_learned_policy(kind, path, pair.draft_info.fingerprint, {**bounds}, opts, pair.draft_info,
                              pair.target_info)
    if thr is not None or "threshold" in given:
        pol.threshold = None if thr is None else float(thr)
    return pol

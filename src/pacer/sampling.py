"""Logit warping, sampling and the verification rules of speculative decoding.

Terms (one round, one sequence):

* ``γ``  - number of draft tokens ``d_1..d_γ`` proposed in the round.
* ``q``  - draft distributions, tensor ``[γ, V]``; ``q[i]`` is the draft's distribution from which ``d_{i+1}`` was
  drawn (after the same temperature/top-k/top-p warping as the target).
* ``p``  - target distributions, tensor ``[γ + 1, V]``; ``p[i]`` is the target's next-token distribution after the
  prefix and ``d_1..d_i``. ``p[γ]`` gives the bonus token when every draft token is accepted.
* ``n``  - accepted draft tokens, ``0 <= n <= γ``. A round always emits ``n + 1`` tokens: ``d_1..d_n`` and one token
  from the target (the correction at the first rejection, or the bonus token).

Greedy verification keeps the longest prefix where ``d_{i+1} == argmax p[i]`` and emits ``argmax p[n]``: the output
is token for token the target's greedy output. Sampling verification (Leviathan et al. 2023; Chen et al. 2023)
accepts ``d_{i+1}`` with probability ``min(1, p[i][d] / q[i][d])`` and otherwise emits a sample from the normalised
residual ``max(0, p[i] - q[i])``: every emitted token is distributed exactly as the target's warped distribution.
Block verification (Sun et al., ICLR 2025; :func:`verify_block`, ``SamplingConfig(verify="block")``) decides on the
draft jointly: the same distribution, and at least as many accepted tokens a round in expectation.

Devices: sampling happens where the generator is, which the loop makes on the target's device
(:meth:`SamplingConfig.generator`), so the probabilities are not copied to the host; a drafter may propose ``q`` on
the host (prompt lookup's one-hot rows), which is then moved once per round. Each round reads back only what the
rule decides on: the draft tokens' ``p`` and ``q`` in one transfer, the uniforms (one at a time on the CPU, whose
stream of numbers stays as it was; all of a round's at once on a GPU) and the sampled token.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .errors import InvalidType, InvalidValue
from .native import row_stats_kernel

#: the verification rules of sampling: token by token (Leviathan et al. 2023) or the block jointly (Sun et al. 2025)
VERIFY_RULES = ("token", "block")

#: below this temperature :func:`warp` divides the logits exactly (shifted by their maximum, in float64) instead of
#: in float32 as they are
EXACT_BELOW = 1e-3
#: above this temperature too (``l / τ`` in float32 would take ``τ`` as ``inf``, and a masked id's ``-inf / inf``
#: is NaN)
EXACT_ABOVE = 1e30


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature == 0`` means greedy; top-k 0 and top-p 1.0 disable those filters.

    Every value is checked here, once, whichever entry point builds the config (the API, the command line, the
    server): a ``temperature`` that is finite and ``>= 0``, an integer ``top_k >= 0``, a ``top_p`` in ``(0, 1]``;
    anything else (NaN, infinities, negatives, ``top_p`` 0 or above 1) is a one-line
    :class:`~pacer.errors.InvalidValue`. Every value taken gives a distribution (:func:`warp`), at its limit where
    the law degenerates: a ``temperature`` as small as ``5e-324`` is the argmax (equal maxima share it), a huge
    one (up to ``1.7e308``) uniform over the ids scored; a ``top_p`` as small as ``5e-324`` (far below float32's
    smallest number) keeps the top token alone (the first of equal maxima, as greedy decoding), and ``top_k = 1``
    the top logit (equal ones all kept); a ``top_k`` of the vocabulary's size or more keeps every id."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    #: the sampling verification rule (:data:`VERIFY_RULES`): ``"token"`` (:func:`verify_sampling`) or ``"block"``
    #: (:func:`verify_block`); greedy decoding verifies by exact matching under either (the two agree there)
    verify: str = "token"

    def __post_init__(self) -> None:
        for name, kind in (("temperature", numbers.Real), ("top_k", numbers.Integral), ("top_p", numbers.Real),
                           ("seed", numbers.Integral)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, kind):
                raise InvalidType(f"{name} must be {'a number' if kind is numbers.Real else 'an integer'}, got {v!r}")
            if type(v) not in (int, float):  # numpy's numbers, say: as Python's
                object.__setattr__(self, name, int(v) if kind is numbers.Integral else float(v))
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidValue(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidValue(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:  # NaN fails this too
            raise InvalidValue(f"top_p must be in (0, 1], got {self.top_p}")
        if not -(1 << 63) <= self.seed < 1 << 64:  # what a generator takes
            raise InvalidValue(f"seed must be between -2**63 and 2**64 - 1, got {self.seed}")
        if not isinstance(self.verify, str):
            raise InvalidType(f"verify must be one of {', '.join(VERIFY_RULES)}, got {self.verify!r}")
        if self.verify not in VERIFY_RULES:
            raise InvalidValue(f"verify must be one of {', '.join(VERIFY_RULES)}, got {self.verify!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device: torch.device | str | None = None) -> torch.Generator:
        """A generator seeded with ``seed`` on ``device`` (default: the CPU). The loop makes it on the target's
        device; a CUDA generator draws other numbers than a CPU one from the same seed, so a seeded sample is
        reproducible on the same kind of device (and distributed as the target's samples on any)."""
        return torch.Generator(device=device or "cpu").manual_seed(self.seed)


def _on(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``t`` on the generator's device (a no-op where it is already there, as in the loop)."""
    return t if t.device == gen.device else t.to(gen.device)


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Float32 probabilities after temperature, top-k and top-p; ``logits`` is ``[..., V]`` (finite where scored,
    ``-inf`` where masked). Each row is a distribution for every config :class:`SamplingConfig` takes (its limits
    are stated there): never NaN, never all zeros."""
    logits = logits.float()
    if cfg.greedy:
        return torch.softmax(logits, dim=-1)
    if EXACT_BELOW <= cfg.temperature <= EXACT_ABOVE:
        logits = logits / cfg.temperature
    else:  # a tiny τ (1e-40) overflows l / τ to ±inf (inf - inf is NaN): shifted by the maximum first, in float64,
        # every logit but the largest goes to -inf and the largest stay 0 (the argmax, ties shared): the exact limit;
        # a huge τ (1e300) takes every finite logit to ~0 (uniform over the ids scored) and keeps -inf as it is
        shifted = logits.double() - logits.amax(-1, keepdim=True).double()
        logits = (shifted / cfg.temperature).float()
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        # stable: among equal logits the lowest id comes first (the argmax's order), so the top_p -> 0 limit is
        # the argmax, ties resolved as greedy decoding resolves them
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # keep the smallest set reaching top_p; the mass before a token is compared in float64 (a top_p below
        # float32's smallest subnormal, 1e-300, would round to 0 in float32 and mask every token), and the top
        # token is always kept (the limit of a tiny top_p: the argmax)
        remove = (probs.cumsum(-1, dtype=torch.float64) - probs.double()) >= cfg.top_p
        remove[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return torch.softmax(logits, dim=-1)


def draw(weights: torch.Tensor, gen: torch.Generator) -> int:
    """One index drawn with probability proportional to the non-negative ``weights`` (``[V]``, not necessarily
    normalised) by inverse transform: one uniform ``u`` from ``gen``, and the first index whose float64 cumulative
    sum exceeds ``u`` times the total (a zero weight is never drawn; weights that sum to zero, NaN or infinity are
    a ``ValueError``, never an id). The law of ``torch.multinomial(weights, 1)``
    at a fraction of its time on a CPU (0.11 ms against 2.2 ms for 152k ids on a 2-core Zen 5; once per drafted
    token when sampling)."""
    c = torch.cumsum(_on(weights, gen), 0, dtype=torch.float64)
    u = torch.rand(1, generator=gen, device=gen.device, dtype=torch.float64) * c[-1]
    i = int(torch.searchsorted(c, u, right=True))
    if i < c.numel():
        return i
    # u rounded up to the total (the last positive weight is meant), or nothing to draw from: never an arbitrary id
    total = float(c[-1])
    if not 0.0 < total < math.inf:
        raise ValueError(f"draw: the weights sum to {total}, not a positive finite number: nothing to draw from")
    return int(torch.searchsorted(c, c[-1:], right=False))


def argmax(t: torch.Tensor):
    """``t.argmax(-1).tolist()`` (an int for a ``[V]`` row, a list for ``[k, V]``), through numpy's vectorised argmax
    for a float32 tensor in CPU memory: about 6 µs for a 152k-id row against torch's ~80 µs on a 2-core Zen 5, paid
    for every drafted token and every verified row where the vocabulary is scored whole (llama.cpp). The same index
    either way: the first of equal maxima (a NaN counts as the maximum in both)."""
    if t.device.type == "cpu" and t.dtype == torch.float32:
        return t.detach().numpy().argmax(-1).tolist()
    return t.argmax(-1).tolist()


def pick(probs: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator) -> int:
    """The argmax (greedy) or a sample from ``probs`` (``[V]``, :func:`draw`)."""
    if cfg.greedy:
        return argmax(probs)
    return draw(probs, gen)


def greedy_prefix(draft: list[int], target_logits: torch.Tensor) -> list[int]:
    """The target's argmax of rows ``0..n`` of ``target_logits`` (``[γ + 1, V]``), ``n`` the first row whose
    argmax is not ``d_{n+1}`` (``γ`` where all agree): what :func:`verify_greedy` reads, without the passes over
    the rows after a rejection. Float32 rows in CPU memory row by row; elsewhere every row (one transfer)."""
    if target_logits.device.type != "cpu" or target_logits.dtype != torch.float32:
        return argmax(target_logits)
    a = target_logits.detach().numpy()
    t: list[int] = []
    for i in range(a.shape[0]):
        t.append(int(a[i].argmax()))
        if i >= len(draft) or t[i] != draft[i]:
            break
    return t


def verify_greedy(draft: list[int], target_logits: torch.Tensor, t: list[int] | None = None) -> tuple[int, int]:
    """Greedy rule: ``(n, token)`` with ``n`` the longest prefix of ``draft`` equal to the target's argmax (``t``:
    that argmax per row, where the caller has it already)."""
    t = argmax(target_logits) if t is None else t  # [γ + 1]
    n = 0
    while n < len(draft) and draft[n] == t[n]:
        n += 1
    return n, t[n]


def verify_sampling(
    draft: list[int], q: torch.Tensor | None, p: torch.Tensor, gen: torch.Generator
) -> tuple[int, int]:
    """Rejection-sampling rule: ``(n, token)`` where ``token`` is the residual sample or the bonus token."""
    if not draft:  # ``q`` may be None then
        return 0, draw(p[0], gen)
    p, q = _on(p, gen), _on(q, gen)
    pd, qd = _at(draft, p, q)
    cpu = gen.device.type == "cpu"
    rs = None if cpu else torch.rand(len(draft), generator=gen, device=gen.device).tolist()
    for i in range(len(draft)):
        r = torch.rand((), generator=gen, device=gen.device).item() if rs is None else rs[i]
        if r * qd[i] < pd[i]:  # r < p/q without dividing
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        # total == 0 only when p == q up to rounding, where rejection has probability ~0: fall back to p.
        return i, draw(residual if total > 0 else p[i], gen)
    return len(draft), draw(p[len(draft)], gen)


def block_weights(pd: list[float], qd: list[float]) -> list[float]:
    """Block verification's weights ``w_1..w_γ`` from the draft tokens' ``p`` and ``q`` (``pd[i - 1]``,
    ``qd[i - 1]`` are ``p_i(X_i)``, ``q_i(X_i)``): ``w_0 = 1``, ``w_i = min(w_{i-1} · p_i(X_i) / q_i(X_i), 1)``.
    A drawn token has ``q_i(X_i) > 0``; a zero there (never drawn, so only a drafter's own bookkeeping) counts
    as the ratio ``+inf`` where ``p_i(X_i) > 0``, as the token-level rule's ``r · q < p`` does."""
    w, out = 1.0, []
    for pi, qi in zip(pd, qd, strict=True):
        w = min(w * pi / qi, 1.0) if qi > 0 else (1.0 if pi > 0 and w > 0 else 0.0)
        out.append(w)
    return out


def block_thresholds(w: list[float], p: torch.Tensor, q: torch.Tensor) -> list[float]:
    """Block verification's thresholds ``h_1..h_γ`` (``γ = len(w)``; ``p`` ``[γ + 1, V]`` and ``q`` ``[γ, V]``
    as in the module docstring, row ``i`` the distributions after ``X_1..X_i``): for ``i < γ``,
    ``h_i = Z_i / (Z_i + 1 - w_i)`` with the residual mass ``Z_i = Σ_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)``
    (``p_{i+1}`` is row ``i``), and ``h_γ = w_γ``; ``0 / 0`` (``w_i = 1``, ``p_{i+1} = q_{i+1}``) is 1, its limit.
    The ``Z_i`` of every row come back in one transfer."""
    γ = len(w)
    z: list[float] = []
    if γ > 1:
        wt = torch.tensor(w[:-1], dtype=p.dtype, device=p.device)[:, None]
        z = (wt * p[1:γ] - q[1:γ]).clamp_min(0.0).sum(-1).tolist()
    h = []
    for i in range(γ - 1):
        den = z[i] + 1.0 - w[i]
        h.append(z[i] / den if den > 0 else 1.0)
    return [*h, w[-1]] if γ else []


def block_residual(w: float, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """The residual that follows ``τ < γ`` accepted tokens, unnormalised: ``max(w_τ p_{τ+1} - q_{τ+1}, 0)``
    (``w_0 = 1``: the token-level residual ``max(p - q, 0)`` at ``τ = 0``)."""
    return (w * p_row - q_row).clamp_min(0.0)


def verify_block(draft: list[int], q: torch.Tensor | None, p: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
    Algorithm 2): ``(τ, token)``. With :func:`block_weights` ``w`` and :func:`block_thresholds` ``h`` and
    uniforms ``η_1..η_γ`` (all at once), ``τ`` is the largest ``i`` with ``η_i < h_i`` (0 if none); ``X_1..X_τ``
    are kept and ``token`` is drawn from ``p_{γ+1}`` where ``τ = γ``, else from :func:`block_residual` at ``τ``
    (from ``p_{τ+1}`` itself should that be all zeros, which only rounding makes: a kept ``τ < γ`` has
    ``h_τ > 0``, so ``Z_τ > 0``, or ``w_τ = 1 = h_{τ+1}`` up to ``h_γ = w_γ = 1``).

    The committed tokens are distributed exactly as the target's, and a round keeps at least as many tokens in
    expectation as :func:`verify_sampling`'s (the paper's Theorems 1-2; ``tests/test_block.py`` checks both by
    exhaustive enumeration); with ``γ = 1`` the two are the same rule. Greedy (one-hot ``p`` and ``q``) it keeps
    the longest prefix equal to the target's argmax and emits the target's argmax: :func:`verify_greedy`. With a
    drafter whose ``q`` is one-hot (prompt lookup) no valid rule keeps more than the token-level one, and block
    keeps as many."""
    if not draft:  # ``q`` may be None then
        return 0, draw(p[0], gen)
    p, q = _on(p, gen), _on(q, gen)
    γ = len(draft)
    w = block_weights(*_at(draft, p, q))
    h = block_thresholds(w, p, q)
    η = torch.rand(γ, generator=gen, device=gen.device, dtype=torch.float64).tolist()
    τ = max((i for i in range(1, γ + 1) if η[i - 1] < h[i - 1]), default=0)
    if τ == γ:
        return γ, draw(p[γ], gen)
    residual = block_residual(w[τ - 1] if τ else 1.0, p[τ], q[τ])
    return τ, draw(residual if float(residual.sum()) > 0 else p[τ], gen)


def _at(draft: list[int], *probs: torch.Tensor) -> list[list[float]]:
    """``[[t[i, d_{i+1}] for i] for t in probs]`` (tensors on one device), read back in one transfer."""
    if not draft:
        return [[] for _ in probs]
    dev = probs[0].device
    rows = torch.arange(len(draft), device=dev)
    cols = torch.tensor(draft, dtype=torch.long, device=dev)
    return torch.stack([t[rows, cols].float() for t in probs]).tolist()


def target_state(logits: torch.Tensor) -> tuple[list[float], list[float]]:
    """Entropy (nats) and top-2 margin of ``softmax(logits)`` per row (temperature 1): ``[k, V] -> k, k`` values,
    read back in one transfer; float32 rows in CPU memory through numpy (:func:`_target_state_numpy`)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2:
        fast = _target_state_numpy(logits.detach().numpy())
        if fast is not None:
            return fast
    logp = torch.log_softmax(logits.float(), -1)
    entropy = -(logp.exp() * logp.clamp_min(torch.finfo(logp.dtype).min)).sum(-1)  # a masked id: 0 · log 0 = 0
    top2 = logp.topk(2, -1).values.exp()
    out = torch.stack([entropy, top2[:, 0] - top2[:, 1]], 1).tolist()
    return [e for e, _ in out], [m for _, m in out]


def top_two(a: np.ndarray) -> tuple[int, int]:
    """Indices of the largest and the second-largest entry of a 1-D array (the first of equals; -1 for the second
    of a single entry): argmax passes either side of the first, no sort."""
    i = int(a.argmax())
    left = int(a[:i].argmax()) if i > 0 else -1
    right = i + 1 + int(a[i + 1 :].argmax()) if i + 1 < a.size else -1
    return i, left if right < 0 or (left >= 0 and a[left] >= a[right]) else right


_SCRATCH = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 work rows of ``n`` values, kept per thread: a new 600 KB array for every drafted token and
    verified row (152k ids) would be fresh pages from the allocator each time, page faults included."""
    rows = getattr(_SCRATCH, "rows", None)
    if rows is None or rows[0].size < n:
        rows = _SCRATCH.rows = (np.empty(n, np.float32), np.empty(n, np.float32))
    return rows[0][:n], rows[1][:n]


class SoftmaxStats(NamedTuple):
    """What the draft's features and the target state read of ``softmax(l)`` (temperature 1) for a logits row
    ``l``, without the probability row: the top two ids ``i``, ``j`` (``j = -1`` for a single id), the top logit
    ``m = l_i`` and ``Z = Σ exp(l - m)``, so that ``p_k = exp(l_k - m) / Z``; ``entropy`` in nats (NaN where not
    asked for). A named tuple: one is made for every drafted token."""

    i: int
    j: int
    m: float
    z: float
    entropy: float
    row: np.ndarray

    def prob(self, k: int) -> float:
        return math.exp(float(self.row[k]) - self.m) / self.z


def softmax_stats(row: np.ndarray, entropy: bool = True, second: bool = True) -> SoftmaxStats | None:
    """:class:`SoftmaxStats` of a float32 logits row: by :mod:`pacer.native`'s kernel where this machine has it
    built (the top two, the top logit and both sums reading the row once), else by numpy's vectorised kernels,
    one exponential over the row into a reused buffer and no logarithm of it: with ``d = l - m`` and
    ``e = exp(d)``, the entropy is ``log Z - Σ e·d / Z`` (~0.1 ms a 152k-id row on a 2-core Zen 5 against ~0.4 ms
    for torch's softmax and log); a masked id (``-inf``) adds nothing. Without ``second`` the second id is not
    looked for (``j = -1``). ``None`` where the top logit is not finite (NaN, ``+inf``, all masked: the caller
    takes torch's path)."""
    kernel = row_stats_kernel() if row.dtype == np.float32 and row.flags.c_contiguous else None
    if kernel is not None:  # one read of the row, nothing written (pacer.native); numpy's below where there is none
        got = kernel(row, second)
        if got is not None:
            i, j, m, z, s = got
            if math.isfinite(z) and math.isfinite(s) and z >= 1.0:
                return SoftmaxStats(i, j, m, z, max(math.log(z) - s / z, 0.0) if entropy else math.nan, row)
    i, j = top_two(row) if second else (int(row.argmax()), -1)
    m = float(row[i])
    if not math.isfinite(m):
        return None
    d, e = _scratch(row.size)
    np.subtract(row, np.float32(m), out=d)
    np.exp(d, out=e)
    z = float(e.sum())
    h = math.nan
    if entropy:
        with np.errstate(invalid="ignore"):
            h = math.log(z) - float(np.dot(e, d)) / z
            if math.isnan(h):  # a masked id (-inf, e.g. a padded vocabulary): 0 · -inf; its term is 0 · log 0 = 0
                np.maximum(d, np.float32(-3.0e38), out=d)
                h = math.log(z) - float(np.dot(e, d)) / z
        if not math.isfinite(h):
            return None
        h = max(h, 0.0)
    return SoftmaxStats(i, j, m, z, h, row)


def _target_state_numpy(a) -> tuple[list[float], list[float]] | None:
    """:func:`target_state` of float32 rows ``a`` through :func:`softmax_stats`: the top-2 margin is
    ``(1 - exp(l_2 - m)) / Z``. ``None`` where a row's top logit is not finite (torch's path)."""
    entropy, margin = [], []
    for row in a:
        st = softmax_stats(row)
        if st is None:
            return None
        entropy.append(st.entropy)
        l2 = float(row[st.j]) if st.j >= 0 else -math.inf
        margin.append((1.0 - math.exp(l2 - st.m)) / st.z)
    return entropy, margin


def acceptance_probs(draft: list[int], q_tokens: list[float], p: torch.Tensor) -> list[float]:
    """Soft acceptance ``min(1, p[i][d_{i+1}] / q_i(d_{i+1}))`` per draft token; ``q_tokens`` holds the draft's
    probabilities of its own tokens (in greedy mode the unwarped softmax, i.e. temperature 1)."""
    return [min(1.0, pi / max(q_tokens[i], 1e-20)) for i, pi in enumerate(_at(draft, p)[0])]

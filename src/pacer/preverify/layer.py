"""The pre-verification layer (PACER) and the SpecDec++-style per-token head.

``PreVerifier`` - reads the draft tokens of the current round, ``x_1..x_m`` (features of :mod:`features`), and
pre-verifies them block by block (block size ``b``):

    e_i   = W_h · LayerNorm(hidden_i)  +  W_s · scalars_i  +  pos[i]              e_i ∈ R^d
    z_i   = e_i + CausalSelfAttention(e_1..e_i)          (one layer, ``heads`` heads: context from earlier blocks)
    z_i   = z_i + MLP(LayerNorm(z_i))
    token score  c_i = w_t · z_i,  σ(c_i)             ≈ P(d_i accepted | d_1..d_{i-1} accepted)
    survival     log P(d_1..d_i all accepted) ≈ Σ_{j<=i} log σ(c_j)
    block score  S_k = σ(logit(survival at kb) + w_b · [z_{kb}; mean(z_{(k-1)b+1..kb})])
                 ≈ P(block k and every block before it accepted)

The survival term gives the block score the right structure (a draft fails at its first rejection); the block
head (initialised at zero) corrects it from the block's pooled states.

Block ``k`` *passes* when ``S_k >= threshold``; the policy drafts the next block only then. Shapes: hidden ``[m, D]``
(``D = len(layers) * H``), scalars ``[m, S]``; outputs conditional token logits ``[m]`` and block logits ``[m // b]``.

``TokenHead`` (SpecDec++-style baseline) - an MLP over one token's features, no context: ``σ(f(x_i)) ≈ P(d_i
accepted | d_1..d_{i-1} accepted)``; drafting stops once ``1 - Π_j σ(f(x_j))`` (the probability that some drafted
token is rejected) exceeds the threshold.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import torch
from torch import nn

from .. import native


class PreVerifier(nn.Module):
    def __init__(self, hidden_dim: int, n_scalars: int, block_size: int = 4, d: int = 64, heads: int = 2,
                 max_draft: int = 32, rank: int = 0, dropout: float = 0.0, context: bool = True) -> None:
        super().__init__()
        self.block_size = block_size
        #: False: no attention over the earlier draft tokens (each token's score from its own features; the
        #: block score still multiplies the survival and pools the block)
        self.context = context
        self.norm_h = nn.LayerNorm(hidden_dim)
        # rank > 0: a low-rank bottleneck for the hidden states (regularises: ~1k training rounds vs 1.8k dims)
        self.proj_h = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, rank), nn.Linear(rank, d)) if rank \
            else nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, d))
        self.proj_s = nn.Linear(n_scalars, d)
        self.pos = nn.Embedding(max_draft, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm_a = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm_m = nn.LayerNorm(d)
        self.token_head = nn.Linear(d, 1)
        self.block_head = nn.Linear(2 * d, 1)
        nn.init.zeros_(self.block_head.weight)
        nn.init.zeros_(self.block_head.bias)

    def encode(self, hidden: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """``[B, m, D], [B, m, S] -> [B, m, d]`` contextual token states (causal over the draft)."""
        m = hidden.shape[1]
        e = self.proj_h(self.norm_h(hidden)) + self.proj_s(scalars) + self.pos(torch.arange(m, device=hidden.device))
        if self.context:
            mask = torch.triu(torch.ones(m, m, dtype=torch.bool, device=hidden.device), 1)
            a, _ = self.attn(self.norm_a(e), self.norm_a(e), self.norm_a(e), attn_mask=mask, need_weights=False)
            e = e + a
        return e + self.mlp(self.norm_m(e))

    def forward(self, hidden: torch.Tensor, scalars: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Conditional token logits ``[B, m]`` and block logits ``[B, m // block_size]``."""
        z = self.encode(hidden, scalars)
        B, m, d = z.shape
        b = self.block_size
        k = m // b
        c = self.token_head(z).squeeze(-1)
        survival = nn.functional.logsigmoid(c).cumsum(-1)[:, b - 1 : k * b : b]
        survival = survival.clamp(max=-1e-6)
        prior = survival - torch.log(-torch.expm1(survival))  # logit of the survival probability
        zb = z[:, : k * b].reshape(B, k, b, d)
        block_in = torch.cat([zb[:, :, -1], zb.mean(2)], -1)
        return c, prior + self.block_head(block_in).squeeze(-1)

    def extend(self, memo: PrefixState, hidden: torch.Tensor, scalars: torch.Tensor) -> float | None:
        """Feed tokens ``n+1..n+r`` of one draft (``hidden [r, D]``, ``scalars [r, S]``) after the ``n`` that
        ``memo`` holds (updated in place); returns the block logit of the last complete block (``None`` while
        there is none) - what :meth:`forward` gives for the whole draft, for the cost of ``r`` rows. On a CPU
        (or given numpy rows) they go through :class:`CpuExtend` (the weights as they are now), elsewhere through
        torch."""
        if isinstance(hidden, np.ndarray):  # float32 rows for the CPU check (a policy's inputs_numpy)
            return self.cpu().extend(memo, hidden, scalars, self.block_size)
        if hidden.device.type == "cpu":
            return self.cpu().extend(memo, hidden.float().numpy(), scalars.float().numpy(), self.block_size)
        return self.extend_torch(memo, hidden, scalars)

    def cpu(self) -> CpuExtend:
        """The :class:`CpuExtend` of the current weights (made again after a parameter changed in place: an
        optimizer step or a loaded state bumps its version)."""
        c = self.__dict__.get("_cpu_extend")
        if c is None or not c.current():
            c = self._cpu_extend = CpuExtend(self)
        return c

    def extend_torch(self, memo: PrefixState, hidden: torch.Tensor, scalars: torch.Tensor) -> float | None:
        """:meth:`extend` in torch ops (any device)."""
        n, r = memo.n, hidden.shape[0]
        z = self.proj_h(self.norm_h(hidden)) + self.proj_s(scalars) + self.pos.weight[n : n + r]
        if self.context:
            heads = self.attn.num_heads
            q, k, v = nn.functional.linear(self.norm_a(z), self.attn.in_proj_weight, self.attn.in_proj_bias) \
                .view(r, 3, heads, -1).permute(1, 2, 0, 3)  # each [heads, r, d / heads]
            memo.k = k if memo.k is None else torch.cat([memo.k, k], 1)
            memo.v = v if memo.v is None else torch.cat([memo.v, v], 1)
            mask = None if r == 1 else torch.ones(r, n + r, dtype=torch.bool, device=z.device).tril(n)  # j: <= n + j
            a = nn.functional.scaled_dot_product_attention(q, memo.k, memo.v, attn_mask=mask)
            z = z + self.attn.out_proj(a.transpose(0, 1).reshape(r, -1))
        z = z + self.mlp(self.norm_m(z))
        memo.z = z if memo.z is None else torch.cat([memo.z, z])
        return memo.close(nn.functional.logsigmoid(self.token_head(z)).flatten().tolist(), self.block_size,
                          lambda zb: float(self.block_head(torch.cat([zb[-1], zb.mean(0)]))))



class CpuExtend:
    """:meth:`PreVerifier.extend` on a CPU, in numpy, on a frozen copy of the layer's weights: each LayerNorm's
    scale and shift folded into the linear map after it, a low-rank hidden projection multiplied out, so one
    drafted token costs a dozen small numpy operations instead of ~30 torch dispatches (a check of the shipped
    layer: 0.46 → 0.23 ms live beside llama.cpp's forwards on a 2-core AMD EPYC Zen 5, 0.14 → 0.07 ms alone).
    Equal to :meth:`PreVerifier.forward` up to float32 rounding (tested). :meth:`current` says whether the
    layer's parameters are still those it copied (in-place changes bump a parameter's version; parameters made
    under ``torch.inference_mode`` have no version and cannot change outside it; replacing a parameter object needs
    a new layer)."""

    def __init__(self, m: PreVerifier) -> None:
        self._params = [p for p in m.parameters() if not p.is_inference()]
        self._versions = [p._version for p in self._params]

        def arr(t: torch.Tensor, dtype=np.float32) -> np.ndarray:
            return t.detach().to("cpu", torch.float64).numpy().astype(dtype)

        def f64(t: torch.Tensor) -> np.ndarray:
            return arr(t, np.float64)

        def folded(norm: nn.LayerNorm, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """``Linear(LayerNorm(x)) = W' x̂ + b'`` with ``x̂`` the standardised ``x``: ``W' = W diag(γ)``,
            ``b' = W β + b``."""
            g, beta = f64(norm.weight), f64(norm.bias)
            return (w * g[None, :]).astype(np.float32), (w @ beta + b).astype(np.float32)

        lins = [x for x in m.proj_h if isinstance(x, nn.Linear)]
        w, b = f64(lins[0].weight), f64(lins[0].bias)
        if len(lins) == 2:  # the low-rank bottleneck, multiplied out
            w, b = f64(lins[1].weight) @ w, f64(lins[1].weight) @ b + f64(lins[1].bias)
        self.w_h, self.b_h = folded(m.norm_h, w, b)
        self.eps = (m.norm_h.eps, m.norm_a.eps, m.norm_m.eps)
        self.w_s, self.b_s = arr(m.proj_s.weight), arr(m.proj_s.bias)
        self.pos = arr(m.pos.weight)
        self.context, self.heads = m.context, m.attn.num_heads
        self.w_qkv, self.b_qkv = folded(m.norm_a, f64(m.attn.in_proj_weight), f64(m.attn.in_proj_bias))
        self.w_o, self.b_o = arr(m.attn.out_proj.weight), arr(m.attn.out_proj.bias)
        self.w_1, self.b_1 = folded(m.norm_m, f64(m.mlp[0].weight), f64(m.mlp[0].bias))
        self.tanh_gelu = m.mlp[1].approximate == "tanh"
        self.w_2, self.b_2 = arr(m.mlp[2].weight), arr(m.mlp[2].bias)
        self.w_t, self.b_t = arr(m.token_head.weight)[0], float(m.token_head.bias[0])
        self.w_b, self.b_b = arr(m.block_head.weight)[0], float(m.block_head.bias[0])
        self._layer = None  # the native record of these weights, made on first use

    def current(self) -> bool:
        return [p._version for p in self._params] == self._versions

    @staticmethod
    def _standard(x: np.ndarray, eps: float) -> np.ndarray:
        c = x - x.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)

    def _gelu(self, u: np.ndarray) -> np.ndarray:
        if self.tanh_gelu:
            return 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))
        erf = np.fromiter(map(math.erf, (u.ravel() / math.sqrt(2.0)).tolist()), np.float64, u.size)
        return (0.5 * u * (1.0 + erf.reshape(u.shape))).astype(np.float32)

    def extend(self, memo: PrefixState, hidden: np.ndarray, scalars: np.ndarray, block_size: int,
               kernels: object = "auto") -> float | None:
        """:meth:`PreVerifier.extend` of float32 rows ``hidden [r, D]``, ``scalars [r, S]`` (``memo`` holds numpy
        arrays): one native call a row where this machine has :mod:`pacer.native` built (``kernels``: ``"auto"``
        looks; ``None`` takes numpy's operations), numpy's operations otherwise."""
        k = native.kernels() if kernels == "auto" else kernels
        if k is not None and memo.n + hidden.shape[0] <= self.pos.shape[0]:
            return self._extend_native(k, memo, hidden, scalars, block_size)
        n, r = memo.n, hidden.shape[0]
        z = self._standard(hidden, self.eps[0]) @ self.w_h.T + self.b_h + scalars @ self.w_s.T + self.b_s \
            + self.pos[n : n + r]
        if self.context:
            d = z.shape[1] // self.heads
            qkv = (self._standard(z, self.eps[1]) @ self.w_qkv.T + self.b_qkv).reshape(r, 3, self.heads, d)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # each [r, heads, d / heads]
            memo.k = k if memo.k is None else np.concatenate([memo.k, k])
            memo.v = v if memo.v is None else np.concatenate([memo.v, v])
            att = np.einsum("rhd,nhd->hrn", q, memo.k) / math.sqrt(d)  # [heads, r, n + r]
            if r > 1:  # row j sees tokens <= n + j
                att = np.where(np.tri(r, n + r, n, dtype=bool)[None], att, -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            z = z + np.einsum("hrn,nhd->rhd", att, memo.v).reshape(r, -1) @ self.w_o.T + self.b_o
        z = z + self._gelu(self._standard(z, self.eps[2]) @ self.w_1.T + self.b_1) @ self.w_2.T + self.b_2
        memo.z = z if memo.z is None else np.concatenate([memo.z, z])
        return self._close(memo, z, block_size)


    def _extend_native(self, k, memo: PrefixState, hidden: np.ndarray, scalars: np.ndarray,
                       block_size: int) -> float | None:
        """:meth:`extend` one row at a time through ``pacer_layer_check`` (:meth:`check`)."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        scalars = np.ascontiguousarray(scalars, np.float32)
        logit = None
        for j in range(hidden.shape[0]):
            logit = self.check(k, memo, hidden[j].ctypes.data, scalars[j].ctypes.data, 0, 0, block_size)
        return logit

    def check(self, k, memo: PrefixState, hidden: int, scalars: int, mu: int, sd: int, block_size: int) -> float | None:
        """Token ``memo.n`` of a draft through the layer in one native call (``k``: :func:`pacer.native.kernels`):
        ``hidden``, ``scalars``: addresses of its float32 hidden row (``D`` values) and scalars, raw where ``mu``
        and ``sd`` are the addresses of the normaliser (0: already normalised); returns :meth:`extend`'s block
        logit. The keys, values, states and running log-survival go into ``memo``'s buffers of ``max_draft``
        rows, of which ``memo.k``/``v``/``z`` are views."""
        n = memo.n
        m, d = self.pos.shape
        if n >= m:
            raise ValueError(f"the native layer check refused token {n} of a draft of at most {m}")
        if not memo._live() or memo.native_n != n:  # a new draft, or rows that numpy's path added: copy them in
            buf = np.zeros((3, m, d), np.float32)
            ls, out = (ctypes.c_double * m)(), (ctypes.c_double * 2)()
            if n:
                buf[2, :n] = memo.z
                ls[:n] = memo.log_survival
                if self.context:
                    buf[0, :n], buf[1, :n] = memo.k.reshape(n, d), memo.v.reshape(n, d)
            memo.native, memo.native_ls, memo.native_out, memo.native_n = buf, ls, out, n
            memo.native_heads = self.heads
            memo.z = memo.k = memo.v = None  # views of the buffers from now on
            memo.native_ptrs = (buf[0].ctypes.data, buf[1].ctypes.data, buf[2].ctypes.data, ctypes.addressof(ls),
                                ctypes.addressof(out))
        if self._layer is None:
            self._layer = self._struct(d)  # (byref, the record it refers to)
        if k.layer_check(self._layer[0], hidden, scalars, mu or None, sd or None, n, block_size, *memo.native_ptrs):
            raise ValueError(f"the native layer check refused token {n} of a draft of at most {m}")
        memo.native_n = n + 1
        memo.log_survival.append(memo.native_ls[n])
        closed = memo.native_out[1]
        if closed == closed:  # not NaN: token n closed a block
            memo.block_logit = closed
        return memo.block_logit

    def _close(self, memo: PrefixState, z: np.ndarray, block_size: int) -> float | None:
        """The new tokens' states ``z`` (already in ``memo.z``) to their ``log σ(c_i)`` and the block logit."""
        log_sigma = [-math.log1p(math.exp(-c)) if c >= 0 else c - math.log1p(math.exp(c))  # stable both ways
                     for c in (z @ self.w_t + self.b_t).tolist()]
        return memo.close(log_sigma, block_size,
                          lambda zb: float(np.concatenate([zb[-1], zb.mean(0)]) @ self.w_b) + self.b_b)

    def _struct(self, d: int):
        """The ``pacer_layer`` record of these weights (the arrays it points into are kept on ``self``)."""
        f32 = ctypes.POINTER(ctypes.c_float)
        arrays = {name: np.ascontiguousarray(getattr(self, name), np.float32)
                  for name in ("w_h", "b_h", "w_s", "b_s", "pos", "w_qkv", "b_qkv", "w_o", "b_o", "w_1", "b_1",
                               "w_2", "b_2", "w_t", "w_b")}
        self._arrays = arrays
        rec = native.Layer(D=self.w_h.shape[1], S=self.w_s.shape[1], d=d, heads=self.heads, context=int(self.context),
                           tanh_gelu=int(self.tanh_gelu), max=self.pos.shape[0], eps_h=self.eps[0], eps_a=self.eps[1],
                           eps_m=self.eps[2], b_t=self.b_t, b_b=self.b_b,
                           **{name: a.ctypes.data_as(f32) for name, a in arrays.items()})
        return ctypes.byref(rec), rec


class _Rows:
    """A :class:`PrefixState` array (keys ``0``, values ``1``, states ``2``): the one numpy's or torch's path set,
    or, while the native buffers hold the draft, a view of their first ``native_n`` rows (keys and values as
    ``[n, heads, d / heads]``)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __set_name__(self, owner, name: str) -> None:
        self.attr = "_" + name

    def __get__(self, memo, owner=None):
        if memo is None:
            return self
        if not memo._live():
            return getattr(memo, self.attr)
        n = memo.native_n
        if not n:
            return None
        rows = memo.native[self.index, :n]
        return rows if self.index == 2 else rows.reshape(n, memo.native_heads, -1)

    def __set__(self, memo, value) -> None:
        setattr(memo, self.attr, value)


class PrefixState:
    """:meth:`PreVerifier.extend`'s memory of one draft's first ``n`` tokens: the attention's keys and values
    (torch ``[heads, n, d / heads]``, or numpy ``[n, heads, d / heads]`` on a CPU), the contextual states ``z``
    ``[n, d]`` and the running log-survival
    ``Σ_{j<=i} log σ(c_j)`` at every ``i <= n``. The layer is causal, so token ``i``'s state never changes once
    computed: a check after one more drafted token costs one row, not the whole draft again."""

    def __init__(self) -> None:
        self._k: torch.Tensor | np.ndarray | None = None
        self._v: torch.Tensor | np.ndarray | None = None
        self._z: torch.Tensor | np.ndarray | None = None
        self.log_survival: list[float] = []  # Σ_{j<=i} log σ(c_j) for i = 1..n
        #: the native path's buffers ``[3 (k, v, z), max_draft, d]`` and how many of their rows are this draft's
        #: (while they hold the draft, ``k``/``v``/``z`` are views of them), its running log-survival and its
        #: output (token logit, block logit) as ctypes arrays, the addresses of all five, the attention's heads
        self.native: np.ndarray | None = None
        self.native_n = 0
        self.native_ls = None
        self.native_out = None
        self.native_ptrs: tuple[int, ...] = ()
        self.native_heads = 1
        #: the block logit of the last complete block (``None`` while there is none)
        self.block_logit: float | None = None

    def _live(self) -> bool:
        """The native buffers hold the draft (no array of numpy's or torch's path since)."""
        return self._z is None and self.native is not None

    k = _Rows(0)
    v = _Rows(1)
    z = _Rows(2)

    @property
    def n(self) -> int:
        if self._live():
            return self.native_n
        return 0 if self._z is None else self._z.shape[0]

    def close(self, log_sigma: list[float], block_size: int, pooled) -> float | None:
        """After ``z`` took the new tokens' states: add their ``log σ(c_i)`` to the running log-survival and
        return the block logit of the last complete block (``None`` while there is none): the logit of the
        survival there plus ``pooled(z of that block)``, the block head on its last and mean states."""
        for c in log_sigma:
            self.log_survival.append((self.log_survival[-1] if self.log_survival else 0.0) + c)
        end = self.n - self.n % block_size
        if end == 0:
            return None
        survival = min(self.log_survival[end - 1], -1e-6)
        self.block_logit = survival - math.log(-math.expm1(survival)) + pooled(self.z[end - block_size : end])
        return self.block_logit


class TokenHead(nn.Module):
    def __init__(self, hidden_dim: int, n_scalars: int, d: int = 64, rank: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm_h = nn.LayerNorm(hidden_dim)
        self.proj_h = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, rank), nn.Linear(rank, d)) if rank \
            else nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden_dim, d))
        self.proj_s = nn.Linear(n_scalars, d)
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))

    def forward(self, hidden: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """``[..., D], [..., S] -> [...]`` logits of per-token conditional acceptance."""
        return self.mlp(self.proj_h(self.norm_h(hidden)) + self.proj_s(scalars)).squeeze(-1)


def param_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())

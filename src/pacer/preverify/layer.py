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

import math

import torch
from torch import nn


class PreVerifier(nn.Module):
    def __init__(self, hidden_dim: int, n_scalars: int, block: int = 4, d: int = 64, heads: int = 2,
                 max_draft: int = 32, rank: int = 0, dropout: float = 0.0, context: bool = True) -> None:
        super().__init__()
        self.block = block
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
        """Conditional token logits ``[B, m]`` and block logits ``[B, m // block]``."""
        z = self.encode(hidden, scalars)
        B, m, d = z.shape
        k = m // self.block
        c = self.token_head(z).squeeze(-1)
        survival = nn.functional.logsigmoid(c).cumsum(-1)[:, self.block - 1 : k * self.block : self.block]
        survival = survival.clamp(max=-1e-6)
        prior = survival - torch.log(-torch.expm1(survival))  # logit of the survival probability
        zb = z[:, : k * self.block].reshape(B, k, self.block, d)
        block_in = torch.cat([zb[:, :, -1], zb.mean(2)], -1)
        return c, prior + self.block_head(block_in).squeeze(-1)

    def extend(self, memo: PrefixState, hidden: torch.Tensor, scalars: torch.Tensor) -> float | None:
        """Feed tokens ``n+1..n+r`` of one draft (``hidden [r, D]``, ``scalars [r, S]``) after the ``n`` that
        ``memo`` holds (updated in place); returns the block logit of the last complete block (``None`` while
        there is none) - what :meth:`forward` gives for the whole draft, for the cost of ``r`` rows."""
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
        for c in nn.functional.logsigmoid(self.token_head(z)).flatten().tolist():
            memo.log_survival.append((memo.log_survival[-1] if memo.log_survival else 0.0) + c)
        end = memo.n - memo.n % self.block
        if end == 0:
            return None
        survival = min(memo.log_survival[end - 1], -1e-6)
        prior = survival - math.log(-math.expm1(survival))
        zb = memo.z[end - self.block : end]
        return prior + float(self.block_head(torch.cat([zb[-1], zb.mean(0)])))



class PrefixState:
    """:meth:`PreVerifier.extend`'s memory of one draft's first ``n`` tokens: the attention's keys and values
    ``[heads, n, d / heads]``, the contextual states ``z`` ``[n, d]`` and the running log-survival
    ``Σ_{j<=i} log σ(c_j)`` at every ``i <= n``. The layer is causal, so token ``i``'s state never changes once
    computed: a check after one more drafted token costs one row, not the whole draft again."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.z: torch.Tensor | None = None
        self.log_survival: list[float] = []  # Σ_{j<=i} log σ(c_j) for i = 1..n

    @property
    def n(self) -> int:
        return 0 if self.z is None else self.z.shape[0]


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

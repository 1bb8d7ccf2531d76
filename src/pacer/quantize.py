"""int8 weight-only linear layers, on PyTorch's own CPU kernel ``torch.ops.aten._weight_int8pack_mm``.

Weights are quantized per output channel, symmetrically: ``w ≈ s · q`` with ``q = round(w / s)`` in [-127, 127]
and ``s = max |w_row| / 127``; activations stay in the model's dtype. A quantized **draft** never changes pacer's
output (the draft only proposes; the target verifies every token), so it is a lossless speed option. A quantized
**target** is another model: its plain decoding emits other tokens than the bf16 target's, so it is opt-in and
always reported as a different target.

The decoder's linear layers are replaced; embeddings and the LM head stay as they are (the draft's LM head is
already cut to the reduced draft vocabulary, :mod:`pacer.draftvocab`, and is read row by row there).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .errors import PacerError

KINDS = ("none", "int8")
#: rows (tokens) from which a forward converts the int8 weights to the model's dtype and makes one dense product
#: instead of calling the int8 kernel, whose cost grows with every row. Measured on the default draft (Qwen2.5-Coder
#: 0.5B, bf16, int8 decoder) from an empty cache on an Intel Xeon (family 6, model 207; AMX; 2 threads), median of 4
#: (experiments/int8_prompt_read.py, docs/bench/int8-prompt-read-xeon): 1 row 50 ms with the kernel against 95 ms dense,
#: 8 rows 86 / 93, 12 rows 110 / 93, 32 rows 202 / 107, 170 rows 858 / 173, 300 rows 1,494 / 229. 32 leaves the
#: draft's short forwards (a token, a phrase, a short catch-up) on the kernel and gives a prompt's read (the draft's
#: catch-up, hundreds of tokens) the dense product.
DENSE_ROWS = 32


@functools.cache
def _dense_pays(dtype: torch.dtype) -> bool:
    """Whether a dense product in ``dtype`` runs on this CPU's own instructions: float32 always, bfloat16 where
    oneDNN has it (AVX-512 or AMX; an AVX2-only CPU converts bf16 on the fly and keeps the int8 kernel)."""
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _int8_mm(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """PyTorch's int8 weight-only CPU kernel: ``x · (scale ⊙ q)ᵀ``."""
    return torch.ops.aten._weight_int8pack_mm(x, q, scale)


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8Linear(nn.Module):
    """``y = x · (s ⊙ q)ᵀ + b`` with int8 ``q`` ``[out, in]`` and per-channel scales ``s`` ``[out]``."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8)
        self.register_buffer("q", torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous())
        self.dtype = linear.weight.dtype
        self.register_buffer("scale", scale.to(self.dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The int8 kernel below :data:`DENSE_ROWS` rows; from there, where the dtype's dense product is native
        here (:func:`_dense_pays`), ``(x · qᵀ) ⊙ s`` with ``q`` converted to the model's dtype (exactly:
        |q| <= 127)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        if x2.shape[0] >= DENSE_ROWS and _dense_pays(self.dtype):
            y = torch.nn.functional.linear(x2, self.q.to(self.dtype)) * self.scale
        else:
            y = _int8_mm(x2, self.q, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model``'s decoder (not the LM head) by :class:`Int8Linear`, in place."""
    if not available():
        raise PacerError("int8 quantization needs torch.ops.aten._weight_int8pack_mm (PyTorch >= 2.3)")
    decoder = model.get_decoder()
    names = [n for n, m in decoder.named_modules() if isinstance(m, nn.Linear)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        setattr(parent, child, Int8Linear(getattr(parent, child)))
    model.config.pacer_quantization = "int8"
    return model


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise PacerError(f"quantization must be one of {', '.join(KINDS)}, got '{kind}'")
    return kind

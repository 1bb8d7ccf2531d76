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

import torch
from torch import nn

from .errors import PacerError

KINDS = ("none", "int8")


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
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(self.dtype), self.q, self.scale)
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

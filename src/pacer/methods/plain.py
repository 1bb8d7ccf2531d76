"""``ar``: plain autoregressive decoding, the baseline every speedup is measured against."""

from .registry import Method, register

register(Method("ar", "plain decoding: one target forward per token (the baseline)"))

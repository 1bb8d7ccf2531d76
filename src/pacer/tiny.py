"""Tiny random-weight model pairs built in code (tests, ``pacer bench --quick``): no downloads, seconds to run.

The tokenizer is a byte-level BPE without merges (256 byte tokens plus a few specials) with a chat template, so
every text path of the library runs on them. Weights use a large init range so that logits are well separated
(float32 exactness tests then never sit on a near-tie).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(variant: int = 0):
    """A byte-level tokenizer; ``variant`` > 0 permutes the byte ids (a *different* tokenizer, for refusals)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    chars = sorted(byte_chars)
    if variant:
        g = torch.Generator().manual_seed(variant)
        chars = [chars[i] for i in torch.randperm(len(chars), generator=g).tolist()]
    vocab = {c: i for i, c in enumerate(chars)}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(seed: int, vocab: int = 259, hidden: int = 64, layers: int = 2, init: float = 0.35,
               context: int = 512) -> torch.nn.Module:
    """A random Qwen2 causal LM in float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, initializer_range=init,
        tie_word_embeddings=False, eos_token_id=vocab - 1, bos_token_id=vocab - 3, pad_token_id=vocab - 3,
    )
    model = Qwen2ForCausalLM(cfg).float().eval()
    return model


def perturbed(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees partly with the target."""
    torch.manual_seed(seed)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp_min(1e-3))
    return m


def tiny_pair(draft: str = "close", seed: int = 0):
    """``(target, draft)`` LoadedModels: draft ``close`` (perturbed target), ``same`` (a copy) or ``random``."""
    from .models import LoadedModel

    tok = tiny_tokenizer()
    target = tiny_model(seed)
    if draft == "same":
        d = copy.deepcopy(target)
    elif draft == "random":
        d = tiny_model(seed + 1000, hidden=32, layers=1)
    elif draft == "close":
        d = perturbed(target, 0.02, seed + 1)
    else:
        raise ValueError(draft)
    return (LoadedModel(target, tok, f"tiny-target-{seed}", f"tiny-target-{seed}", torch.float32),
            LoadedModel(d, tok, f"tiny-draft-{draft}-{seed}", f"tiny-draft-{draft}-{seed}", torch.float32))


def save_tiny_pair(folder: Path, draft: str = "close", seed: int = 0) -> tuple[Path, Path]:
    """Write a tiny pair as two HF model folders (for CLI tests and ``bench --quick``)."""
    t, d = tiny_pair(draft, seed)
    out = []
    for name, m in (("target", t), ("draft", d)):
        p = Path(folder) / name
        m.model.save_pretrained(p)
        m.tokenizer.save_pretrained(p)
        out.append(p)
    return out[0], out[1]

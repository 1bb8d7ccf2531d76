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
    from .backends.transformers import TransformersModel

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
    return (TransformersModel(target, tok, f"tiny-target-{seed}", f"tiny-target-{seed}", torch.float32),
            TransformersModel(d, tok, f"tiny-draft-{draft}-{seed}", f"tiny-draft-{draft}-{seed}", torch.float32))


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


#: transformers' Qwen2 parameter names -> llama.cpp's GGUF tensor names (``{i}``: the layer)
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


def save_tiny_gguf(model: torch.nn.Module, tokenizer, path: Path) -> Path:
    """Write a tiny Qwen2 model (float32 tensors) and its byte-level tokenizer as a GGUF file that llama.cpp
    loads (``arch = qwen2``: llama.cpp's NEOX rotary embedding is transformers' ``rotate_half``, so the q/k
    weights go in as they are)."""
    import re

    import gguf

    cfg = model.config
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    tokens = [""] * cfg.vocab_size
    for t, i in vocab.items():
        if i < cfg.vocab_size:
            tokens[i] = t
    tokens = [t or f"[PAD{i}]" for i, t in enumerate(tokens)]
    special = set(SPECIALS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    # llama.cpp requires a merges list (pacer never tokenizes with llama.cpp); transformers cannot rebuild this
    # tokenizer from it, so pair the file with the tokenizer itself (tests seed pacer's tokenizer cache)
    w.add_token_merges(["Ġ Ġ"])
    w.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    w.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, t in model.state_dict().items():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        key = f"model.layers.{{i}}.{m.group(2)}" if m else name
        if key not in GGUF_NAMES:
            raise ValueError(f"no GGUF name for {name}")
        w.add_tensor(GGUF_NAMES[key].format(i=m.group(1) if m else ""), t.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

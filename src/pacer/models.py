"""What every backend's models share: the :class:`LoadedModel` contract, the threads, model-folder fingerprints and
the tokenizer check of a pair. A model is loaded through its backend's record (:func:`pacer.backends.load_model`),
which this module never imports: the records name this contract.

The backends themselves (their loaded-model classes and loaders) are one file each in :mod:`pacer.backends`:
a GGUF file (the default pair's is assembled from its chunk packages, :mod:`pacer.gguf`) is run as it is by
llama.cpp (:mod:`pacer.backends.llamacpp`), or converted once for PyTorch into a safetensors folder in the
requested dtype under ``$PACER_HOME`` (:mod:`pacer.backends.transformers`).
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .cache import file_sha256, pacer_home
from .errors import PacerError
from .gguf import DEFAULT_NAMES
from .io import read_json

if TYPE_CHECKING:
    from .decoding.backend import ModelBackend

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def set_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (``None``: all cores; a resolved :class:`pacer.pair.LoadSpec`'s, checked
    there); returns the number set."""
    n = threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


# -------------------------------------------------------------------------------------------------- loading
@dataclass
class LoadedModel(ABC):
    """A loaded causal LM with its tokenizer and provenance (``source`` and ``fingerprint`` identify the weights):
    the contract every backend's loaded-model class keeps (:mod:`pacer.backends`).

    What the rest of pacer asks of a loaded model is here, never probed: :meth:`open` (a
    :class:`~pacer.decoding.backend.ModelBackend` with its own cache), ``vocab_size``, ``layers``,
    ``hidden_size``, ``weights`` (what the weights are, for cache keys), ``dtype_name`` and :meth:`end_ids`;
    ``backend`` names its backend's record. ``model`` is the runtime's own object (a ``transformers`` module, a
    llama.cpp model), read only by its backend."""

    model: Any
    tokenizer: Any
    source: str
    fingerprint: str
    dtype: torch.dtype
    extra: dict = field(default_factory=dict)
    #: the name of its backend's record (:mod:`pacer.backends`: what it can do)
    backend = ""

    @abstractmethod
    def open(self, rows: torch.Tensor | None = None) -> ModelBackend:
        """A fresh backend on these weights (its own KV cache), scoring the vocabulary ``rows`` (``None``:
        all)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def layers(self) -> int: ...

    @property
    @abstractmethod
    def hidden_size(self) -> int: ...

    @property
    @abstractmethod
    def weights(self) -> str:
        """What the weights are (``bfloat16``, ``int8+bfloat16``, ``gguf:Q4_K``, ...), for cache keys."""

    @property
    def dtype_name(self) -> str:
        """The dtype ``--dtype`` chose (a backend without dtypes: :attr:`weights`)."""
        return self.weights

    @property
    def params(self) -> int | None:
        return self.extra.get("params")

    def end_ids(self) -> set[int]:
        """End-of-sequence ids (the tokenizer's; a backend adds its model's own)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return set() if eos is None else {int(eos)}

    def describe(self) -> dict:
        return {"backend": self.backend, "source": self.source, "fingerprint": self.fingerprint,
                "dtype": self.weights, "layers": self.layers, "hidden": self.hidden_size, "params": self.params}


def configured_vocab(spec: str, dtype: str = "bfloat16", home: Path | None = None) -> int | None:
    """The vocabulary size a model's ``config.json`` states, read without loading the model (an HF folder, or a
    converted default model in the cache); ``None`` when it cannot be known before loading."""
    if spec in DEFAULT_NAMES:  # any converted dtype states the same vocabulary (``auto`` is not resolved yet)
        base = (home or pacer_home()) / "models" / DEFAULT_NAMES[spec].name
        folders = [Path(f"{base}-{d}") for d in ([dtype] if dtype in DTYPES else DTYPES)]
    else:
        folders = [Path(spec).expanduser()]
    for folder in folders:
        try:
            return int(read_json(folder / "config.json", "the model's config", "")["vocab_size"])
        except (ValueError, KeyError, TypeError):  # (BadJson is a ValueError)
            continue
    return None


def folder_fingerprint(path: Path, home: Path | None = None) -> str:
    """sha256 over a model folder's config and weight files: their names and contents (each file's hash is
    remembered by path, size and mtime, see :func:`pacer.cache.file_sha256`), so two weight sets of one shape differ."""
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.suffix in {".safetensors", ".bin", ".json"} and f.is_file():
            h.update(f.name.encode())
            h.update(file_sha256(f, home).encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ tokenizer check
PROBE_TEXTS = (
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The quick brown fox jumps over the lazy dog. 1234567890 !@#$%^&*()",
    "Grüße aus Zürich — 東京 и Москва ✓",
    "    if x == None:\n\t\treturn [i**2 for i in range(10)]",
)


def check_same_tokenizer(target_tok, draft_tok) -> None:
    """Refuse a pair whose tokenizers differ: same ids for the same texts and the same special tokens.

    Embedding sizes may be padded differently; only the tokenizers' mappings must agree.
    """
    for text in PROBE_TEXTS:
        a = target_tok.encode(text, add_special_tokens=False)
        b = draft_tok.encode(text, add_special_tokens=False)
        if a != b:
            raise PacerError(
                "draft and target tokenizers differ (they give different token ids for the same text); "
                "speculative decoding needs a draft model that shares the target's tokenizer"
            )
    if target_tok.eos_token_id != draft_tok.eos_token_id or len(target_tok) != len(draft_tok):
        raise PacerError(
            f"draft and target tokenizers differ (eos {draft_tok.eos_token_id} vs {target_tok.eos_token_id}, "
            f"size {len(draft_tok)} vs {len(target_tok)}); use a draft model with the target's tokenizer"
        )



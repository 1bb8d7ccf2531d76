"""Model loading: the default offline pair, user pairs (HF folders or GGUF files), tokenizer checks.

A GGUF file (the default pair's is assembled from its chunk packages, :mod:`pacer.gguf`) is run as it is by
llama.cpp, or converted once for PyTorch into a safetensors folder in the requested dtype under ``$PACER_HOME``
(:func:`pacer.gguf.cached_conversion`, checked against its :class:`pacer.cache.Manifest` on every use).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import backends
from .cache import file_sha256, pacer_home, sweep_stale
from .errors import PacerError
from .gguf import (
    DEFAULT_NAMES,
    assemble_gguf,
    cached_conversion,
    first_line,
    gguf_file,
    gguf_tokenizer,
    no_progress_bars,
)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def set_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (all cores by default); returns the number set."""
    n = threads or os.cpu_count() or 1
    if n <= 0:
        raise PacerError(f"threads must be positive, got {threads}")
    torch.set_num_threads(n)
    return n


# -------------------------------------------------------------------------------------------------- loading
@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and provenance (``source`` and ``fingerprint`` identify the weights), as the
    ``transformers`` backend runs it; :class:`GgufModel` is the same contract on llama.cpp.

    What the rest of pacer asks of a loaded model is here, never probed: :meth:`open` (a backend with its own
    cache), ``vocab_size``, ``layers``, ``hidden_size``, ``weights`` (what the weights are, for cache keys) and
    :meth:`end_ids`."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    fingerprint: str
    dtype: torch.dtype
    extra: dict = field(default_factory=dict)
    #: the name of its backend's record (:mod:`pacer.backends`: what it can do)
    backend = "transformers"

    def open(self, rows: torch.Tensor | None = None):
        """A fresh :class:`~pacer.decoding.backend.ModelBackend` on these weights (its own KV cache), scoring the
        vocabulary ``rows`` (``None``: all)."""
        from .decoding.hf_backend import TransformersBackend

        return TransformersBackend(self.model, rows)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def dtype_name(self) -> str:
        """The dtype the weights were loaded in (``bfloat16``, ``float32``, ...: what ``--dtype`` chose), without
        pacer's int8 quantization."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def weights(self) -> str:
        """``bfloat16``, ``float32``, ... or ``int8+bfloat16`` for int8 weight-only linear layers."""
        quant = getattr(self.model.config, "pacer_quantization", None)
        return f"{quant}+{self.dtype_name}" if quant else self.dtype_name

    def end_ids(self) -> set[int]:
        """End-of-sequence ids: the tokenizer's and the generation config's (instruct models often list
        several)."""
        ids: set[int] = set()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gc = getattr(self.model, "generation_config", None)
        if gc is not None and gc.eos_token_id is not None:
            ids.update([gc.eos_token_id] if isinstance(gc.eos_token_id, int) else gc.eos_token_id)
        return ids

    def describe(self) -> dict:
        return {"backend": self.backend, "source": self.source, "fingerprint": self.fingerprint,
                "dtype": self.weights, "layers": self.layers, "hidden": self.hidden_size,
                "params": sum(p.numel() for p in self.model.parameters())}


@dataclass
class GgufModel(LoadedModel):
    """A GGUF file run by llama.cpp (``model`` is a :class:`pacer.decoding.llama_backend.LlamaModel`)."""

    backend = "llamacpp"

    def open(self, rows: torch.Tensor | None = None):
        from .decoding.llama_backend import LlamaCppBackend

        if rows is not None:
            raise PacerError("the llamacpp backend scores the whole vocabulary; drop --draft-vocab (or use "
                             "--backend transformers)")
        return LlamaCppBackend(self.model)

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    @property
    def layers(self) -> int:
        return self.model.n_layer

    @property
    def hidden_size(self) -> int:
        return self.model.n_embd

    @property
    def weights(self) -> str:
        return f"gguf:{self.extra.get('file_type', 'unknown')}"

    @property
    def dtype_name(self) -> str:
        return self.weights  # the GGUF file's own types (``--dtype`` does not apply)

    def end_ids(self) -> set[int]:
        ids = self.model.end_tokens()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def describe(self) -> dict:
        return {"backend": self.backend, "source": self.source, "fingerprint": self.fingerprint,
                "dtype": self.weights, "layers": self.layers, "hidden": self.hidden_size,
                "params": self.extra.get("params")}


def _load_folder(path: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with no_progress_bars():  # loading a safetensors folder takes seconds; keep stderr for messages
            tok = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise PacerError(f"cannot load a model from {path}: {first_line(e)}") from e
    model.eval()
    return model, tok




def load_gguf(spec: str, home: Path | None = None, progress: bool = True) -> GgufModel:
    """Load ``spec`` (``default-target``/``default-draft`` or a ``.gguf`` file) for the llamacpp backend: the file
    as it is (no conversion), its tokenizer, its sha256 as the fingerprint."""
    from .decoding.llama_backend import LlamaModel

    home = home or pacer_home()
    sweep_stale(home)
    path, digest = gguf_file(spec, home, progress)
    model = LlamaModel(path)
    tok = gguf_tokenizer(path, digest, home)
    try:
        import gguf

        ftype = gguf.LlamaFileType(int(model.meta("general.file_type") or -1)).name.removeprefix("MOSTLY_")
    except (ValueError, ImportError):
        ftype = "unknown"
    return GgufModel(model, tok, spec, digest, torch.float32, extra={"file_type": ftype, "path": str(path),
                                                                     "params": model.n_params})


def load_model(spec: str, dtype: str = "bfloat16", home: Path | None = None, progress: bool = True,
               backend: str = "transformers") -> LoadedModel:
    """Load ``spec`` (``default-target``/``default-draft``, a Hugging Face model folder or a ``.gguf`` file) on
    ``backend`` (its record's loader, :mod:`pacer.backends`)."""
    return backends.check(backend, spec).load(spec, dtype, home, progress)


def load_hf(spec: str, dtype: str = "bfloat16", home: Path | None = None, progress: bool = True) -> LoadedModel:
    """Load ``spec`` for the ``transformers`` backend: GGUF files (including the default pair) are converted once
    to a safetensors folder in ``dtype`` and cached under ``$PACER_HOME/models`` keyed by the file's sha256, so
    later loads take seconds; a model folder is read as it is."""
    if dtype not in DTYPES:
        raise PacerError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)} (Decoder.from_pretrained also "
                         f"takes auto: pacer.machine.choose_dtype)")
    torch_dtype = DTYPES[dtype]
    home = home or pacer_home()
    if spec in DEFAULT_NAMES:
        g = DEFAULT_NAMES[spec]
        cache_dir = home / "models" / f"{g.name}-{dtype}"
        sweep_stale(home)
        model, tok = cached_conversion(lambda: assemble_gguf(g, home, progress), cache_dir, torch_dtype,
                                       lambda folder: _load_folder(folder, torch_dtype))
        return LoadedModel(model, tok, spec, g.sha256, torch_dtype)
    path = Path(spec).expanduser()
    if not path.exists():
        raise PacerError(
            f"model path '{spec}' does not exist; pass a Hugging Face model folder or a .gguf file"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise PacerError(f"'{spec}' is a file but not a .gguf; pass a model folder or a .gguf file")
        digest = file_sha256(path, home)
        cache_dir = home / "models" / f"{path.stem}-{digest[:16]}-{dtype}"
        sweep_stale(home)
        model, tok = cached_conversion(lambda: path, cache_dir, torch_dtype,
                                       lambda folder: _load_folder(folder, torch_dtype))
        return LoadedModel(model, tok, str(path), digest, torch_dtype)
    if not (path / "config.json").exists():
        raise PacerError(
            f"'{spec}' is a folder without config.json; pass a Hugging Face model folder or a .gguf file"
        )
    model, tok = _load_folder(path, torch_dtype)
    return LoadedModel(model, tok, str(path), folder_fingerprint(path, home), torch_dtype)


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
            return int(json.loads((folder / "config.json").read_text())["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError):
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


def eos_ids(loaded: LoadedModel) -> set[int]:
    """End-of-sequence ids of a loaded model (see :meth:`LoadedModel.end_ids`)."""
    return loaded.end_ids()


def describe(loaded: LoadedModel) -> dict:
    return loaded.describe()


# ------------------------------------------------------------------------------------------ the built-in backends
def _torch_version() -> str:
    return f"torch {torch.__version__}"


def _llama_version() -> str:
    from .decoding.llama_backend import LLAMA_CPP_VERSION

    return f"llama-cpp-python {LLAMA_CPP_VERSION}"


def _load_transformers(spec: str, dtype: str, home: Path | None, progress: bool) -> LoadedModel:
    return load_hf(spec, dtype, home, progress)


def _load_gguf(spec: str, dtype: str, home: Path | None, progress: bool) -> LoadedModel:
    return load_gguf(spec, home, progress)


def _gguf_only(spec: str | None) -> str | None:
    if spec is None or spec in DEFAULT_NAMES:
        return None
    path = Path(spec).expanduser()
    if (path.exists() and not (path.is_file() and path.suffix == ".gguf")) or (
            not path.exists() and path.suffix != ".gguf"):
        return (f"the llamacpp backend runs GGUF files and '{spec}' is not one; pass a .gguf file or use "
                f"--backend transformers")
    return None


def _llama_missing() -> str | None:
    from .decoding.llama_backend import LLAMA_CPP_VERSION

    if importlib.util.find_spec("llama_cpp") is None:
        return (f"the llamacpp backend needs llama-cpp-python=={LLAMA_CPP_VERSION}; run `bash scripts/setup.sh` "
                f"(it builds it, about 10 minutes once)")
    return llama_amx_problem()


#: set to 1 to run a llama-cpp-python build with llama.cpp's AMX kernels anyway (see :func:`llama_amx_problem`)
LLAMA_AMX_ENV = "PACER_LLAMA_AMX"


def llama_amx_problem(system_info: bytes | None = None) -> str | None:
    """Why the installed llama-cpp-python cannot run here, where its build compiled llama.cpp's AMX kernels
    (``system_info``: what ``llama_print_system_info`` says; read from the library when ``None``): in this
    release they die with an illegal instruction at the first matrix product (an Intel Xeon, family 6 model 207:
    ``tilezero`` with no tile configuration loaded; ggml-org/llama.cpp PR 26954), which would kill the process
    with no message. ``scripts/setup.sh`` builds without them on an AMX CPU; :data:`LLAMA_AMX_ENV` ``=1``
    overrides the check for a build known to work."""
    if os.environ.get(LLAMA_AMX_ENV) == "1":
        return None
    if system_info is None:
        from .decoding.llama_backend import lib

        system_info = bytes(lib().llama_print_system_info())
    if b"AMX_INT8 = 1" not in system_info:
        return None
    return (f"the installed llama-cpp-python was built with llama.cpp's AMX kernels, which crash (illegal "
            f"instruction) in this release; run `bash scripts/setup.sh` to rebuild it without them, or use "
            f"--backend transformers ({LLAMA_AMX_ENV}=1 runs it anyway)")


LLAMACPP = backends.register(backends.Backend(
    "llamacpp", "GGUF files as they are, on llama.cpp's own kernels (llama-cpp-python)", _load_gguf,
    _llama_version, devices=("cpu",), hidden_layers=(-1,), checkpoint_suffix="llamacpp", refuses=_gguf_only,
    missing=_llama_missing, auto=True, auto_reason="llama.cpp runs the GGUF pair as it is, on its own CPU kernels",
    # issue 14's table: llama.cpp's own p-min rule at 0.4 and 0.6, fixed γ 2..6
    bench_methods="ar,sd:gamma=2..6,confidence:threshold=0.4,confidence:threshold=0.6,entropy,pacer,ouroboros,"
                  "lookup,oracle"))
TRANSFORMERS = backends.register(backends.Backend(
    "transformers", "PyTorch (the reference): model folders, or GGUF files dequantized once", _load_transformers,
    _torch_version, devices=("cpu", "cuda"), dtypes=("bfloat16", "float32", "float16"), int8=True,
    reduced_head=True, torch_modules=True, anchor="llamacpp"))

"""The ``transformers`` backend (PyTorch, the reference): its :class:`~pacer.decoding.backend.ModelBackend`
(:class:`TransformersBackend`: a ``DynamicCache``, optional tree attention, the restricted LM head of a reduced
draft vocabulary), its loaded-model class (:class:`TransformersModel`), its loader (:func:`load_hf`: model folders,
GGUF files converted once), its automatic choices (``--dtype auto``: :func:`choose_dtype`; ``--draft-quant auto``:
:func:`choose_draft_quant`) and its record, :data:`TRANSFORMERS`.

The backend runs where its model is (:attr:`TransformersBackend.device`, see :mod:`pacer.devices`): the ids, the
tree mask and position ids of every forward are made there, and the restricted head keeps its row indices there
too (the host copies, ``rows`` and the ``_kept`` mask, are for bookkeeping), so that a forward copies nothing to the
device but its ids (and a tree's mask)."""

from __future__ import annotations

import statistics
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import DynamicCache

from ..cache import file_sha256, pacer_home, sweep_stale
from ..decoding.backend import Hidden, ModelBackend, Tree, finite
from ..errors import InvalidValue, PacerError
from ..gguf import DEFAULT_NAMES, assemble_gguf, cached_conversion, first_line, no_progress_bars
from ..machine import STORE, machine_key
from ..models import DTYPES, LoadedModel, folder_fingerprint
from ..timing import token_seconds
from . import Backend, of, register

#: restricted LM heads (weight and bias rows) per LM head and row set: a drafter's backend lives for one
#: generation, and gathering 32,768 rows of the default draft's head (58 MB in bf16) took ~20 ms a request on a
#: 2-core Zen 5; the heads are read-only, so every backend on the same rows shares one
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: row sets kept per head
_HEADS_KEPT = 2


def _restricted(head: torch.nn.Module, rows: torch.Tensor, rows_dev: torch.Tensor):
    """``(weight[rows], bias[rows] or None)`` of ``head``, made once per (weight, device, rows) and shared (a
    weight replaced in the module, as quantization does, makes its own)."""
    cache = _HEADS.setdefault(head, {})
    key = (str(rows_dev.device), rows.numpy().tobytes())
    hit = cache.get(key)
    if hit is None or hit[0] is not head.weight:
        if len(cache) >= _HEADS_KEPT:
            cache.pop(next(iter(cache)))
        bias = getattr(head, "bias", None)
        hit = cache[key] = (head.weight, head.weight.detach()[rows_dev].contiguous(),
                            bias.detach()[rows_dev] if bias is not None else None)
    return hit[1:]


class TransformersBackend(ModelBackend):
    """A ``transformers`` causal LM and its KV cache; ``rows`` restricts the LM head (a draft model only)."""

    def __init__(self, model: torch.nn.Module, rows: torch.Tensor | None = None) -> None:
        self.model = model
        self.identity = model
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.rows = None
        if rows is not None:
            self.restrict_head(rows)
        self.reset()

    @property
    def name(self) -> str:
        """The model as its errors name it: the folder it was loaded from, else its class."""
        return repr(getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # ------------------------------------------------------------------------------------- restricted head
    def restrict_head(self, rows: torch.Tensor) -> None:
        """Compute logits only for the vocabulary ids ``rows`` (``[S]``, sorted); every other id gets ``-inf``.

        The LM head is then ``S x H`` instead of ``V x H`` (see :mod:`pacer.draftvocab`). Only for a draft model:
        a target must score the whole vocabulary."""
        head = self.model.get_output_embeddings()
        cfg = self.model.config
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(cfg, attr, None) not in (None, 0, 1, 1.0):
                raise PacerError(f"a reduced draft vocabulary: this draft model transforms its logits ({attr}); "
                                 f"draft from the full vocabulary")
        rows = torch.as_tensor(rows, dtype=torch.long, device="cpu")
        V = self.vocab_size
        if rows.ndim != 1 or len(rows) == 0 or int(rows.min()) < 0 or int(rows.max()) >= V:
            raise PacerError(f"a reduced draft vocabulary: token ids must lie in [0, {V}) (the draft's vocabulary)")
        self.rows = rows.sort().values
        self._rows_dev = self.rows.to(self.device)
        self._w, self._b = _restricted(head, self.rows, self._rows_dev)
        self._kept = torch.zeros(V, dtype=torch.bool, device="cpu")
        self._kept[self.rows] = True
        self._extra: torch.Tensor | None = None
        self._extra_dev: torch.Tensor | None = None
        self._scored: tuple[int, torch.Tensor] | None = None

    def add_rows(self, ids: Sequence[int]) -> None:
        """Also score ``ids`` (e.g. the prompt's tokens, which a continuation often repeats) until :meth:`reset`."""
        new = torch.tensor(sorted(set(ids)), dtype=torch.long, device="cpu")
        new = new[(new >= 0) & (new < self.vocab_size)]
        new = new[~self._kept[new]]
        if len(new) == 0:
            return
        self._kept[new] = True
        self._extra = new if self._extra is None else torch.cat([self._extra, new])
        self._extra_dev = self._extra.to(self.device)
        head = self.model.get_output_embeddings()
        self._w_extra = head.weight.detach()[self._extra_dev].contiguous()
        self._b_extra = head.bias.detach()[self._extra_dev] if self._b is not None else None

    def scored_rows(self) -> torch.Tensor | None:
        if self.rows is None:
            return None
        key = 0 if self._extra is None else len(self._extra)
        if self._scored is None or self._scored[0] != key:  # made once per prompt, not once per drafted token
            ids = self.rows if self._extra is None else torch.cat([self.rows, self._extra]).sort().values
            self._scored = (key, ids)
        return self._scored[1]

    # ------------------------------------------------------------------------------------------ interface
    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        if self.rows is not None and self._extra is not None:
            self._kept[self._extra] = False
            self._extra = self._extra_dev = None

    def _tree_kwargs(self, tree: Tree) -> dict:
        """The 4D float mask ``(1, 1, N, length + N)`` (0 where attended, ``-inf`` elsewhere) and position ids."""
        n = len(tree.depth)
        allow = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device)
        allow[:, self.length :] = tree.attend.to(self.device)
        mask = torch.zeros(allow.shape, dtype=self.dtype, device=self.device).masked_fill_(~allow, float("-inf"))
        return {"attention_mask": mask[None, None],
                "position_ids": torch.tensor([[self.length + d for d in tree.depth]], device=self.device)}

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        """Keeping only the rows a caller reads spares the LM head over the prompt: on a 1.5B model with a 150k
        vocabulary that is ~0.5 GFLOP per prompt token."""
        kwargs = self._tree_kwargs(tree) if tree is not None else {}
        if self.rows is not None:
            return self._forward_restricted(ids, hidden, keep, kwargs)
        if keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=self._ids(ids), cache=self.cache, use_cache=True,
                         output_hidden_states=hidden, **kwargs)
        self.length += len(ids)
        hs = tuple(h[0] for h in out.hidden_states) if hidden else None
        return finite(out.logits[0].float(), self.name), hs

    def _forward_restricted(self, ids, hidden, keep, kwargs):
        """:meth:`forward` with the LM head restricted to ``rows``: the decoder stack, then ``S x H`` logits
        scattered into a ``-inf`` row of the full vocabulary (same shapes and hidden states as the full head)."""
        if self.length == 0:  # a new sequence: its prompt's tokens join the scored rows
            self.add_rows(ids)
        out = self.model.get_decoder()(input_ids=self._ids(ids), cache=self.cache,
                                       use_cache=True, output_hidden_states=hidden, **kwargs)
        self.length += len(ids)
        h = out.last_hidden_state[0]
        h = h[-keep:] if keep else h
        sub = h @ self._w.T
        if self._b is not None:
            sub = sub + self._b
        logits = torch.full((h.shape[0], self.vocab_size), float("-inf"), device=h.device)
        logits[:, self._rows_dev] = sub.float()
        if self._extra_dev is not None:
            extra = h @ self._w_extra.T
            logits[:, self._extra_dev] = (extra + self._b_extra if self._b_extra is not None else extra).float()
        hs = tuple(x[0] for x in out.hidden_states) if hidden else None
        return finite(logits, self.name), hs

    def crop(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length

    @torch.inference_mode()
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return finite(self.model(input_ids=self._ids(ids)).logits[0].float(), self.name)

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=self.device)


class TransformersModel(LoadedModel):
    """A ``transformers`` causal LM (``model``: a ``torch.nn.Module``) with its tokenizer: the
    :class:`~pacer.models.LoadedModel` contract on PyTorch."""

    backend = "transformers"

    def open(self, rows: torch.Tensor | None = None) -> TransformersBackend:
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
        ids = super().end_ids()
        gc = getattr(self.model, "generation_config", None)
        if gc is not None and gc.eos_token_id is not None:
            ids.update([gc.eos_token_id] if isinstance(gc.eos_token_id, int) else gc.eos_token_id)
        return ids

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _refused_config() -> tuple[type[BaseException], ...]:
    """The error types a model config that transformers' validators refuse is raised as (huggingface_hub's strict
    dataclasses: not a ``ValueError``, its cause is)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


#: the sizes of a model config that must be whole numbers >= 1 where given (0 divides by zero or builds an empty
#: embedding inside transformers)
CONFIG_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "head_dim", "max_position_embeddings")


def check_config_sizes(path: Path) -> None:
    """A model folder's ``config.json`` sizes (:data:`CONFIG_SIZES`, at its top and in a ``text_config``) checked
    before transformers builds the model: one line naming the field, not an error from inside the model's code."""
    from ..io import BadJson, read_json

    try:
        cfg = read_json(path / "config.json", "the model's config", "fix it or pass another model")
    except BadJson as e:
        if e.reason == "missing":
            return  # transformers says what is missing
        raise PacerError(f"cannot load a model from {path}: {e}") from None
    for part in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        if not isinstance(part, dict):
            continue
        for name in CONFIG_SIZES:
            v = part.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PacerError(f"cannot load a model from {path}: its config.json's {name} is {v!r}, not a whole "
                                 f"number >= 1; fix the config or pass another model")


def _load_folder(path: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_config_sizes(path)
    try:
        with no_progress_bars():  # loading a safetensors folder takes seconds; keep stderr for messages
            tok = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except _refused_config() as e:  # e.g. num_hidden_layers 0: the validator's reason is the cause
        raise PacerError(f"cannot load a model from {path}: its config.json is refused by transformers: "
                         f"{first_line(e.__cause__ or e)}; fix the config or pass another model") from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise PacerError(f"cannot load a model from {path}: {first_line(e)}") from e
    except (ArithmeticError, AssertionError, IndexError) as e:  # a config whose numbers build no model
        raise PacerError(f"cannot load a model from {path}: its config.json builds no model ({type(e).__name__}: "
                         f"{first_line(e)}); fix the config or pass another model") from None
    model.eval()
    return model, tok


def load_hf(spec: str, dtype: str = "bfloat16", home: Path | None = None, progress: bool = True) -> TransformersModel:
    """Load ``spec`` for the ``transformers`` backend: GGUF files (including the default pair) are converted once
    to a safetensors folder in ``dtype`` and cached under ``$PACER_HOME/models`` keyed by the file's sha256, so
    later loads take seconds; a model folder is read as it is."""
    if dtype not in DTYPES:
        raise PacerError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)} (Decoder.from_pretrained also "
                         f"takes auto: pacer.backends.transformers.choose_dtype)")
    torch_dtype = DTYPES[dtype]
    home = home or pacer_home()
    if spec in DEFAULT_NAMES:
        g = DEFAULT_NAMES[spec]
        cache_dir = home / "models" / f"{g.name}-{dtype}"
        sweep_stale(home)
        model, tok = cached_conversion(lambda: assemble_gguf(g, home, progress), cache_dir, torch_dtype,
                                       lambda folder: _load_folder(folder, torch_dtype))
        return TransformersModel(model, tok, spec, g.sha256, torch_dtype)
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
        return TransformersModel(model, tok, str(path), digest, torch_dtype)
    if not (path / "config.json").exists():
        raise PacerError(
            f"'{spec}' is a folder without config.json; pass a Hugging Face model folder or a .gguf file"
        )
    model, tok = _load_folder(path, torch_dtype)
    return TransformersModel(model, tok, str(path), folder_fingerprint(path, home), torch_dtype)


# ---------------------------------------------------------------------------------------------- dtype auto
#: what ``--dtype auto`` chooses among on a CPU (float16 has no fast CPU matrix kernels)
CPU_DTYPES = ("bfloat16", "float32")
#: the layer it times: the MLP up-projection of a 1.5B Qwen2.5 (hidden 1536 -> intermediate 8960), in
#: ``DTYPE_COPIES`` copies (220 MB in bfloat16: out of any last-level cache, as a model's weights are)
DTYPE_SHAPE = (1536, 8960)
DTYPE_COPIES = 8
#: the generation it prices: ``DTYPE_PROMPT`` prompt tokens prefilled ``DTYPE_CHUNK`` at a time, then ``DTYPE_NEW``
#: tokens decoded one at a time
DTYPE_PROMPT, DTYPE_CHUNK, DTYPE_NEW = 128, 32, 128
#: float32 holds twice the memory: it is chosen only when it prices at most this fraction of bfloat16
DTYPE_MARGIN = 0.9


def dtype_cost(t1: float, t_chunk: float) -> float:
    """Seconds of the priced generation from one linear layer's times at 1 and ``DTYPE_CHUNK`` rows."""
    return DTYPE_PROMPT / DTYPE_CHUNK * t_chunk + DTYPE_NEW * t1


def choose_dtype(device: torch.device | str = "cpu", progress: bool = True, *, reps: int = 5) -> tuple[str, str]:
    """``(dtype, why)``: the weights dtype ``--dtype auto`` loads the transformers backend's models in (the
    record's ``auto_dtype(device, progress)``: ``progress`` says on stderr that it times; ``reps`` is keyword-only,
    so that a positional ``progress`` never becomes a count of repetitions).

    On CUDA: ``bfloat16`` where the GPU has it natively (compute capability >= 8), else ``float16``. On a CPU
    :data:`DTYPE_COPIES` linear layers of shape :data:`DTYPE_SHAPE` (together larger than a CPU's last-level cache,
    so that weights stream from memory as a model's do) are timed in each of :data:`CPU_DTYPES` at 1 row (a
    decoding step) and ``DTYPE_CHUNK`` rows (prefill, verification), median of ``reps``, and the generation
    :func:`dtype_cost` prices is compared: CPUs
    without native bf16 instructions (AVX2-only ones) convert every bf16 weight to float32 on the fly and can be
    faster in float32, those with AVX-512 BF16 or AMX are faster in bfloat16. Measured once per machine, threads
    and PyTorch, cached like a calibration. Both dtypes hold the dequantized GGUF weights (float32 exactly), so
    the choice changes what plain decoding emits only by rounding; ``--dtype`` pins it."""
    dev = torch.device(device)
    if dev.type == "cuda":  # native bf16 from Ampere (compute capability 8) on; older GPUs only emulate it
        ok = torch.cuda.get_device_capability(dev)[0] >= 8
        return ("bfloat16", "a CUDA GPU with native bf16") if ok else ("float16", "a CUDA GPU without native bf16")
    key = machine_key("dtype", dtypes=list(CPU_DTYPES), margin=DTYPE_MARGIN, shape=list(DTYPE_SHAPE),
                      copies=DTYPE_COPIES, prompt=DTYPE_PROMPT, chunk=DTYPE_CHUNK, new=DTYPE_NEW)
    cached, _ = STORE.get(key)
    cost = cached.get("cost") if cached is not None else None
    if not (isinstance(cost, dict) and all(isinstance(cost.get(d), float) and cost[d] > 0 for d in CPU_DTYPES)):
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise InvalidValue(f"reps must be an integer >= 1, got {reps!r}")
        if progress:
            print("pacer: timing bfloat16 and float32 matrix kernels on this CPU for --dtype auto (once, seconds)",
                  file=sys.stderr)
        cost = {name: dtype_cost(*linear_times(name, reps)) for name in CPU_DTYPES}
        if note := STORE.keep(key, {"cost": {k: round(v, 6) for k, v in cost.items()}}):
            print(f"pacer: note: {note}", file=sys.stderr)
    choice = "float32" if cost["float32"] <= DTYPE_MARGIN * cost["bfloat16"] else "bfloat16"
    return choice, _dtype_reason(cost)


def linear_times(dtype: str, reps: int = 5) -> tuple[float, float]:
    """Median seconds of one :data:`DTYPE_SHAPE` linear layer in ``dtype`` at 1 and ``DTYPE_CHUNK`` rows (each
    repetition runs all :data:`DTYPE_COPIES` copies in turn, so none is served from the cache)."""
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    ws = [(torch.rand(DTYPE_SHAPE[1], DTYPE_SHAPE[0], generator=g) - 0.5).to(dt) for _ in range(DTYPE_COPIES)]
    times = []
    with torch.inference_mode():
        for rows in (1, DTYPE_CHUNK):
            x = torch.randn(rows, DTYPE_SHAPE[0], generator=g).to(dt)
            ts = []
            for _ in range(reps + 1):  # the first is a warm-up
                t = time.perf_counter()
                for w in ws:
                    torch.nn.functional.linear(x, w)
                ts.append((time.perf_counter() - t) / len(ws))
            times.append(statistics.median(ts[1:]))
    return times[0], times[1]


def _dtype_reason(cost: dict) -> str:
    return (f"one linear layer timed in each dtype: a {DTYPE_PROMPT}-token prompt and {DTYPE_NEW} new tokens cost "
            f"{cost['float32'] / cost['bfloat16']:.2f}x in float32 what they cost in bfloat16 on this CPU")


# ------------------------------------------------------------------------------------- draft quant auto
def choose_draft_quant(draft: LoadedModel, reps: int = 5) -> str:
    """``"int8"`` if the draft's int8 weight-only copy drafts a token at least 10% faster than the draft as loaded
    on this machine (:func:`pacer.timing.token_seconds`, median of ``reps``), else ``"none"``. Measured once
    per machine, draft and threads, and cached like a calibration."""
    import copy

    from ..quantize import available, quantize_int8

    if not available() or not of(draft).int8 or draft.model.device.type != "cpu":
        return "none"  # the int8 kernel is a CPU one
    key = machine_key("draft-quant", draft)
    cached, _ = STORE.get(key)
    if cached is not None and cached.get("choice") in ("int8", "none"):
        return cached["choice"]
    times = {}
    with torch.inference_mode():
        for kind, model in (("none", draft.model), ("int8", quantize_int8(copy.deepcopy(draft.model)))):
            times[kind] = token_seconds(TransformersBackend(model), draft.vocab_size, reps)
    choice = "int8" if times["int8"] < 0.9 * times["none"] else "none"
    if note := STORE.keep(key, {"choice": choice, "seconds": {k: round(v, 5) for k, v in times.items()}}):
        print(f"pacer: note: {note}", file=sys.stderr)
    return choice


def auto_draft_quant(draft: LoadedModel) -> LoadedModel:
    """``--draft-quant auto``: the draft quantized int8 in place where :func:`choose_draft_quant` says so."""
    from ..quantize import quantize_int8

    if choose_draft_quant(draft) == "int8":
        quantize_int8(draft.model)
    return draft


def _load(spec: str, dtype: str, home: Path | None, progress: bool) -> TransformersModel:
    return load_hf(spec, dtype, home, progress)


def _version() -> str:
    return f"torch {torch.__version__}"


TRANSFORMERS = register(Backend(
    "transformers", "PyTorch (the reference): model folders, or GGUF files dequantized once", _load, _version,
    devices=("cpu", "cuda"), dtypes=("bfloat16", "float32", "float16"), int8=True, reduced_head=True,
    torch_modules=True, anchor="llamacpp", auto_dtype=choose_dtype, auto_draft_quant=auto_draft_quant))

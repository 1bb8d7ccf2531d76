"""Files in and out. Atomic writes: a reader never sees a half-written file (temporary file in the same folder,
fsync, rename); a failed write leaves the old content and no temporary file. :func:`check_out_dir` and
:func:`check_out_file` refuse an output path that cannot be written, before any model work. :func:`read_json` /
:func:`loads_json`: the one checked JSON reader every file and request pacer reads goes through (its whole error
surface, sizes and depth bounded, one line naming what and what to do)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from errno import ELOOP
from pathlib import Path
from typing import Any

from .errors import PacerError

#: the suffix of every temporary file and folder pacer makes (``.<name>.<random>.pacer.tmp``): what the sweep of
#: ``$PACER_HOME`` removes after a killed process, and nothing else (another program's ``.tmp`` files stay)
TMP_SUFFIX = ".pacer.tmp"
#: the largest JSON document pacer reads (its own files are kilobytes to a few megabytes: answers, pools, caches)
MAX_JSON_BYTES = 256 << 20
#: the deepest nesting of arrays and objects pacer reads (its own files nest at most a few levels)
MAX_JSON_DEPTH = 64


class BadJson(PacerError, ValueError):
    """A JSON file or text that cannot be read; :attr:`reason` says why in a few words (the message adds what it is
    and what to do)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests arrays and objects deeper than ``limit`` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False


def _json_reason(text: str | bytes, max_bytes: int, max_depth: int) -> tuple[Any, str]:
    """``(document, "")`` or ``(None, why)``."""
    if len(text) > max_bytes:
        return None, f"larger than {max_bytes >> 20} MiB, the most pacer reads"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, f"not UTF-8 text (byte {e.start})"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    except RecursionError:
        return None, f"nested deeper than {max_depth} levels, the most pacer reads"
    except ValueError as e:  # an integer of more digits than Python converts (4300)
        return None, f"a number pacer cannot read ({str(e).split(';')[0]})"
    if _depth_over(doc, max_depth):
        return None, f"nested deeper than {max_depth} levels, the most pacer reads"
    if _SURROGATE_ESCAPE.search(text) and (bad := _lone_surrogate(doc)) is not None:
        return None, f"a string holds {bad!a}, a lone surrogate (an escape that is not Unicode text)"
    return doc, ""


#: a JSON escape of a UTF-16 surrogate (U+D800..U+DFFF): the only way a document that is UTF-8 holds one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(doc: Any) -> str | None:
    """The first surrogate character left alone in a string or key of ``doc`` (a pair of escapes makes one
    character and is fine), else ``None``: such a string cannot be written as UTF-8 (a tokenizer, a terminal or a
    JSON answer would fail on it)."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as e:
                return node[e.start]
    return None


def _said(problem: str, fix: str) -> str:
    return f"{problem}; {fix}" if fix else problem


def loads_json(text: str | bytes, what: str, fix: str, *, max_bytes: int = MAX_JSON_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The document in ``text`` (``what``: what it is, for the message, e.g. "the request body"; ``fix``: what to
    do), else :class:`BadJson`: not UTF-8, not JSON, nested deeper than ``max_depth``, an integer of more digits than
    Python converts, longer than ``max_bytes``."""
    doc, why = _json_reason(text, max_bytes, max_depth)
    if why:
        raise BadJson(_said(f"{what} cannot be read: {why}", fix), why)
    return doc


def read_bytes(path: str | Path, what: str, fix: str, *, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the file ``path``, else :class:`BadJson` naming ``what`` and the file: it does not exist, is a
    folder, cannot be read (the system's reason) or is larger than ``max_bytes`` (not read past that)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        why = ("missing" if isinstance(e, FileNotFoundError) else
               "a folder, not a file" if isinstance(e, IsADirectoryError) or path.is_dir() else
               f"unreadable ({e.strerror or type(e).__name__})")
        shown = {"missing": "does not exist", "a folder, not a file": "is a folder, not a file"}.get(
            why, f"cannot be read: {why}")
        raise BadJson(_said(f"{what} {path} {shown}", fix), why) from None
    if len(data) > max_bytes:
        why = f"larger than {max_bytes >> 20} MiB, the most pacer reads"
        raise BadJson(_said(f"{what} {path} cannot be read: {why}", fix), why)
    return data


def read_json(path: str | Path, what: str, fix: str, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document in the file ``path`` (:func:`loads_json`), else :class:`BadJson` naming ``what`` and the
    file: it does not exist, is a folder, cannot be read (the system's reason), is larger than ``max_bytes`` (not
    read), or is not a JSON document pacer reads."""
    path = Path(path)
    data = read_bytes(path, what, fix, max_bytes=max_bytes)
    doc, why = _json_reason(data, max_bytes, max_depth)
    if why:
        raise BadJson(_said(f"{what} {path} cannot be read: {why}", fix), why)
    return doc


def resolve_path(path: str | Path, what: str = "the path") -> Path:
    """``path`` absolute, with ``~`` expanded and every symbolic link followed: where the file or folder really is.
    The one place pacer resolves a path: a loop of symbolic links (which ``Path.resolve`` raises as a
    ``RuntimeError`` or an ``OSError``) is a one-line :class:`~pacer.errors.PacerError` naming ``what`` (the flag or
    setting)."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:
        reason = "a loop of symbolic links" if isinstance(e, RuntimeError) or getattr(e, "errno", None) == ELOOP \
            else (getattr(e, "strerror", None) or str(e))
        raise PacerError(f"{what} {path} cannot be resolved ({reason}); pass a path that leads to a file or "
                         f"folder") from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename. A ``path`` that is a
    symbolic link is written through: its target gets the new content and the link stays (a rename over the link
    would replace it with a file, and whatever else reads the target would never see the write)."""
    path = resolve_path(path, "the file") if Path(path).is_symlink() else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _probe(folder: Path, what: str, shown: str) -> None:
    """Write and remove a probe file in ``folder`` or, while it does not exist, in its nearest existing parent
    (nothing is created), else a one-line error."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is a file")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pacer-probe.", suffix=TMP_SUFFIX)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        if isinstance(e, (FileExistsError, NotADirectoryError)):
            reason = f"{folder} is a file, not a folder"
        raise PacerError(f"{what} {shown} cannot be written ({reason}); pass a path in a folder you can write "
                         f"to") from None


def check_out_dir(path: str | Path, what: str = "--out") -> Path:
    """Check, before any model work, that ``path`` can be an output folder: not an existing file, and writable (a
    probe file is written and removed in it or, while it does not exist, its nearest existing parent). A one-line
    :class:`~pacer.errors.PacerError` naming ``what`` (the flag or setting) otherwise; returns the path."""
    p = Path(path).expanduser()
    resolve_path(p, what)  # a symlink loop: said here, not as a write that fails later
    if p.exists() and not p.is_dir():
        raise PacerError(f"{what} {path} is an existing file, not a folder; pass a folder (new or made by pacer)")
    _probe(p, what, str(path))
    return p


def check_out_file(path: str | Path, what: str = "--out") -> Path:
    """Check, before any model work, that ``path`` can be written as a file: not an existing folder, and its folder
    writable (probed as in :func:`check_out_dir`). A one-line :class:`~pacer.errors.PacerError` naming ``what``
    otherwise; returns the path."""
    p = Path(path).expanduser()
    resolve_path(p, what)  # a symlink loop: said here, not as a write that fails later
    if p.is_dir():
        raise PacerError(f"{what} {path} is an existing folder, not a file; pass a file name")
    if not p.name:
        raise PacerError(f"{what} {path!r} names no file; pass a file name")
    _probe(p.parent, what, str(path))
    return p

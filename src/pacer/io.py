"""Atomic file writes: a reader never sees a half-written file (temporary file in the same folder, fsync,
rename); a failed write leaves the old content and no temporary file. :func:`check_out_dir` and
:func:`check_out_file` refuse an output path that cannot be written, before any model work."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
    from .errors import PacerError

    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is a file")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pacer-probe.", suffix=".tmp")
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
    from .errors import PacerError

    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise PacerError(f"{what} {path} is an existing file, not a folder; pass a folder (new or made by pacer)")
    _probe(p, what, str(path))
    return p


def check_out_file(path: str | Path, what: str = "--out") -> Path:
    """Check, before any model work, that ``path`` can be written as a file: not an existing folder, and its folder
    writable (probed as in :func:`check_out_dir`). A one-line :class:`~pacer.errors.PacerError` naming ``what``
    otherwise; returns the path."""
    from .errors import PacerError

    p = Path(path).expanduser()
    if p.is_dir():
        raise PacerError(f"{what} {path} is an existing folder, not a file; pass a file name")
    if not p.name:
        raise PacerError(f"{what} {path!r} names no file; pass a file name")
    _probe(p.parent, what, str(path))
    return p

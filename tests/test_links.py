"""Symbolic links: a loop given as any path (``--export-specbench``, ``--reprice``, ``--out``, ``--export``,
``PACER_HOME``) is one line, exit 2, wherever the path is resolved (:func:`pacer.io.resolve_path`, the one place);
a write to a path that is a link writes through to the link's target and leaves the link (an atomic rename over the
link once replaced it with a file, so a shared pool was never updated)."""

from __future__ import annotations

import json
import os

import pytest

from pacer import PacerError
from pacer.cli import main
from pacer.io import atomic_write_text, resolve_path


@pytest.fixture
def loop(tmp_path):
    """``loop-a -> loop-b -> loop-a``."""
    a, b = tmp_path / "loop-a", tmp_path / "loop-b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def test_the_path_resolver_says_a_loop_in_one_line(loop, tmp_path):
    with pytest.raises(PacerError, match="--flag .*loop-a cannot be resolved \\(a loop of symbolic links\\)") as e:
        resolve_path(loop, "--flag")
    assert "\n" not in str(e.value)
    with pytest.raises(PacerError, match="a loop of symbolic links"):
        resolve_path(loop / "below" / "file.json", "--flag")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolve_path(tmp_path / "link" / "x.json") == (tmp_path / "real" / "x.json").resolve()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pacer: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["bench", "--out", "{tmp}/run", "--export-specbench", "{loop}"],
    ["bench", "--out", "{loop}", "--export-specbench", "{tmp}/spec"],
    ["bench", "--reprice", "{loop}", "--costs", "{tmp}/p.json", "--out", "{tmp}/new"],
    ["bench", "--reprice", "{tmp}/run", "--costs", "{tmp}/p.json", "--out", "{loop}"],
    ["bench", "--quick", "--out", "{loop}"],
    ["collect", "--out", "{loop}", "--target", "{tmp}/none"],
    ["collect", "--out", "{loop}/below", "--target", "{tmp}/none"],
    ["train", "--data", "{tmp}/data", "--out", "{loop}"],
    ["calibrate", "--export", "{loop}", "--target", "{tmp}/none"],
    ["calibrate", "--plot", "{loop}/c.png", "--target", "{tmp}/none"],
    ["tune", "--measure-costs", "{loop}", "--target", "{tmp}/none"],
])
def test_a_symlink_loop_given_as_a_path_is_one_line(argv, loop, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "answers.jsonl").write_text("")
    (tmp_path / "p.json").write_text("{}")
    rc = main([a.replace("{tmp}", str(tmp_path)).replace("{loop}", str(loop)) for a in argv])
    line = _one_line(capsys)
    assert rc == 2 and "a loop of symbolic links" in line, line


def test_a_pacer_home_that_is_a_symlink_loop_is_one_line(loop, tmp_path, monkeypatch, capsys):
    from pacer.cache import file_sha256, sweep_stale

    monkeypatch.setenv("PACER_HOME", str(loop))
    with pytest.raises(PacerError, match="PACER_HOME .*a loop of symbolic links"):
        sweep_stale()
    (tmp_path / "m.bin").write_bytes(b"weights")
    model_loop = tmp_path / "model-loop"
    model_loop.symlink_to(loop)
    with pytest.raises(PacerError, match="a loop of symbolic links"):
        file_sha256(model_loop, tmp_path / "home")
    # a command that reads the home (the default pair lives there) says so in one line
    rc = main(["generate", "hello", "--max-new-tokens", "2"])
    line = _one_line(capsys)
    assert rc == 2 and "loop" in line and "PACER_HOME" in line, line


def test_a_write_to_a_link_writes_its_target_and_keeps_the_link(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "pool.json"
    target.write_text("old")
    link = tmp_path / "mine.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new" and link.read_text() == "new"
    assert [p.name for p in shared.iterdir()] == ["pool.json"]  # no temporary left beside it
    chain = tmp_path / "chain.json"
    chain.symlink_to(link)  # a link to a link: the final target is written
    atomic_write_text(chain, "newer")
    assert chain.is_symlink() and link.is_symlink() and target.read_text() == "newer"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(shared / "later.json")  # a link to a file not made yet: made where the link points
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (shared / "later.json").read_text() == "made"


def test_a_profile_exported_to_a_link_updates_the_linked_file(tmp_path):
    from pacer.api import Decoder
    from pacer.profiles import Profile, pair_of
    from pacer.tiny import tiny_pair
    from test_run_costs import _profile

    dec = Decoder(*tiny_pair("close"), threads=1)
    facts = pair_of(dec.pair, dec.draft_rows(dec.draft_vocab))
    target = tmp_path / "profiles" / "this-machine.json"
    target.parent.mkdir()
    _profile(facts, 0.1).save(target)
    link = tmp_path / "current.json"
    link.symlink_to(target)
    _profile(facts, 0.2, name="re-measured").save(link)
    assert link.is_symlink() and Profile.load(target).name == "re-measured"


def test_a_pool_file_that_is_a_link_is_updated_through_it(tmp_path, capsys, monkeypatch):
    """``--pool-file LINK`` on the command line: the generation's phrases land in the linked (shared) pool."""
    from pacer.tiny import save_tiny_pair

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    t, d = save_tiny_pair(tmp_path / "pair")
    shared = tmp_path / "shared"
    shared.mkdir()
    link = tmp_path / "pool.json"
    link.symlink_to(shared / "pool.json")
    capsys.readouterr()
    rc = main(["generate", "def f(x):\n    return x + 1\n\ndef g(x):\n    return", "--target", str(t), "--draft",
               str(d), "--method", "ouroboros", "--pool-file", str(link), "--max-new-tokens", "8", "--dtype",
               "float32", "--threads", "1", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert link.is_symlink() and (shared / "pool.json").is_file()
    assert json.loads((shared / "pool.json").read_text())  # the pool the generation wrote

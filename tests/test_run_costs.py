"""A benchmark run is bound to its costs: ``--resume`` compares the content of the profiles the run recorded (their
sha256 in run.json), not their path and name, and ``--own-profile`` passes the same pair check as ``--costs``."""

from __future__ import annotations

import json

import pytest

from pacer.cli import main


@pytest.fixture(scope="module")
def pair_facts():
    from pacer.api import Decoder
    from pacer.profiles import pair_of
    from pacer.tiny import tiny_pair

    dec = Decoder(*tiny_pair("close"), threads=1)
    return pair_of(dec.pair, dec.draft_rows(dec.draft_vocab))


def _profile(pair_facts, slow: float, name: str = "flat", fingerprint: str | None = None):
    from pacer.profiles import Profile

    backend, t, d = pair_facts
    if fingerprint is not None:
        t = {**t, "fingerprint": fingerprint}
    return Profile(name, {"describe": "a flat machine", "threads": 1}, backend, "torch", t, d,
                   {32: dict.fromkeys((1, 2, 4, 8), slow)}, {32: slow / 8}, {32: {1: slow / 10}}, slow / 100)


def _bench(out, *extra) -> list[str]:
    return ["bench", "--quick", "--n", "2", "--max-new-tokens", "6", "--no-progress", "--methods", "ar,sd:gamma=2",
            "--out", str(out), *extra]


@pytest.mark.parametrize("flag", ["--costs", "--own-profile"])
def test_a_profile_edited_in_place_between_a_run_and_its_resume_is_refused(flag, pair_facts, tmp_path, capsys):
    """The same file, the same name and description, other costs: once resumed into one report of two cost sets."""
    path = tmp_path / "p.json"
    original = _profile(pair_facts, 0.05)
    original.save(path)
    out = tmp_path / "run"
    assert main(_bench(out, flag, str(path))) == 0
    meta = json.loads((out / "run.json").read_text())
    recorded = meta["profile_clock"]["sha256"] if flag == "--costs" else meta["own_profile_sha256"]
    assert recorded == original.digest()
    before = (out / "answers.jsonl").read_text()
    edited = _profile(pair_facts, 0.5)  # same name, machine, backend: only the numbers differ
    assert edited.describe() == original.describe() and edited.digest() != original.digest()
    edited.save(path)
    capsys.readouterr()
    assert main([*_bench(out, flag, str(path))[:-2], "--n", "3", flag, str(path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: {flag} {path} holds other costs than the run" in err and len(err.strip().splitlines()) == 1
    assert (out / "answers.jsonl").read_text() == before
    original.save(path)  # the run's own content again: resumed
    assert main([*_bench(out, flag, str(path)), "--resume"]) == 0


def test_an_own_profile_of_another_pair_is_refused_as_costs_is(pair_facts, tmp_path, capsys):
    other = _profile(pair_facts, 0.05, "other", fingerprint="x" * 64)
    other.save(tmp_path / "other.json")
    for flag in ("--costs", "--own-profile"):
        out = tmp_path / flag.strip("-")
        assert main(_bench(out, flag, str(tmp_path / "other.json"))) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert "another target model" in lines[-1] and lines[-1].startswith("pacer: error: "), lines
        assert not (out / "answers.jsonl").exists() and not (out / "run.json").exists()


def test_a_resume_keeps_the_runs_validation_clock(pair_facts, tmp_path, capsys):
    """A run priced on a given own profile resumes on it, one on its calibration without one (either change would
    put two validation clocks in one report)."""
    path = tmp_path / "own.json"
    _profile(pair_facts, 0.05).save(path)
    with_own, without = tmp_path / "with", tmp_path / "without"
    assert main(_bench(with_own, "--own-profile", str(path))) == 0
    assert main(_bench(without)) == 0
    capsys.readouterr()
    assert main([*_bench(with_own), "--resume"]) == 2
    assert "was run with --own-profile, this run has none" in capsys.readouterr().err
    assert main([*_bench(without, "--own-profile", str(path)), "--resume"]) == 2
    assert "was run on this machine's calibration" in capsys.readouterr().err
    assert main([*_bench(without), "--resume"]) == 0

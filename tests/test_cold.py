"""Every automatic choice taken cold (nothing cached under ``$PACER_HOME``), with and without progress, through
the API, the command line and ``pacer bench`` on the tiny pair: the weights' dtype (``--dtype auto``) and the
calibration of a method without a draft model (prompt lookup: its draft tokens are free)."""

from __future__ import annotations

import json

import pytest

from pacer import Decoder, LoadSpec
from pacer.backends import transformers as hf
from pacer.cli import main
from pacer.tiny import save_tiny_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = save_tiny_pair(tmp_path_factory.mktemp("cold"))
    return str(target), str(draft)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def timed(monkeypatch):
    """The dtype choice's real timing on small layers; returns the ``reps`` each timing ran with."""
    monkeypatch.setattr(hf, "DTYPE_SHAPE", (64, 32))
    monkeypatch.setattr(hf, "DTYPE_COPIES", 2)
    real, reps = hf.linear_times, []

    def linear_times(dtype, reps_=5, **kw):
        reps.append(kw.get("reps", reps_))
        return real(dtype, kw.get("reps", reps_))

    monkeypatch.setattr(hf, "linear_times", linear_times)
    return reps


# ------------------------------------------------------------------------------------------------ dtype auto
@pytest.mark.parametrize("progress", [False, True])
def test_dtype_auto_cold_through_the_api(pair, home, timed, progress, capsys):
    """``Decoder.load`` with ``dtype="auto"`` and nothing cached times both dtypes with the full repetitions
    (with progress off too), says so only with progress on, and caches the choice."""
    dec = Decoder.load(LoadSpec(*pair, backend="transformers", dtype="auto", threads=1, progress=progress))
    assert timed == [5, 5]
    assert dec.target_info.dtype_name in hf.CPU_DTYPES
    assert ("timing bfloat16 and float32" in capsys.readouterr().err) == progress
    Decoder.load(LoadSpec(*pair, backend="transformers", dtype="auto", threads=1, progress=progress))
    assert timed == [5, 5]  # cached: not timed again


def test_dtype_auto_cold_through_the_cli_and_bench(pair, home, timed, capsys):
    rc = main(["generate", "hello", "--target", pair[0], "--draft", pair[1], "--backend", "transformers",
               "--dtype", "auto", "--threads", "1", "--max-new-tokens", "4", "--method", "ar", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert timed == [5, 5]
    for f in (home / "calibration").glob("*.json"):
        f.unlink()  # cold again, for the bench without progress
    out = home.parent / "bench"
    rc = main(["bench", "--quick", "--target", pair[0], "--draft", pair[1], "--backend", "transformers",
               "--dtype", "auto", "--n", "1", "--max-new-tokens", "4", "--methods", "ar", "--no-progress",
               "--no-anchor", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert timed == [5, 5, 5, 5]
    assert json.loads((out / "run.json").read_text())["dtype"] in hf.CPU_DTYPES

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


# ---------------------------------------------------------------------------------------- lookup's calibration
def _measures(monkeypatch) -> list[bool]:
    """Count the calibrations measured (not read from the cache). A busy machine's calibration is cached marked
    noisy and measured again by the next run (by design): the tiny models' forwards, fractions of a millisecond,
    spread that much on a shared machine, so noise is not judged here."""
    from pacer import calibration

    monkeypatch.setattr(calibration, "NOISY", 1e9)
    real, seen = calibration.measure, []

    def measure(pair, *a, **kw):
        seen.append(pair.draft_info is None)
        return real(pair, *a, **kw)

    monkeypatch.setattr(calibration, "measure", measure)
    return seen


@pytest.mark.parametrize("progress", [False, True])
def test_lookup_calibration_is_measured_once_and_read_back_through_the_api(pair, home, monkeypatch, progress):
    """Prompt lookup loads no draft model: its calibration holds ``c_d = 0`` (looked-up tokens are free); a later
    decoder reads it back from the cache instead of measuring again."""
    seen = _measures(monkeypatch)
    spec = LoadSpec(pair[0], None, backend="transformers", dtype="float32", threads=1, progress=progress)
    for _ in range(2):
        res = Decoder.load(spec).generate("hello world, hello world, hello", "lookup", max_new_tokens=6)
        assert res.extra["cost_aware"]["source"] in ("measured", "cache")
    assert seen == [True] and res.extra["cost_aware"]["source"] == "cache"


def test_lookup_through_the_cli_exits_0_and_reads_its_calibration_back(pair, home, monkeypatch, capsys):
    seen = _measures(monkeypatch)
    for _ in range(2):
        rc = main(["generate", "hello world, hello world, hello", "--method", "lookup", "--target", pair[0],
                   "--draft", pair[1], "--dtype", "float32", "--threads", "1", "--max-new-tokens", "6"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert "[cost-aware]" in err and "re-measuring" not in err
    assert seen == [True]


def test_a_zero_draft_cost_is_refused_for_a_pair_with_a_draft_model(pair, home, capsys):
    """``c_d = 0`` is a pair without a draft model's; a cached calibration of a drafting pair holding it (the
    checksum made again) is refused and measured again."""
    from pacer import calibration
    from pacer.machine import STORE

    dec = Decoder.load(LoadSpec(*pair, backend="transformers", dtype="float32", threads=1, progress=False))
    cal = dec.calibration()
    assert cal.source == "measured" and cal.costs.draft > 0
    payload = {**cal.payload(), "noisy": False,  # measured on a busy machine or not: a quiet one is read back
               "costs": {**cal.costs.to_dict(), "draft": 0.0, "draft_curve": {}}}
    STORE.put(cal.key, payload)
    loaded, why = calibration.load(cal.key)
    assert loaded is None and "'draft' is 0.0" in why
    free = {**cal.key, "draft": None}
    STORE.put(free, payload)  # the same costs for a pair without a draft model: taken
    assert calibration.load(free)[0].costs.draft == 0.0


@pytest.mark.parametrize("draft", [0.0, -1.0, float("nan"), float("inf")])
def test_costs_problems_take_a_free_draft_only_when_told(draft):
    from pacer.costs import Costs

    costs = Costs(draft, {1: 1.0, 2: 1.1})
    assert costs.problems() == [f"draft cost is {draft}"]
    assert costs.problems(free_draft=True) == ([] if draft == 0 else [f"draft cost is {draft}"])

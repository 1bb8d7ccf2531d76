"""Every whole-number setting has a maximum where it is parsed (:mod:`pacer.bounds`): the command line's flags of every
subcommand, every method option and the vLLM proposer's settings. A size past its maximum is one line naming the
bound, exit 2, before anything loads (a training width of 10^9 once allocated 32 GB, ``--shard-size 0`` wrote empty
shards for ever, ``--repeats 10^9`` computed its units before the first run, ``ngram`` 10^9 ran out of memory)."""

from __future__ import annotations

import argparse
import inspect
import json
from types import SimpleNamespace

import pytest

from pacer import PacerError, methods
from pacer.bounds import Count
from pacer.cli import build_parser, main


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _whole_number_flags() -> list[tuple[str, str, object]]:
    """(subcommand, flag, its argparse type) of every option that reads a whole number: an ``int`` type, a
    :class:`Count`, or a method option of type ``int`` (read as text, parsed and checked by its registry entry)."""
    options = {o.cli_flag: o for o in methods.all_options()}
    out = []
    for name, p in _subcommands().items():
        for a in p._actions:
            if not a.option_strings:
                continue
            flag = a.option_strings[-1]
            if a.type is int or isinstance(a.type, Count):
                out.append((name, flag, a.type))
            elif flag in options and options[flag].type is int:
                out.append((name, flag, options[flag]))
    return out


def test_the_command_line_has_subcommands_and_whole_number_flags_to_check():
    names = set(_subcommands())
    assert {"generate", "demo", "calibrate", "bench", "collect", "train", "tune", "serve"} <= names
    flags = {(s, f) for s, f, _ in _whole_number_flags()}
    for case in (("train", "--d"), ("train", "--rank"), ("collect", "--shard-size"), ("bench", "--repeats"),
                 ("generate", "--gamma"), ("serve", "--port"), ("generate", "--lookup-len")):
        assert case in flags, case


def test_every_whole_number_flag_of_every_subcommand_has_a_maximum():
    """An ``int`` flag has no range at all: every one is a :class:`Count` (or a method option with a maximum)."""
    unbounded = [f"pacer {s} {f}" for s, f, t in _whole_number_flags()
                 if t is int or getattr(t, "maximum", None) is None]
    assert not unbounded, f"whole-number flags without a maximum: {unbounded}"


def test_every_method_option_and_draft_bound_of_type_int_has_a_maximum():
    unbounded = [o.name for o in (*methods.COMMON, *methods.all_options())
                 if o.type is int and (o.maximum is None or o.minimum is None)]
    assert not unbounded


def _cases() -> list[tuple[str, str, object]]:
    """Each bounded flag once per subcommand; a method option (checked by the method request after parsing, the same
    check on every subcommand) through ``pacer generate`` with a method that takes it."""
    return [(s, f, t) for s, f, t in _whole_number_flags() if isinstance(t, Count) or s == "generate"]


def _argv(sub: str, flag: str, kind, value: str) -> list[str]:
    if isinstance(kind, Count):
        return [sub, flag, value]
    method = next(m.name for m in map(methods.get, methods.names()) if m.option(kind.name) is not None)
    return [sub, "a prompt", "--method", method, flag, value]


@pytest.mark.parametrize("sub,flag,kind", _cases(), ids=[f"{s} {f}" for s, f, _ in _cases()])
def test_a_value_past_a_flags_maximum_is_one_line_naming_it_before_anything_loads(sub, flag, kind, capsys,
                                                                                   tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    top = int(kind.maximum)
    assert main(_argv(sub, flag, kind, str(top + 1))) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pacer: error: "), err
    assert f"must be <= {top}" in err and str(top + 1) in err, err
    assert not (tmp_path / "home").exists()  # nothing was loaded or cached
    assert main(_argv(sub, flag, kind, "1e9")) == 2  # not a whole number: one line, not argparse's usage
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pacer: error: "), err


@pytest.mark.parametrize("argv,words", [
    (["train", "--data", "d", "--out", "o", "--d", "1000000000"], "--d must be <= 4096"),
    (["train", "--data", "d", "--out", "o", "--rank", "1000000000"], "--rank must be <= 4096"),
    (["collect", "--out", "o", "--shard-size", "0"], "--shard-size must be >= 1, got 0"),
    (["collect", "--out", "o", "--skip", "-5"], "--skip must be >= 0, got -5"),
    (["collect", "--out", "o", "--max-draft", "1000000000"], "--max-draft must be <= 256"),
    (["bench", "--quick", "--out", "o", "--repeats", "1000000000"], "--repeats must be <= 1000"),
    (["generate", "x", "--gamma", "1000000"], "--gamma must be <= 256"),
    (["serve", "--port", "70000"], "--port must be <= 65535"),
])
def test_the_reported_sizes_are_refused_naming_their_bound(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_train_in_code_refuses_sizes_past_their_bound(tmp_path):
    from pacer.preverify.train import train

    for kw, words in (({"d": 10**9}, "--d must be <= 4096"), ({"rank": 10**9}, "--rank must be <= 4096"),
                      ({"epochs": 10**9}, "--epochs must be <= 100000")):
        with pytest.raises(PacerError, match=words):
            train(tmp_path / "none", None, "pacer", log=None, **kw)


# ------------------------------------------------------------------------------------------ the vLLM proposer
def _vllm_config(k=6, extra=None):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=256),
                           scheduler_config=SimpleNamespace(max_num_seqs=4), additional_config=extra or {})


def _proposer_whole_number_settings() -> list[str]:
    """The proposer's whole-number settings: its class attributes that are ints, the planner's int parameters and
    what vLLM's config gives it."""
    from pacer.integrations.vllm import PacerPlanner, PacerProposer

    names = {s for s in PacerProposer.SETTINGS if isinstance(getattr(PacerProposer, s), int)}
    names |= {n for n, p in inspect.signature(PacerPlanner.__init__).parameters.items()
              if p.annotation in ("int", "int | None")}
    return sorted(names | {"num_speculative_tokens", "max_model_len", "max_num_seqs"})


def test_every_whole_number_setting_of_the_proposer_has_a_maximum():
    from pacer.integrations.vllm import _setting_ranges

    names = _proposer_whole_number_settings()
    assert {"ngram", "key_len", "max_idle", "pool_size", "capacity", "num_speculative_tokens"} <= set(names)
    ranges = _setting_ranges()
    PLANNER = {"k": "num_speculative_tokens", "max_len": "max_model_len"}
    missing = [n for n in names if PLANNER.get(n, n) not in ranges]
    assert not missing, f"proposer settings without a maximum: {missing}"


@pytest.mark.parametrize("name", ["ngram", "key_len", "max_idle"])
def test_a_proposer_setting_past_its_maximum_is_refused_when_vllm_builds_it(name):
    from pacer.integrations.vllm import PacerProposer, _setting_ranges

    top = _setting_ranges()[name].maximum
    for value in (top + 1, 10**9):
        with pytest.raises(PacerError) as e:
            PacerProposer(_vllm_config(extra={"pacer": {name: value}}))
        assert f"{name} must be <= {top}" in str(e.value) and "\n" not in str(e.value)


def test_the_planner_and_vllms_own_settings_are_bounded_too():
    import numpy as np

    from pacer.integrations.vllm import PacerPlanner, PacerProposer

    for kw, words in (({"ngram": 10**9}, "ngram must be <= 64"), ({"pool_size": 10**12}, "pool_size must be <="),
                      ({"capacity": 10**12}, "capacity must be <="), ({"k": 10**9}, "num_speculative_tokens must"),
                      ({"max_len": np.int64(10**15)}, "max_model_len must be <=")):
        with pytest.raises(PacerError, match=words):
            PacerPlanner(**{"k": 4, **kw})
    with pytest.raises(PacerError, match="num_speculative_tokens must be <= 256"):
        PacerProposer(_vllm_config(k=10**6))
    cfg = _vllm_config()
    cfg.scheduler_config.max_num_seqs = 10**9
    with pytest.raises(PacerError, match="max_num_seqs must be <="):
        PacerProposer(cfg)


def test_a_phrase_pool_made_in_code_is_bounded_as_the_options_are():
    from pacer.drafters.pool import PhrasePool

    for args in ((10**9, 100, 2), (8, 10**12, 2), (8, 100, 10**6)):
        with pytest.raises(PacerError, match="the most pacer takes"):
            PhrasePool(*args)


# ------------------------------------------------------------------------------------------ --speculative-config
@pytest.mark.parametrize("value", [[], {}, [1], 3, None, True])
def test_a_rejection_sample_method_of_another_json_type_is_one_line(value, capsys, tmp_path):
    assert main(["serve", "--target", str(tmp_path / "none"),
                 "--speculative-config", json.dumps({"rejection_sample_method": value})]) == 2
    err = capsys.readouterr().err
    assert "rejection_sample_method must be one of standard, block" in err and len(err.strip().splitlines()) == 1


def test_list_valued_sizes_are_bounded_too(capsys, tmp_path):
    """``--contexts`` is a list of whole numbers: each is checked as a flag is (a context of 10^9 tokens would be
    measured)."""
    assert main(["calibrate", "--contexts", "32,1000000000", "--target", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "--contexts must be <= 1048576" in err and len(err.strip().splitlines()) == 1, err
    assert main(["calibrate", "--contexts", "0", "--target", str(tmp_path / "none")]) == 2
    assert "--contexts must be >= 1" in capsys.readouterr().err


def test_the_apis_generation_length_has_the_command_lines_bound():
    from pacer.bounds import MAX_NEW_TOKENS
    from pacer.request import GenerationRequest, MethodRequest

    assert GenerationRequest(MethodRequest("sd"), MAX_NEW_TOKENS).max_new_tokens == MAX_NEW_TOKENS
    with pytest.raises(ValueError, match=f"max_new_tokens must be <= {MAX_NEW_TOKENS}"):
        GenerationRequest(MethodRequest("sd"), MAX_NEW_TOKENS + 1)

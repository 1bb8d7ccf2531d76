"""A load request is resolved and checked once, and a generation's options once: the checkers are counted on the
API's paths (``Decoder.load(LoadSpec(...))``, ``Decoder(target, draft, ...)``) and on the command line's
(``pacer generate``, which checks everything before any model loads), and ``Pair`` trusts a resolved spec."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from pacer import Decoder, LoadSpec, PacerError, backends, devices, quantize
from pacer.cli import main
from pacer.pair import Pair
from pacer.request import GenerationRequest, MethodRequest
from pacer.tiny import save_tiny_pair, tiny_pair

PROMPT = "hello world, this is"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tuple(str(p) for p in save_tiny_pair(tmp_path_factory.mktemp("pair")))


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Every checker of a load or a generation, counted as it runs (and then run)."""
    calls: Counter = Counter()
    for owner, name in ((devices, "check_device"), (quantize, "check_kind"), (backends, "check"),
                        (MethodRequest, "check_sampling")):
        real = getattr(owner, name)

        def wrapped(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(owner, name, wrapped)
    return calls


#: one resolution of a spec with ``quantize`` and ``draft_quant`` given: each checker once (check_kind once per kind)
ONCE = {"check_device": 1, "check_kind": 2, "check": 1}


def test_decoder_load_checks_the_spec_once(folders, counted):
    spec = LoadSpec(*folders, backend="transformers", dtype="float32", threads=1, device="cpu", draft_quant="none",
                    quantize="none", draft_vocab=0, progress=False)
    dec = Decoder.load(spec)
    assert dict(counted) == ONCE
    dec.generate(PROMPT, "sd", 4, gamma=2)
    assert counted["check_sampling"] == 1 and dict(counted) == {**ONCE, "check_sampling": 1}


def test_a_decoder_of_loaded_models_checks_their_settings_once(counted):
    Decoder(*tiny_pair("close"), threads=1, draft_vocab=0)
    assert dict(counted) == ONCE


def test_the_command_line_checks_the_load_and_the_generation_once(folders, counted, capsys):
    t, d = folders
    rc = main(["generate", PROMPT, "--target", t, "--draft", d, "--backend", "transformers", "--dtype", "float32",
               "--threads", "1", "--device", "cpu", "--draft-quant", "none", "--draft-vocab", "0",
               "--max-new-tokens", "4", "--gamma", "2", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert dict(counted) == {**ONCE, "check_sampling": 1}


def test_pair_trusts_a_resolved_spec_and_refuses_an_unresolved_one(counted):
    t, d = tiny_pair("close")
    spec = LoadSpec.loaded(t, d, threads=1)
    counted.clear()
    pair = Pair(t, d, spec=spec)
    assert not counted and pair.spec is spec and pair.device.type == "cpu"
    with pytest.raises(PacerError, match="resolved"):
        Pair(t, d, spec=LoadSpec("tiny-target", None, "transformers"))


def test_a_generation_request_is_checked_in_its_constructor_and_complete():
    with pytest.raises(PacerError, match="max_new_tokens must be >= 1"):
        GenerationRequest(MethodRequest("sd"), 0)
    job = GenerationRequest.of("sd", 8, gamma=2)
    assert GenerationRequest.of(job) is job
    with pytest.raises(PacerError, match="complete: pass gamma"):
        GenerationRequest.of(job, gamma=3)


# ------------------------------------------------------------------------------------------ a load's settings
SRC = Path(__file__).resolve().parents[1] / "src" / "pacer"


def refusers(setting: str, src: Path = SRC) -> list[str]:
    """``module.function`` of every function of pacer that raises an error stating a rule for ``setting`` (``threads
    must ...`` or ``--threads must ...``): its checkers."""
    rule = re.compile(rf"(?<![\w-])(?:{setting}|--{setting.replace('_', '-')}) must\b")
    found = []
    for path in sorted(src.rglob("*.py")):
        module = ".".join(path.relative_to(src.parent).with_suffix("").parts)
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(r, ast.Raise) and r.exc is not None and rule.search("".join(
                        c.value for c in ast.walk(r.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str)))
                    for r in ast.walk(fn)):
                found.append(f"{module}.{fn.name}")
    return found


def test_refusers_on_a_planted_module(tmp_path):
    pkg = tmp_path / "pacer"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f(t):\n    if t < 1:\n        raise ValueError(f'--threads must be >= 1, got {t}')\n"
                              "def g(t):\n    raise ValueError('the threads must')\ndef h(n):\n"
                              "    raise ValueError(f'n_threads must be {n}')\n")
    assert refusers("threads", pkg) == ["pacer.a.f", "pacer.a.g"]


def test_threads_are_checked_in_one_place():
    """One function refuses a bad ``threads`` (:func:`pacer.pair.check_threads`): the load spec, the command line's
    early check and ``pacer bench --quick`` call it (five functions checked it on their own once)."""
    assert refusers("threads") == ["pacer.pair.check_threads"]


GENERATE = ["generate", PROMPT, "--target", "/nonexistent/model"]
BENCH = ["bench", "--quick", "--n", "1", "--no-progress"]  # (--quick takes --threads 0 as its default, 1)


@pytest.mark.parametrize("argv, threads", [(GENERATE, "0"), (GENERATE, "-2"), (BENCH, "-2")])
def test_the_command_line_refuses_bad_threads_first(argv, threads, tmp_path, capsys):
    """Before anything loads or is written: one line, exit 2, in the command line's words."""
    out = tmp_path / "run"
    assert main([*argv, "--threads", threads, *(["--out", str(out)] if argv[0] == "bench" else [])]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"pacer: error: --threads must be >= 1, got {threads}"] and not out.exists()

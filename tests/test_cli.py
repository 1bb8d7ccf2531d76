"""The command line, in process (``pacer.cli.main``) on a tiny pair saved to disk."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys

import pytest

from pacer import gguf
from pacer.cli import DEMO_PROMPTS, main
from pacer.decoding import Divergence
from pacer.gguf import GgufSpec
from pacer.tiny import save_tiny_pair, tiny_tokenizer

PROMPT = "hello world, this is"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    target, draft = save_tiny_pair(root)
    other = root / "draft-other-tokenizer"
    shutil.copytree(draft, other)
    tiny_tokenizer(variant=1).save_pretrained(other)
    return {"target": str(target), "draft": str(draft), "other": str(other), "root": root}


def run(capsys, pair, *args, target=None, draft=None, dtype="float32"):
    argv = [
        *args,
        "--target",
        target or pair["target"],
        "--draft",
        draft or pair["draft"],
        "--dtype",
        dtype,
        "--threads",
        "1",
    ]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def gen_json(capsys, pair, prompt=PROMPT, *args):
    rc, out, err = run(capsys, pair, "generate", prompt, "--json", *args)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1  # one JSON object, nothing else on stdout
    return json.loads(lines[0])


def test_generate_prints_text_and_stats(capsys, pair):
    rc, out, err = run(capsys, pair, "generate", PROMPT, "--max-new-tokens", "24", "--gamma", "3", "--method", "sd")
    assert rc == 0, err
    ref = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "24", "--gamma", "3", "--method", "sd")
    # the streamed text is exactly the result's text (incomplete UTF-8 at the end included), then a newline
    assert out == ref["text"] + "\n"
    summary = [ln for ln in err.splitlines() if ln.startswith("[sd]")]
    assert len(summary) == 1 and "24 tokens" in summary[0] and "tok/s" in summary[0] and "tau" in summary[0]


def test_generate_json(capsys, pair):
    res = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "20", "--method", "heuristic")
    assert set(res) >= {"text", "token_ids", "stats"}
    st = res["stats"]
    assert st["method"] == "heuristic" and st["new_tokens"] == len(res["token_ids"]) <= 20
    assert st["tokens_per_s"] > 0 and st["target_calls"] >= 1 and st["prompt_tokens"] == len(PROMPT)
    assert res["text"] == tiny_tokenizer().decode(res["token_ids"], skip_special_tokens=True)
    # greedy speculative output equals plain decoding's
    ar = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "20", "--method", "ar")
    assert ar["token_ids"] == res["token_ids"] and ar["stats"]["tau"] == 1.0


def test_generate_reads_stdin(capsys, pair, monkeypatch):
    ref = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "8")
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert gen_json(capsys, pair, "-", "--max-new-tokens", "8")["token_ids"] == ref["token_ids"]


def test_generate_chat_sampling_and_stop(capsys, pair):
    chat = gen_json(capsys, pair, PROMPT, "--chat", "--max-new-tokens", "8")
    assert chat["stats"]["prompt_tokens"] > len(PROMPT)
    sampling = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "3", "--max-new-tokens", "12"]
    s1, s2 = (gen_json(capsys, pair, PROMPT, *sampling) for _ in range(2))  # the same seed twice
    assert s1["token_ids"] == s2["token_ids"]
    # a stop string from the middle of the output: text ends before it, streamed text equals the JSON text
    full = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "30")["text"]
    stop = next((full[i : i + 2] for i in range(4, len(full) - 2) if "\ufffd" not in full[i : i + 2]), None)
    if stop is None:
        pytest.skip("no clean two-character stop string in the output")
    res = gen_json(capsys, pair, PROMPT, "--max-new-tokens", "30", "--stop", stop)
    assert res["text"] == full[: full.index(stop)] and res["stats"]["finish_reason"] == "stop"
    rc, out, err = run(capsys, pair, "generate", PROMPT, "--max-new-tokens", "30", "--stop", stop)
    assert rc == 0 and out == res["text"] + "\n"


def test_demo_on_tiny_pair(capsys, pair):
    rc, out, err = run(capsys, pair, "demo", "--max-new-tokens", "6")
    assert rc == 0, err
    n = len(DEMO_PROMPTS)
    assert out.count("=> speedup") == n and out.count("identical to plain decoding") == n
    assert f"outputs identical: {n}/{n}" in out
    assert sum(line.startswith("=> regime: verification ") and " on transformers float32 " in line
               for line in out.splitlines()) == 1  # this machine's regime for the backend measured


def alter_sd_outputs(monkeypatch, near_tie: bool) -> None:
    """Makes every 6-token SD output differ from plain decoding in its last token, scored as a near-tie or not."""
    from pacer.api import Decoder

    real = Decoder.generate

    def altered(self, prompt, method="sd", *args, **kwargs):
        res = real(self, prompt, method, *args, **kwargs)
        if method != "ar" and len(res.token_ids) == 6:
            res.token_ids[-1] = (res.token_ids[-1] + 1) % 256
        return res

    monkeypatch.setattr(Decoder, "generate", altered)
    monkeypatch.setattr(Divergence, "near_tie", property(lambda self: near_tie))


def test_demo_reports_a_difference(capsys, pair, monkeypatch):
    """When an SD output differs (a bf16 near-tie can do that), the demo says where and how close it was."""
    alter_sd_outputs(monkeypatch, near_tie=True)
    rc, out, err = run(capsys, pair, "demo", "--max-new-tokens", "6")
    assert rc == 0, err
    n = len(DEMO_PROMPTS)
    assert out.count("DIFFERS from plain decoding at token 5 (target logit gap ") == n
    assert out.count("resolution steps of") == n and "NOT a near-tie" not in out
    assert f"outputs identical: 0/{n}" in out


def test_demo_fails_on_a_difference_that_is_not_a_near_tie(capsys, pair, monkeypatch):
    """A difference where the target was not near a tie is a real losslessness failure: exit 1, said last."""
    alter_sd_outputs(monkeypatch, near_tie=False)
    rc, out, err = run(capsys, pair, "demo", "--max-new-tokens", "6")
    assert rc == 1, err
    n = len(DEMO_PROMPTS)
    assert out.count("NOT a near-tie") == n
    last = out.strip().splitlines()[-1]
    assert f"outputs identical: 0/{n}" in last and f"FAILED: {n} output(s)" in last


# ------------------------------------------------------------------------------------------------ bad input
def fake_default(tmp_path, monkeypatch, sha):
    """Installs importable chunk packages and points 'default-target' at them, with ``sha`` as the hash."""
    data = [b"GGUF" + bytes(100), bytes(range(256))]
    for i, chunk in enumerate(data, 1):
        d = tmp_path / "site" / f"fakepart{i}" / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("")
        (d / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import importlib

    importlib.invalidate_caches()
    spec = GgufSpec("fake", ("fakepart1", "fakepart2"), "0.0.1", sha, "target")
    monkeypatch.setitem(gguf.DEFAULT_NAMES, "default-target", spec)
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    return hashlib.sha256(b"".join(data)).hexdigest()


BAD = {
    "empty prompt": (["generate", "  \n"], {}, "prompt is empty"),
    "prompt too long": (["generate", "x" * 600], {}, "context is 512"),
    "max_new_tokens 0": (["generate", PROMPT, "--max-new-tokens", "0"], {}, "--max-new-tokens"),
    "max_new_tokens negative": (["generate", PROMPT, "--max-new-tokens", "-5"], {}, "--max-new-tokens"),
    "gamma 0": (["generate", PROMPT, "--gamma", "0"], {}, "--gamma"),
    "gamma negative": (["generate", PROMPT, "--gamma", "-1"], {}, "--gamma"),
    "min > max draft": (["generate", PROMPT, "--min-draft", "5", "--max-draft", "2"], {}, "--min-draft"),
    "unknown method": (["generate", PROMPT, "--method", "turbo"], {}, "unknown method 'turbo'"),
    "negative temperature": (["generate", PROMPT, "--temperature", "-0.5"], {}, "--temperature"),
    "top-p 0": (["generate", PROMPT, "--temperature", "1", "--top-p", "0"], {}, "--top-p"),
    "negative top-k": (["generate", PROMPT, "--top-k", "-1"], {}, "--top-k"),
    "threads 0": (["generate", PROMPT], {"threads": "0"}, "--threads"),
    "missing target": (["generate", PROMPT], {"target": "/nonexistent/model"}, "does not exist"),
    "missing draft": (["generate", PROMPT], {"draft": "/nonexistent/draft"}, "does not exist"),
    "mismatched tokenizers": (["generate", PROMPT], {"draft": "other"}, "tokenizers differ"),
    "not a gguf": (["generate", PROMPT, "--method", "ar"], {"target": "bad.gguf"}, "cannot load the GGUF"),
    "oracle with sampling": (["generate", PROMPT, "--method", "oracle", "--temperature", "1"], {}, "greedy"),
    "demo gamma 0": (["demo", "--gamma", "0"], {}, "--gamma"),
    # checked before any model loads: the missing target would be the error otherwise
    "empty stop string": (["generate", PROMPT, "--stop", ""], {"target": "/nonexistent/model"}, "--stop"),
    "temperature nan": (["generate", PROMPT, "--temperature", "nan"], {"target": "/nonexistent/model"},
                        "finite"),
    "temperature inf": (["generate", PROMPT, "--temperature", "inf"], {"target": "/nonexistent/model"},
                        "finite"),
    "draft vocab negative": (["generate", PROMPT, "--draft-vocab", "-5"], {"target": "/nonexistent/model"},
                             "--draft-vocab"),
    "draft vocab too large": (["generate", PROMPT, "--draft-vocab", "100000"], {"target": "/nonexistent/model"},
                              "--draft-vocab must be 0 (the full vocabulary) or between 16 and 258"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_exit_2(capsys, pair, tmp_path, monkeypatch, case):
    argv, where, expect = BAD[case]
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    target, draft = pair["target"], pair["draft"]
    if where.get("target") == "bad.gguf":
        (tmp_path / "bad.gguf").write_bytes(b"definitely not GGUF" * 4)
        target = str(tmp_path / "bad.gguf")
    elif "target" in where:
        target = where["target"]
    if where.get("draft") == "other":
        draft = pair["other"]
    elif "draft" in where:
        draft = where["draft"]
    rest = ["--threads", where.get("threads", "1")]
    rc = main([*argv, "--target", target, "--draft", draft, "--dtype", "float32", *rest])
    out, err = capsys.readouterr()
    assert rc == 2, (case, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pacer: error: "), lines
    assert expect in lines[0], lines[0]
    assert out == ""  # nothing written half
    assert not list(tmp_path.rglob("*.tmp"))


def test_gguf_hash_mismatch_exit_2(capsys, pair, tmp_path, monkeypatch):
    actual = fake_default(tmp_path, monkeypatch, sha="0" * 64)
    rc = main(["generate", PROMPT, "--method", "ar", "--target", "default-target", "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.strip() and "assembling" not in ln]
    assert len(lines) == 1 and lines[0].startswith("pacer: error: assembled target GGUF has sha256 " + actual)
    # nothing written but the lock every pacer process holds on its home and the lock files of the entries
    assert [p.name for p in (tmp_path / "home").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []
    assert ".lock" in [p.name for p in (tmp_path / "home").iterdir()]


@pytest.mark.parametrize(
    "argv",
    [["generate"], ["generate", "x", "--dtype", "int4"], ["generate", "x", "--gamma", "two"], ["frobnicate"],
     ["generate", "x", "--verify", "blocks"]],
)
def test_argparse_errors_exit_2(capsys, argv):
    try:
        rc = main(argv)  # a bounded whole number (--gamma) is refused by pacer's one-line error, not argparse's
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert "error:" in capsys.readouterr().err


def test_console_entry_point_exit_status(pair):
    """The real process: ``python -m pacer`` exits 2 with the one-line message."""
    p = subprocess.run(
        [sys.executable, "-m", "pacer", "generate", "", "--target", pair["target"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "pacer: error: the prompt is empty; pass some text (or '-' to read standard input)"
    ]


@pytest.mark.parametrize("args,needle", [
    (["--method", "heuristic", "--threshold", "0.5"], "method 'heuristic' takes no option 'threshold'"),
    (["--method", "confidence", "--preverifier", "x"], "method 'confidence' takes no option 'path'"),
    (["--method", "sd", "--threshold", "0.5"], "method 'sd' takes no option 'threshold'"),
    (["--method", "sd", "--ngram", "3"], "method 'sd' takes no option 'ngram'"),
])
def test_options_a_method_does_not_take_are_refused(capsys, pair, args, needle):
    rc, out, err = run(capsys, pair, "generate", PROMPT, "--max-new-tokens", "4", *args)
    assert rc == 2 and err.startswith("pacer: error: ") and needle in err and len(err.strip().splitlines()) == 1


def test_demo_refuses_sampling_flags_it_would_ignore(capsys, pair):
    rc, out, err = run(capsys, pair, "demo", "--temperature", "0.7", "--stop", "x")
    assert rc == 2 and err.startswith("pacer: error: pacer demo decodes greedily") and "--temperature, --stop" in err
    assert out == ""
    rc, out, err = run(capsys, pair, "demo", "--verify", "block")  # refused as by every entry point
    assert rc == 2 and "--verify (block) needs sampling" in err and out == ""


def test_generate_verify_block(capsys, pair):
    """``--verify block`` samples with block verification: seeded draws are reproducible and are not the token-level
    rule's draws of the same seed; at temperature 0 it is refused (greedy decoding verifies by exact matching), as
    by every entry point (tests/test_verify_rule.py)."""
    sampling = ["--temperature", "1.0", "--seed", "4", "--max-new-tokens", "24", "--gamma", "4"]
    token = gen_json(capsys, pair, PROMPT, *sampling)
    block, again = (gen_json(capsys, pair, PROMPT, *sampling, "--verify", "block") for _ in range(2))
    assert block["token_ids"] == again["token_ids"] != token["token_ids"]
    greedy = ["--max-new-tokens", "16", "--gamma", "4"]
    assert gen_json(capsys, pair, PROMPT, *greedy, "--verify", "token")["token_ids"] == \
        gen_json(capsys, pair, PROMPT, *greedy)["token_ids"]


def test_non_utf8_stdin_is_a_one_line_error(capsys, pair, monkeypatch):
    class Stdin:
        buffer = io.BytesIO(b"caf\xe9 \xff\xfe")

    monkeypatch.setattr(sys, "stdin", Stdin())
    rc, out, err = run(capsys, pair, "generate", "-")
    assert rc == 2 and err.strip().splitlines() == [err.strip()] and "not UTF-8" in err


def test_negative_layer_lists_are_taken_as_written():
    from pacer.cli import _join_negative_lists, build_parser

    argv = _join_negative_lists(["collect", "--out", "x", "--layers", "-2,-1"])
    assert build_parser().parse_args(argv).layers == (-2, -1)
    assert _join_negative_lists(["generate", "-", "--max-new-tokens", "-5"])[-1] == "-5"  # other flags untouched


def test_more_threads_than_cores_are_capped_with_a_warning(capsys, pair):
    import os

    import torch

    rc = main(["generate", PROMPT, "--max-new-tokens", "4", "--target", pair["target"], "--draft", pair["draft"],
               "--dtype", "float32", "--threads", "999"])
    err = capsys.readouterr().err
    assert rc == 0 and f"using {os.cpu_count()}" in err
    assert torch.get_num_threads() == os.cpu_count()
    torch.set_num_threads(1)


def test_calibrate_prints_the_curve_and_plots_it(capsys, pair, tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    png = tmp_path / "curve.png"
    rc, out, err = run(capsys, pair, "calibrate", "--plot", str(png))
    assert rc == 0, err
    assert "machine: " in out and "PyTorch kernels" in out and "=> scoring 8 tokens costs" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:2].strip().isdigit()]
    assert {int(r[0]) for r in rows} >= {1, 2, 4, 8, 16}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((tmp_path / "home" / "calibration").glob("*.json"))  # cached
    assert "\n=> regime: verification " in out
    assert "\n=> break-even: drafting pays once " in out or "\n=> break-even: no draft pays on this curve" in out
    rc, out, err = run(capsys, pair, "calibrate", "--json")
    assert rc == 0 and json.loads(out)["source"] == "measured"  # calibrate always measures afresh
    from pacer.calibration import regime
    from pacer.costs import Costs

    doc = json.loads(out)  # the regime, from the curve just measured
    assert doc["regime"] == regime(Costs.from_dict(doc["costs"]), "transformers", doc["key"]["target_dtype"])
    from pacer import breakeven

    costs = Costs.from_dict(doc["costs"])  # the break-even acceptance of the curve just measured
    assert doc["break_even"] == breakeven.describe(costs.draft, costs.target_cost)
    rc, out, err = run(capsys, pair, "calibrate", "--plot", str(tmp_path / "curve.jpg"))
    assert rc == 2 and "--plot" in err
    rc, out, err = run(capsys, pair, "calibrate", "--plot", "/proc/nope/x.png")  # refused before measuring
    assert rc == 2 and "--plot /proc/nope/x.png cannot be written" in err and "calibrat" not in out


@pytest.mark.parametrize("field,value", [("target_cost", {"32": {}}), ("tree_cost", {"32": {}}),
                                         ("draft_cost", {"32": {"1": float("nan")}}), ("target_prefill", {"32": -1}),
                                         ("target_cost", {"32": {"1": "0.2"}})])
def test_a_bad_cost_profile_is_refused_before_any_model_loads(capsys, pair, tmp_path, field, value):
    """A profile with an empty context row (once a traceback from ``price()`` after the models loaded) or an
    unusable cost: exit 2 with one line naming the file and the field, before the (here missing) target loads."""
    from test_profiles import synthetic

    path = tmp_path / "p.json"
    path.write_text(json.dumps({**synthetic().to_dict(), field: value}))
    for argv in (["generate", PROMPT, "--costs", str(path)],
                 ["bench", "--quick", "--costs", str(path), "--out", str(tmp_path / "run")]):
        rc, out, err = run(capsys, pair, *argv, target="/nonexistent/model")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and str(path) in err and f"'{field}'" in err, err
        assert not (tmp_path / "run").exists()


def test_calibrate_says_truly_whether_it_cached(capsys, pair, tmp_path, monkeypatch):
    """``pacer calibrate`` (text and ``--json``) says where it cached a quiet calibration, and that a noisy one (the
    machine busy) is cached marked noisy, which no later run takes (once it said "NOISY: not cached" of a calibration
    it had cached, and every later run decided on it)."""
    from pacer import calibration as cal_mod

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))

    def cached() -> dict[str, bool]:  # the cached calibrations and their noisy marks (the draft's int8 choice aside)
        files = (tmp_path / "home" / "calibration").glob("*.json")
        docs = {str(p): json.loads(p.read_text())["payload"] for p in files}
        return {p: d["noisy"] for p, d in docs.items() if "costs" in d}

    monkeypatch.setattr(cal_mod, "NOISY", 1.0)  # every spread counts as noise
    rc, out, err = run(capsys, pair, "calibrate", "--json")
    doc = json.loads(out)
    path = doc["cached"]
    assert rc == 0 and doc["noisy"] and cached() == {path: True}
    assert doc["notes"][-1] == f"cached marked noisy in {path}: no later run decides on it, the next one measures again"
    rc, out, err = run(capsys, pair, "calibrate")
    assert rc == 0 and f"NOISY (the machine was busy): cached marked noisy in {path}: no later run decides" in out
    rc, out, err = run(capsys, pair, "generate", PROMPT, "--max-new-tokens", "4")  # a later run: measures again
    assert rc == 0 and f"calibration cache {path} was measured on a busy machine (noisy); re-measuring" in err
    monkeypatch.setattr(cal_mod, "NOISY", 1e9)  # quiet
    rc, out, err = run(capsys, pair, "calibrate", "--json")
    doc = json.loads(out)
    assert rc == 0 and not doc["noisy"] and doc["cached"] == path and cached() == {path: False}
    rc, out, err = run(capsys, pair, "calibrate")
    assert rc == 0 and f"cached in {path}" in out and "NOISY" not in out
    monkeypatch.setattr(cal_mod, "NOISY", 1.0)  # busy again: the quiet calibration stays, and it says so
    rc, out, err = run(capsys, pair, "calibrate", "--json")
    doc2 = json.loads(out)
    assert doc2["cached"] is None
    assert doc2["notes"][-1] == f"not cached: later runs use the calibration cached in {path}"
    rc, out, err = run(capsys, pair, "calibrate")
    assert f"NOISY (the machine was busy): not cached: later runs use the calibration cached in {path}" in out
    assert cached() == {path: False}


def test_calibrate_exports_a_cost_profile_that_generate_and_bench_take(capsys, pair, tmp_path, monkeypatch):
    """``pacer calibrate --export``: a profile of this pair with c_t(k) at each context, tree and draft curves;
    ``pacer generate --costs`` decides and clocks with it; another backend's profile is refused in one line."""
    from pacer.profiles import Profile

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    path = tmp_path / "p.json"
    rc, out, err = run(capsys, pair, "calibrate", "--export", str(path), "--contexts", "8,40")
    assert rc == 0, err
    p = Profile.load(path)
    assert set(p.target_cost) == {8, 40} and set(p.tree_cost) == {8, 40} and 1 in p.draft_cost[8]
    assert p.target["dtype"] == "float32" and p.backend == "transformers" and f"profile {p.name}" in out
    rc, out, err = run(capsys, pair, "generate", "def f(x):", "--method", "sd", "--max-new-tokens", "8", "--json",
                       "--costs", str(path))
    assert rc == 0, err
    clock = json.loads(out)["profile_clock"]
    assert clock["seconds"] > 0 and clock["wall_seconds"] > 0 and p.name in clock["profile"]
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "backend": "llamacpp"}))
    rc, out, err = run(capsys, pair, "generate", "def f(x):", "--max-new-tokens", "4", "--costs", str(path))
    assert rc == 2 and "llamacpp backend" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run(capsys, pair, "calibrate", "--export", str(tmp_path), "--contexts", "8")
    assert rc == 2 and "existing folder" in err


def test_the_glossary_names_every_printed_statistic(capsys, pair):
    """Every field ``pacer generate --json`` prints (a phrase drafter's, so that the drafter's fields are there too;
    the cost rule's; the statistics') is explained in docs/glossary.md, as are the printed lines' labels."""
    import re
    from pathlib import Path

    glossary = (Path(__file__).resolve().parents[1] / "docs" / "glossary.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w]+)`", glossary))
    doc = gen_json(capsys, pair, PROMPT, "--method", "ouroboros", "--max-new-tokens", "16")

    def keys(obj: dict, path: str = "") -> list[str]:
        out = []
        for k, v in obj.items():
            if k.isdigit() or path.endswith(("_by_source", "histogram", "target", "draft_curve")):
                continue  # a curve's k, a histogram's bin, a source's name: values, not fields
            out.append(k)
            if isinstance(v, dict):
                out += keys(v, k)
        return out

    missing = sorted(set(keys(doc)) - named)
    assert not missing, f"docs/glossary.md does not explain {missing}"
    for label in ("[cost-aware]", "[profile clock]", "=> break-even:", "why not faster:", "outputs identical:"):
        assert label in glossary

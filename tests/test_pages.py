"""The measured pages are their reports: every table of docs/results.md and the README's is rebuilt in memory from
the committed reports (scripts/build_pages.py) and must equal the page; and every committed report's header is a
command that reproduces it: pacer bench's own parser and method-spec parser read it, it names no machine path,
every file it names is in the tree, every method loads on its backend, it writes the labels of its tables, a
profile it prices with has the content hash the report recorded, and its run.json and summary.json record the same
command."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_pages", ROOT / "scripts" / "build_pages.py")
pages = importlib.util.module_from_spec(spec)
sys.modules["build_pages"] = pages  # its dataclasses look their module up
spec.loader.exec_module(pages)

REPORTS = sorted((ROOT / "docs" / "bench").rglob("report.md"))


@pytest.mark.parametrize("page", list(pages.PAGES), ids=lambda p: p.name)
def test_every_table_is_its_reports(page):
    bad = pages.differences(page, page.read_text(encoding="utf-8"), pages.PAGES[page]())
    assert not bad, "run PYTHONPATH=src python scripts/build_pages.py:\n" + "\n".join(bad)


def test_a_hand_edited_figure_is_caught():
    """One figure changed by hand in a table (pacer's speedup on the AMX Xeon) is named, with the line."""
    page = ROOT / "docs" / "results.md"
    text = page.read_text(encoding="utf-8")
    s = pages.summary("tf-live-xeon-amx")["groups"]["overall"]["pacer"]
    figure = pages.fmt(s["speedup"])
    row = next(line for line in text.splitlines() if line.startswith("| pacer |") and figure in line)
    edited = text.replace(row, row.replace(figure, "9.99x", 1), 1)
    bad = pages.differences(page, edited, pages.PAGES[page]())
    assert len(bad) == 1 and "table 'xeon64'" in bad[0] and "9.99x" in bad[0], bad
    assert not pages.differences(page, text, pages.PAGES[page]())


def test_a_table_without_its_marker_or_block_is_refused():
    with pytest.raises(SystemExit, match="lacks the marker of b"):
        pages.rebuild("<!-- table:a -->\nx\n<!-- /table:a -->\n", {"a": "y", "b": "z"})
    with pytest.raises(SystemExit, match="marks a table 'a' that nothing builds"):
        pages.rebuild("<!-- table:a -->\nx\n<!-- /table:a -->\n", {})


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.parent.relative_to(ROOT / "docs" / "bench")))
def test_every_report_header_reruns_it(report, monkeypatch):
    """Every header parses with today's pacer bench, loads every method on its backend and writes exactly the
    labels of its report's tables; a profile it prices with is the one whose content hash the report recorded."""
    monkeypatch.chdir(ROOT)  # the paths a command names are the repository's
    assert not pages.report_problems(report), f"{report}: " + "; ".join(pages.report_problems(report))


BLOCK = "docs/bench/block-zen4-llamacpp/t07"


def _planted(monkeypatch, old: str, new: str, labels=None, sha=None, out=BLOCK):
    """The problems of the block report's header with ``old`` replaced by ``new`` (and its summary's labels or
    profile hash replaced where given)."""
    monkeypatch.chdir(ROOT)
    command = pages.header_command(ROOT / BLOCK / "report.md")
    assert old in command
    command = command.replace(old, new)
    s = json.loads((ROOT / BLOCK / "summary.json").read_text())
    s["meta"]["command"] = command
    if labels is not None:
        s["groups"]["overall"] = {k: {} for k in labels}
    if sha is not None:
        s["meta"]["profile_clock"]["sha256"] = sha
    return pages.header_problems(command, s, out)


def test_the_block_report_header_is_clean(monkeypatch):
    assert _planted(monkeypatch, "--seed 0", "--seed 0") == []


@pytest.mark.parametrize("old,new,labels,sha,out,why", [
    # the header's --methods writes other labels than the tables show (a rewritten spec)
    ("sd:gamma=4:verify=block", "sd:gamma=4:verify=block:min_draft=1", None, None, BLOCK, "writes the labels"),
    # an option today's code does not have
    ("sd:gamma=4:verify=block", "sd:gamma=4:verify=block:lookup=8", None, None, BLOCK, "refuses it"),
    # a transformers checkpoint run on llama.cpp
    ("ar,sd:gamma=4", "ar,pacer:path=src/pacer/checkpoints/pacer-default,sd:gamma=4", ["ar",
     "pacer:path=src/pacer/checkpoints/pacer-default", "sd:gamma=4", "sd:gamma=4:verify=block"], None, BLOCK,
     "reads features of the transformers backend"),
    # a checkpoint path not in the tree
    ("ar,sd:gamma=4", "ar,pacer:path=docs/bench/k1000-checkpoint,sd:gamma=4", None, None, BLOCK, "refuses it"),
    # a label naming a checkpoint the header does not load (the tables name another layer)
    ("ar,sd:gamma=4", "ar,pacer:path=src/pacer/checkpoints/pacer-llamacpp,sd:gamma=4", ["ar",
     "pacer:path=src/pacer/checkpoints/pacer-default", "sd:gamma=4", "sd:gamma=4:verify=block"], None, BLOCK,
     "writes the labels"),
    # a profile re-measured since the run priced with it
    ("--seed 0", "--seed 0", None, "0" * 64, BLOCK, "re-measured since"),
    # a run written elsewhere than its report's folder
    ("--seed 0", "--seed 0", None, None, "docs/bench/block-zen4-llamacpp/t10", "not the report's folder"),
    # an absolute path
    ("--costs docs/", "--costs /work/docs/", None, None, BLOCK, "machine paths"),
])
def test_each_header_defect_is_refused(monkeypatch, old, new, labels, sha, out, why):
    bad = _planted(monkeypatch, old, new, labels, sha, out)
    assert any(why in b for b in bad), bad


def test_a_report_priced_before_its_profile_hash_was_recorded_is_refused(monkeypatch):
    monkeypatch.chdir(ROOT)
    command = pages.header_command(ROOT / BLOCK / "report.md")
    s = json.loads((ROOT / BLOCK / "summary.json").read_text())
    del s["meta"]["profile_clock"]["sha256"]
    assert any("recorded none" in b for b in pages.header_problems(command, s, BLOCK))


def test_the_readme_table_takes_held_out_reports_only(monkeypatch, tmp_path):
    """The README's rows come from docs/bench/readme/; a development-set report is refused there."""
    folder = tmp_path / "readme" / "x"
    folder.mkdir(parents=True)
    s = json.loads((ROOT / BLOCK / "summary.json").read_text())
    s["groups"]["overall"]["pacer"] = {**s["groups"]["overall"]["sd:gamma=4"]}
    (folder / "summary.json").write_text(json.dumps(s))
    monkeypatch.setattr(pages, "BENCH", tmp_path)
    monkeypatch.setattr(pages, "README_REPORTS", tmp_path / "readme")
    with pytest.raises(SystemExit, match="development set"):
        pages.regime_table()
    s["meta"]["datasets"] = "humaneval,gsm8k"
    (folder / "summary.json").write_text(json.dumps(s))
    table = pages.regime_table()
    assert "[readme/x](docs/bench/readme/x/report.md)" in table and "`pacer` drafts" in table
    assert "`sd:gamma=4` " + pages.fmt(s["groups"]["overall"]["sd:gamma=4"]["wall_speedup"]) + " wall" in table


@pytest.mark.parametrize("page", pages.PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_prose_figure_is_built_or_cites_its_file(page):
    """A number with a unit (ms, s, tok/s, GB, %) or an "x" speed figure in the prose of README.md and docs/ sits
    in a built block or cites its file (a relative link or a backticked path in the tree) in its paragraph."""
    bad = pages.unchecked_figures(page, page.read_text(encoding="utf-8"))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("figure", ["3-40 s", "1.14x", "12%", "250 ms", "5.2 tok/s"])
def test_a_changed_prose_figure_is_caught(figure):
    """A figure written into prose without its source, or one changed inside a built table, fails."""
    page = ROOT / "README.md"
    text = page.read_text(encoding="utf-8")
    edited = text.replace("## Use\n", f"## Use\n\nCalibration takes {figure} here.\n", 1)
    bad = pages.unchecked_figures(page, edited)
    assert len(bad) == 1 and figure in bad[0], bad
    cited = text.replace("## Use\n", f"## Use\n\nCalibration takes {figure} ([results](docs/results.md)).\n", 1)
    assert not pages.unchecked_figures(page, cited)
    results = ROOT / "docs" / "results.md"
    body = results.read_text(encoding="utf-8")
    row = next(line for line in body.splitlines() if line.startswith("| pacer |"))
    changed = body.replace(row, row.replace(row.split(" | ")[1], "9.99x", 1), 1)
    assert pages.differences(results, changed, pages.PAGES[results]())


def test_the_lossless_table_counts_drafting_outputs_on_their_backends_scale(monkeypatch, tmp_path):
    """An output that drafted nothing is plain decoding by construction and is not counted; a llama.cpp divergence
    is measured in multiples of its block noise, a bf16 one in steps of the dtype's resolution."""
    folder = tmp_path / "r"
    folder.mkdir()

    def rec(method, qid, drafts, lossless):
        return {"method": method, "dataset": "d", "question_id": qid, "repeat": 0, "lossless": lossless,
                "choices": [{"draft_lengths": [drafts]}]}

    records = [rec("ar", "1", [], None), rec("sd", "1", [0, 0], True), rec("sd", "2", [3, 1], True),
               rec("sd", "3", [2], False), rec("sd", "4", [4], False)]
    (folder / "answers.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    div = [{"method": "sd", "dataset": "d", "question_id": "3", "repeat": 0, "gap": 0.5, "top2_gap": 0.5,
            "resolution": 1e-6, "noise": 0.4},
           {"method": "sd", "dataset": "d", "question_id": "4", "repeat": 0, "gap": 0.5, "top2_gap": 0.5,
            "resolution": 1e-6, "noise": 0.2}]
    (folder / "summary.json").write_text(json.dumps({"divergences": div, "meta": {}, "groups": {"overall": {}}}))
    monkeypatch.setattr(pages, "BENCH", tmp_path)
    c = pages.lossless_counts("r")
    assert (c["checked"], c["identical"], c["differ"], c["within"], c["beyond"]) == (3, 1, 2, 1, 1), c
    assert c["worst"] == "2.5 x noise"
    assert pages.divergence_scale({"gap": 0.25, "top2_gap": 0.5, "resolution": 0.125}) == (2.0, "steps")


def test_a_table_counts_the_questions_that_ran():
    """The question count is the questions run (``ar``'s), and a method that ran fewer is named with its count."""
    s = pages.summary("tf-live-xeon-amx")
    assert pages.questions_ran(s) == "40 questions (ar@llamacpp 39)"
    s["groups"]["overall"]["ar@llamacpp"]["questions"] = 40
    assert pages.questions_ran(s) == "40 questions"

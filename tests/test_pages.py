"""The measured pages are their reports: every table of docs/results.md and the README's is rebuilt in memory from
the committed reports (scripts/build_pages.py) and must equal the page; and every committed report's header is a
command that reproduces it: pacer bench's own parser and method-spec parser read it, it names no machine path,
every file it names is in the tree, and its run.json and summary.json record the same command."""

from __future__ import annotations

import importlib.util
import json
import shlex
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
    """One figure changed by hand in a table (pacer's speedup on the development set) is named, with the line."""
    page = ROOT / "docs" / "results.md"
    text = page.read_text(encoding="utf-8")
    s = pages.summary("dev40-zen4")["groups"]["overall"]["pacer"]
    figure = pages.fmt(s["wall_speedup"])
    row = next(line for line in text.splitlines() if line.startswith("| pacer |") and figure in line)
    edited = text.replace(row, row.replace(figure, "9.99x", 1), 1)
    bad = pages.differences(page, edited, pages.PAGES[page]())
    assert len(bad) == 1 and "table 'dev40'" in bad[0] and "9.99x" in bad[0], bad
    assert not pages.differences(page, text, pages.PAGES[page]())


def test_a_table_without_its_marker_or_block_is_refused():
    with pytest.raises(SystemExit, match="lacks the marker of b"):
        pages.rebuild("<!-- table:a -->\nx\n<!-- /table:a -->\n", {"a": "y", "b": "z"})
    with pytest.raises(SystemExit, match="marks a table 'a' that nothing builds"):
        pages.rebuild("<!-- table:a -->\nx\n<!-- /table:a -->\n", {})


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.parent.relative_to(ROOT / "docs" / "bench")))
def test_every_report_header_reproduces_it(report, monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths a command names are the repository's
    command = pages.header_command(report)
    argv = shlex.split(command)
    machine = [a for a in argv if a.startswith(("/", "~")) or ".venv" in a or "/work/" in a]
    assert not machine, f"{report}: machine paths in its command: {machine}"
    if argv[:2] != ["pacer", "bench"]:  # a script's report: the script is in the tree
        assert argv[0] == "python" and (ROOT / argv[1]).is_file(), f"{report}: {command}"
        return
    args = pages.parse_bench_command(command)
    assert args.backend != "auto" and args.threads, f"{report}: --backend and --threads decide the result"
    if args.backend == "transformers":
        assert args.dtype != "auto" and args.draft_quant != "auto", f"{report}: --dtype / --draft-quant auto"
    for path in (args.questions, args.costs, args.own_profile, args.validation):
        assert path is None or (ROOT / path).exists(), f"{report}: {path} is not in the tree"
    meta = json.loads((report.parent / "run.json").read_text())
    assert meta["command"] == command, f"{report}: run.json records another command"
    assert pages.summary(str(report.parent.relative_to(ROOT / "docs" / "bench")))["meta"]["command"] == command


def test_a_header_that_does_not_reproduce_is_refused(monkeypatch):
    """The header check itself: a method pacer bench refuses, a checkpoint not in the tree, an option unknown."""
    monkeypatch.chdir(ROOT)
    base = "pacer bench --dataset dev --backend transformers --threads 2 --out runs/x --methods "
    for methods in ("ar,ar@llamacpp", "ar,pacer:path=docs/bench/k1000-checkpoint", "ar,ouroboros:lookup=8"):
        with pytest.raises(Exception):  # noqa: B017 - PacerError or the parser's SystemExit
            pages.parse_bench_command(base + methods)
    assert pages.parse_bench_command(base + "ar,pacer+ouroboros:lookup_len=8").specs[1].label.endswith("=8")

"""The developer scripts check their inputs as pacer's commands do: ``scripts/build_pages.py`` on a damaged
``summary.json`` or profile and ``scripts/decisions.py --compare`` on a cut or foreign record end in one line and
exit 2 (pacer's checked JSON reader and the profile reader), never a raw exception; decisions.py checks before its
run."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pages(tmp_path, monkeypatch):
    """build_pages over a copy of the committed reports and profiles (damaged by the test)."""
    pages = _script("build_pages")
    bench, profiles = tmp_path / "bench", tmp_path / "profiles"
    shutil.copytree(ROOT / "docs" / "bench", bench)
    shutil.copytree(ROOT / "docs" / "profiles", profiles)
    monkeypatch.setattr(pages, "BENCH", bench)
    monkeypatch.setattr(pages, "PROFILES", profiles)
    monkeypatch.setattr(pages, "README_REPORTS", bench / "readme")
    return pages


def _summary_read_by_a_table(pages) -> Path:
    read = []
    real = pages.summary

    def spy(report):
        read.append(report)
        return real(report)

    pages.summary = spy
    try:
        assert pages.main(["--check"]) == 0  # the copy builds the pages as the tree does
    finally:
        pages.summary = real
    return pages.BENCH / read[0] / "summary.json"


def _damage(path: Path, how: str) -> None:
    text = path.read_text(encoding="utf-8")
    if how == "cut":
        path.write_text(text[: len(text) // 2], encoding="utf-8")
    elif how == "not an object":
        path.write_text("[1, 2]", encoding="utf-8")
    elif how == "no meta":
        path.write_text(json.dumps({"groups": {}}), encoding="utf-8")
    elif how == "meta without its fields":
        path.write_text(json.dumps({"meta": {}}), encoding="utf-8")
    elif how == "missing":
        path.unlink()
    elif how == "a folder":
        path.unlink()
        path.mkdir()


@pytest.mark.parametrize("how", ["cut", "not an object", "no meta", "meta without its fields", "missing", "a folder"])
def test_build_pages_on_a_damaged_summary_is_one_line(pages, how, capsys):
    path = _summary_read_by_a_table(pages)
    capsys.readouterr()
    _damage(path, how)
    assert pages.main(["--check"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("build_pages.py: error: ") and str(path) in lines[0], err


@pytest.mark.parametrize("how", ["cut", "not an object", "a folder"])
def test_build_pages_on_a_damaged_profile_is_one_line(pages, how, capsys):
    path = sorted(pages.PROFILES.glob("*.json"))[0]
    _damage(path, how)
    assert pages.main(["--check"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("build_pages.py: error: ") and path.name in lines[0], lines


def test_build_pages_writes_no_page_when_an_input_is_damaged(pages, tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("<!-- table:x -->\nold\n<!-- /table:x -->\n")
    path = _summary_read_by_a_table(pages)
    _damage(path, "cut")
    monkeypatch.setattr(pages, "PAGES", {page: lambda: {"x": pages.summary(path.parent.name)}, **pages.PAGES})
    assert pages.main([]) == 2
    assert page.read_text() == "<!-- table:x -->\nold\n<!-- /table:x -->\n"


@pytest.mark.parametrize("content", ['{"tiny/sd": [{"output": [1, 2', '[1, 2]', '{"tiny/sd": 3}',
                                     '{"tiny/sd": [3]}', ""])
def test_decisions_compare_on_a_cut_or_foreign_record_is_one_line_before_the_run(content, tmp_path, capsys,
                                                                                   monkeypatch):
    decisions = _script("decisions")
    monkeypatch.setattr(decisions, "run_tiny", lambda: pytest.fail("the record is checked before the run"))
    record = tmp_path / "record.json"
    record.write_text(content)
    assert decisions.main(["tiny", "--compare", str(record)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decisions.py: error: decisions record ") and str(record) in \
        lines[0], lines
    assert decisions.main(["tiny", "--compare", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_decisions_differences_on_a_record_missing_a_field():
    decisions = _script("decisions")
    old = {"k": [{"output": [1, 2, 3], "draft_lengths": [2]}]}
    new = {"k": [{"output": [1, 2, 4]}]}
    assert decisions.differences(old, new) == ["k prompt 0: output differs at 2"]
    assert decisions.differences({"k": [{"extra": [1]}]}, new) == ["k prompt 0: extra differs at 0"]

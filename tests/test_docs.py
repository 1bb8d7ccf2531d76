"""Every relative Markdown link in README.md, docs/**/*.md and experiments/*.md points to a file (or folder) that
exists, and a link to a heading (``file.md#anchor`` or ``#anchor``) names a heading of that file, slugged as GitHub
does. External links (``https:``, ``mailto:``, ...) are not checked: the tests run offline. Below: the checks that
keep the tree a product (no progress-log words, no dated sections, nothing outside the repository, the README's
length, docs/bench's reports cited and within size)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "experiments").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _prose(text: str) -> str:
    """The text without code: fenced blocks dropped, inline code spans reduced to a placeholder."""
    return CODE_SPAN.sub("`code`", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup removed, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ID.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for url in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", url) or url.startswith("//"):
            continue  # external: not checked offline
        target_part, _, anchor = url.partition("#")
        target = (path.parent / target_part).resolve() if target_part else path
        if not target.exists():
            bad.append(f"{url}: no such file {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            bad.append(f"{url}: no heading #{anchor} in {target.relative_to(ROOT)}")
    return bad


def test_docs_are_found():
    assert ROOT / "README.md" in FILES and len(FILES) > 3


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    bad = broken_links(path)
    assert not bad, f"{path.relative_to(ROOT)} has broken links:\n" + "\n".join(bad)


def test_the_checker_catches_a_broken_link(tmp_path):
    """The checker itself: a missing file and a missing heading are reported; code and external links are not."""
    (tmp_path / "there.md").write_text("# A `heading`, with: punctuation\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-punctuation) [ok](#local) [web](https://example.org/x)\n"
        "[gone](nowhere.md) [no anchor](there.md#missing)\n`[code](not-a-link.md)`\n"
        "```\n[fenced](also-not.md)\n```\n## Local\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        bad = broken_links(page)
    finally:
        ROOT = saved
    assert [b.split(":")[0] for b in bad] == ["nowhere.md", "there.md#missing"], bad


# ------------------------------------------------------------------------------------------ the tree as a product
README_MAX_LINES = 160
BENCH_MAX_FOLDERS, BENCH_MAX_BYTES = 15, 10 * 1024 * 1024
#: a numbered work session, this project's issue numbers, a bare ``#N`` reference; an upstream project's pull request
#: or RFC (``vLLM PR #39487``) is a citation, told by a ``PR`` / ``RFC`` / ``pull`` shortly before the number
PROGRESS = re.compile(r"\b[Ss]essions? \d+|\b[Ii]ssues?[ -]?#?\d+|(?<![\w&/#])#\d+\b")
UPSTREAM = re.compile(r"\b(PRs?|RFCs?|pull)\b[^.;]{0,60}$")
DATED_HEADING = re.compile(r"^#{1,6} .*\b20\d\d-\d\d-\d\d", re.M)
PATH_UP = re.compile(r"(?<![\w./])((?:\.\./)+[\w./-]+)")
#: where the progress-log words are never written: everything a user reads and runs
PRODUCT = ["README.md", "docs", "src", "tests", "scripts", "experiments", ".ci", "pyproject.toml"]


def progress_words(text: str) -> list[str]:
    """The progress-log words in ``text`` (see :data:`PROGRESS`), each with its line number."""
    found = []
    for m in PROGRESS.finditer(text):
        if m.group().startswith("#") and UPSTREAM.search(text[max(0, m.start() - 80) : m.start()]):
            continue
        found.append(f"{text.count(chr(10), 0, m.start()) + 1}: {m.group()}")
    return found


def product_files(roots: list[str]) -> list[Path]:
    out = []
    for r in roots:
        p = ROOT / r
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else []
        out += [f for f in files if "__pycache__" not in f.parts and f.suffix in ("", ".md", ".py", ".sh", ".toml",
                                                                                    ".txt", ".json", ".cfg")]
    return out


def test_no_progress_log_words():
    """The tree states findings, not a diary: no numbered work session, no issue number, no bare ``#N``."""
    bad = []
    for f in product_files(PRODUCT):
        if f.suffix == ".json" and f.stat().st_size > 200_000:
            continue  # a report's summary numbers
        bad += [f"{f.relative_to(ROOT)}:{w}" for w in progress_words(f.read_text(encoding="utf-8", errors="replace"))]
    assert not bad, "progress-log words (state the finding and its numbers instead):\n" + "\n".join(bad)


def test_docs_have_no_dated_sections():
    bad = [f"{p.relative_to(ROOT)}: {m.group()}" for p in FILES for m in DATED_HEADING.finditer(
        FENCE.sub("", p.read_text(encoding="utf-8")))]
    assert not bad, "dated section headings (the docs are in the present tense):\n" + "\n".join(bad)


def outside_links(path: Path) -> list[str]:
    """Links and ``../`` paths in a page that lead outside the repository, or to nothing in it (a user's clone has
    nothing there)."""
    text = path.read_text(encoding="utf-8")
    bad = []
    for url in LINK.findall(_prose(text)):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", url) or url.startswith("//"):
            continue
        target = url.partition("#")[0]
        if target.startswith("/") or (target and not (path.parent / target).resolve().is_relative_to(ROOT)):
            bad.append(url)
    for p in PATH_UP.findall(text):  # a path written out, in prose or code: it must be in the repository
        where = (path.parent / p).resolve()
        if not where.is_relative_to(ROOT) or not where.exists():
            bad.append(p)
    return bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository(path):
    bad = outside_links(path)
    assert not bad, f"{path.relative_to(ROOT)} points outside the repository: {bad}"


def test_readme_is_a_page():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}: move details into docs/)"


def test_bench_keeps_only_cited_reports():
    """docs/bench/ holds the reports the documentation cites, within its size: every report folder is linked from a
    page other than the bench index (the results page, the README, ...) and listed in the index."""
    bench = ROOT / "docs" / "bench"
    folders = sorted(p for p in bench.iterdir() if p.is_dir())
    size = sum(f.stat().st_size for f in bench.rglob("*") if f.is_file())
    assert len(folders) <= BENCH_MAX_FOLDERS, f"docs/bench holds {len(folders)} reports (at most {BENCH_MAX_FOLDERS})"
    assert size <= BENCH_MAX_BYTES, f"docs/bench holds {size / 2**20:.1f} MB (at most {BENCH_MAX_BYTES / 2**20:.0f})"
    index = (bench / "README.md").read_text(encoding="utf-8")
    cited = "".join(p.read_text(encoding="utf-8") for p in FILES if p.parent != bench and bench not in p.parents)
    for f in folders:
        assert f"({f.name}/" in index, f"docs/bench/README.md does not list {f.name}"
        assert f"bench/{f.name}/" in cited, f"no page cites docs/bench/{f.name} (remove it: git history keeps it)"


def test_the_checkers_catch_what_they_should(tmp_path):
    """The checkers themselves, on text made here (so that this file holds none of the words it forbids)."""
    sess, iss = "Sess" + "ion", "iss" + "ue"
    n26, n31 = "#" + "26", "#" + "31"
    text = (f"{sess} 17 found it; see {iss} 25 and {iss.title()}-{n26}; fixed in {n31}.\n"
            "Colour #1f77b4, vLLM PR #39487, PRs #1, #2; RFC #48202; x = y  # 0 rows\n")
    assert [w.split(": ")[1] for w in progress_words(text)] == [f"{sess} 17", f"{iss} 25", f"{iss.title()}-{n26}", n31]
    assert DATED_HEADING.search("## 2026-12-05 (evening): a finding")
    assert not DATED_HEADING.search("measured 2026-12-05")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("[in](../README.md) [out](../../shared/x.md) [abs](/etc/x) see `../../shared/reference.md`,\n"
                    "`../shared/reference.md` (not in the repository) and `../README.md`\n")
    (tmp_path / "README.md").write_text("")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        bad = outside_links(page)
    finally:
        ROOT = saved
    assert bad == ["../../shared/x.md", "/etc/x", "../../shared/x.md", "../../shared/reference.md",
                   "../shared/reference.md"], bad


PYTHON_BLOCK = re.compile(r"(<!-- not run: [^>]+ -->\n)?```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[str | None, str]]:
    """Each Python code block of a page: (its ``<!-- not run: REASON -->`` marker or ``None``, its code)."""
    return [(m.group(1), m.group(2)) for m in PYTHON_BLOCK.finditer(text)]


@pytest.mark.parametrize("path", [p for p in FILES if "```python" in p.read_text(encoding="utf-8")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs_as_a_doctest_or_says_why_not(path, monkeypatch):
    """A Python block in README.md or docs/ is a doctest (``>>>``), run here from the repository root, or is marked
    ``<!-- not run: REASON -->`` on the line before it (it needs a model, a server, vLLM, or is a fragment)."""
    import doctest

    monkeypatch.chdir(ROOT)
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    assert blocks
    globs: dict = {}
    for marker, code in blocks:
        if marker is not None:
            continue
        assert code.lstrip().startswith(">>>"), f"{path.relative_to(ROOT)}: a Python block that neither runs as a " \
                                                f"doctest nor says why not:\n{code[:200]}"
        test = doctest.DocTestParser().get_doctest(code, globs, path.name, str(path), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, clear_globs=False)
        assert runner.failures == 0, f"{path.relative_to(ROOT)}: a doctest fails (run it to see)"
        globs = test.globs  # the page's blocks run in order, as a reader types them


def test_the_code_block_rule_catches_an_unmarked_block():
    text = "x\n```python\nimport torch\n```\n\n<!-- not run: needs a model -->\n```python\nDecoder()\n```\n"
    (first, code), (second, _) = python_blocks(text)
    assert first is None and not code.lstrip().startswith(">>>") and second == "<!-- not run: needs a model -->\n"

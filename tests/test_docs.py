"""Every relative Markdown link in README.md and docs/**/*.md points to a file (or folder) that exists, and a link
to a heading (``file.md#anchor`` or ``#anchor``) names a heading of that file, slugged as GitHub does. External
links (``https:``, ``mailto:``, ...) are not checked: the tests run offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

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

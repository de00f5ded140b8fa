"""Every relative link in README.md and docs/**/*.md resolves: the file or folder exists, and a
``#fragment`` into a markdown file names one of its headings (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(CODE_BLOCK.sub("", page.read_text(encoding="utf-8")))}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO)) for page in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Quality–speed frontier (embeddings)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#qualityspeed-frontier-embeddings) [gone](nope.md) [bad](other.md#nope)\n"
        "```\n[in code](ignored.md)\n```\n[web](https://example.com/x)\n"
    )
    assert broken_links(page) == ["nope.md (no such file)", "other.md#nope (no heading #nope)"]

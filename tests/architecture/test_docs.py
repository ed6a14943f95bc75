"""The repository documents itself: every link and every cited document resolves inside it.

- Every Markdown link in the README, `docs/` and the results folders points at a file of the
  repository (and, with a `#anchor`, at a heading of that file, slugged as GitHub slugs it).
- Every docs page that code or tests cite by its path exists.
- Nothing cites a design document outside the repository.
- The README stays a front door: at most 250 lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import PROJECT_ROOT

README_MAX_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CITED_DOC = re.compile(r"\bdocs/[\w./-]+\.md\b")
SOURCE_FOLDERS = ("engine", "playground", "tests", "presets", "assets")
# The design sketch the project started from, and the developers' scratch folder: neither is in a clone.
OUTSIDE_REFERENCES = ("DESIGN" + ".md", "../" + "shared/")


def cites_outside(text: str) -> bool:
    return any(reference in text for reference in OUTSIDE_REFERENCES)


def markdown_files() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md")),
            *sorted((PROJECT_ROOT / "assets").rglob("*.md"))]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in text.splitlines():
        if line.startswith("#"):
            slug = github_slug(line.lstrip("#"))
            count = seen.get(slug, 0)
            found.add(slug if count == 0 else f"{slug}-{count}")
            seen[slug] = count + 1
    return found


def broken_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists() or PROJECT_ROOT not in resolved.parents:
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return broken


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_markdown_link_resolves(path):
    assert not broken_links(path), broken_links(path)


def test_every_cited_doc_exists_and_no_outside_design_document_is_cited():
    missing, outside = [], []
    for folder in SOURCE_FOLDERS:
        for path in (PROJECT_ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md", ".toml", ".js") or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            name = path.relative_to(PROJECT_ROOT)
            missing += [f"{name}: {doc}" for doc in set(CITED_DOC.findall(text)) if not (PROJECT_ROOT / doc).is_file()]
            if cites_outside(text):
                outside.append(str(name))
    for path in [PROJECT_ROOT / "app.py", PROJECT_ROOT / "Makefile", *markdown_files()]:
        if cites_outside(path.read_text(encoding="utf-8")):
            outside.append(str(path.relative_to(PROJECT_ROOT)))
    assert not missing, missing
    assert not outside, f"these cite a document outside the repository: {outside}"


def test_the_link_checker_catches_a_broken_link_and_a_wrong_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.architecture.test_docs.PROJECT_ROOT", tmp_path)
    (tmp_path / "page.md").write_text("# A page\n\n## Some `code` here\n")
    good = tmp_path / "good.md"
    good.write_text("[ok](page.md#some-code-here) [web](https://example.com)\n```\n[not a link](nowhere.md)\n```\n")
    bad = tmp_path / "bad.md"
    bad.write_text("[gone](missing.md) [anchor](page.md#nothing)\n")
    assert broken_links(good) == []
    assert len(broken_links(bad)) == 2


def test_the_readme_is_a_front_door():
    lines = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"the README has {len(lines)} lines; move detail into docs/"

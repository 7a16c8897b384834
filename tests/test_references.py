"""References in the code and the tests name what a reader can open: a README
or docs section, CONTRIBUTING, a test -- not a design document, a numbered
"mechanism" or an issue that is not in the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
DANGLING = re.compile(r"\bDESIGN\b|\b[Mm]echanisms? \d|\b[Ii]ssues? #?\d|\b[Ff]inding \d|"
                      r"\b[Dd]efects? \d")
#: README "Section title" -- a section of the README or of a docs page.
SECTION = re.compile(r'README,? "([^"]+)"')
#: a test named by its file
#: a test named by its path (not a quoted path: tests write repositories with tests of their own)
TEST_FILE = re.compile(r"(?<![\"'/\w{])tests/(test_\w+\.py)\b")


def texts() -> list[tuple[Path, str]]:
    found = []
    for top in ("src", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".sql", ".css", ".js", ".html", ".toml") and "__pycache__" not in path.parts:
                found.append((path, path.read_text(errors="replace")))
    return found


def headings() -> set[str]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {line.lstrip("#").strip() for page in pages for line in page.read_text().splitlines()
            if line.startswith("#")}


def test_no_reference_to_what_is_not_in_the_tree() -> None:
    """No "DESIGN", "mechanism N", "issue N", "finding N" or "defect N" in
    ``src/`` or ``tests/`` (this file spells the patterns, it does not use them)."""
    this = Path(__file__)
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for path, text in texts() if path != this for m in DANGLING.finditer(text)]
    assert not found, found


def test_named_sections_and_tests_exist() -> None:
    """Each README section a comment names is a heading of the README, of
    CONTRIBUTING or of a docs page, and each test file it names exists."""
    known = headings()
    tests = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    missing = []
    for path, text in texts():
        if path == Path(__file__):
            continue
        for m in SECTION.finditer(text):
            title = re.sub(r"\s+(?:#:?\s+|--\s+)?", " ", m.group(1))  # a title across comment lines
            if title not in known:
                missing.append(f"{path.relative_to(ROOT)}: section {title!r}")
        for m in TEST_FILE.finditer(text):
            if m.group(1) not in tests:
                missing.append(f"{path.relative_to(ROOT)}: test {m.group(1)!r}")
    assert not missing, missing

"""The docs stay equal to what generates them: a table marked ``<!-- table: PATH -->`` in
README.md or docs/*.md is the first table of PATH (a report the benchmark wrote from its
JSON), never typed by hand; the README stays a landing page and its links resolve.
Rebuild the tables with ``UPDATE_GOLDEN=1 pytest tests/test_docs.py``."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"<!-- table: (?P<path>[^ ]+) -->\n(?P<table>.*?)<!-- /table -->\n", re.S)


def first_table(path: Path) -> str:
    lines = path.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[start:end])


def test_marked_tables_are_their_reports():
    found = 0
    for page in PAGES:
        text = page.read_text()
        if os.environ.get("UPDATE_GOLDEN"):
            text = MARKED.sub(
                lambda m: f"<!-- table: {m['path']} -->\n{first_table(ROOT / m['path'])}"
                "<!-- /table -->\n",
                text,
            )
            page.write_text(text)
        for m in MARKED.finditer(text):
            found += 1
            assert m["table"] == first_table(ROOT / m["path"]), f"{page.name}: {m['path']}"
    assert found >= 1


def test_the_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(((?:docs|bench|contracts|tests)/[^)#]+)", text)
    assert links and all((ROOT / link).exists() for link in links), links
    # a newcomer compiles a contract within the first 60 lines
    assert "clockc compile" in "\n".join(text.splitlines()[:60])

"""docs/testing.md shows the README service's and the notes example's files as they are in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOWN = [
    "tests/examples/test_readme_service.py",
    "examples/readme_service/policies.cedar",
    "tests/examples/test_notes_app.py",
    "examples/notes_app/app.py",
    "examples/notes_app/policies.cedar",
]


@pytest.mark.parametrize("path", SHOWN)
def test_docs_show_the_file_unchanged(path: str) -> None:
    """The page's code block is the whole file, so the documented tests are the ones `make test` runs."""
    docs = (REPO / "docs" / "testing.md").read_text()
    assert (REPO / path).read_text() in docs

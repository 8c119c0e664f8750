"""The documentation installed with the programs: ``bastion docs [TOPIC]`` and ``mailrelay docs [TOPIC]``.

The bastion-core wheel carries the Markdown files of the repository's ``docs/`` as ``bastion_core/_docs/``
(``make dist`` copies them in); a source checkout (the editable development install) reads ``docs/`` itself.
Help texts and error messages point here, never to a repository path a pip user does not have.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

PACKAGED = Path(__file__).parent / "_docs"
SOURCE = Path(__file__).resolve().parents[2] / "docs"  # src/bastion_core/ -> the checkout's docs/


def docs_dir() -> Path:
    """Where the Markdown files are: the packaged copy, else the source checkout's ``docs/``."""
    return PACKAGED if PACKAGED.is_dir() else SOURCE


def topics() -> dict[str, Path]:
    """Each topic (a file's name without ``.md``) and its file."""
    return {page.stem: page for page in sorted(docs_dir().glob("*.md"), key=lambda page: page.stem)}


def _title(page: Path) -> str:
    first = page.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.lstrip("# ").strip()


def show(topic: str | None, *, program: str) -> int:
    """Print one topic's file (exit 0), or the topics and their directory when ``topic`` is None; an unknown topic
    is one ``error:`` line with the closest name (exit 2)."""
    pages = topics()
    if topic is None:
        width = max(len(name) for name in pages)
        lines = [
            f"The documentation of this release, installed in {docs_dir()}:",
            *(f"  {name:<{width}}  {_title(page)}" for name, page in pages.items()),
            f"`{program} docs TOPIC` prints one (Markdown).",
        ]
        _write("\n".join(lines) + "\n")
        return 0
    page = pages.get(topic.removesuffix(".md"))
    if page is None:
        close = difflib.get_close_matches(topic, pages, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (topics: {', '.join(pages)})"
        print(f"error: no documentation topic {topic!r}{hint}", file=sys.stderr)
        return 2
    _write(page.read_text(encoding="utf-8"))
    return 0


def _write(text: str) -> None:
    """To stdout, flushed: a reader that stopped early (``| head``) raises ``BrokenPipeError`` here, for the
    command line's :func:`output_closed`."""
    sys.stdout.write(text)
    sys.stdout.flush()


EXIT_OUTPUT_CLOSED = 128 + 13
"""128 + SIGPIPE: the status a shell reports for a tool whose reader left."""


def output_closed() -> int:
    """The reader of standard output left (``bastion policy schema ... | head``): end quietly, as a tool killed by
    SIGPIPE does, without the traceback Python prints for the flush at exit. Returns the exit status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OUTPUT_CLOSED

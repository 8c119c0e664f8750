"""Code size limits (issue 28): no function over 60 lines in the app's assembly and the capability packages, no
module over 450 lines in src.

The limits are listed here, in one place; the test names every function over its limit. Functions are measured
from their ``def`` (decorators aside) to their last line, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_FUNCTION_LINES = 60
FUNCTION_LIMITED = (
    "bastion/_app.py",
    "bastion/_assembly.py",
    "bastion/_guard.py",
    "bastion/_pipeline.py",
    "bastion/auth",
    "bastion/policy",
    "bastion/ratelimit",
    "bastion/resilience",
    "mailrelay/cli.py",
    "mailrelay/_assembly.py",
)
"""The composition roots (Bastion's app, MailRelay's command and assembly) and the capabilities (auth, rate limit,
policy, resilience) with their guard adapter."""
MAX_MODULE_LINES = 450
"""No module over 450 lines in src (generated code aside: the example's protobuf modules live outside src)."""


def modules(root: str) -> list[Path]:
    path = SRC / root
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def long_functions(source: str, name: str) -> list[str]:
    """``name:line function() has N lines`` for each function of ``source`` over the limit."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}() has {length} lines")
    return found


@pytest.mark.parametrize("root", FUNCTION_LIMITED)
def test_no_function_over_the_limit(root: str) -> None:
    found = [
        line
        for path in modules(root)
        for line in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(SRC)))
    ]
    assert found == [], f"functions over {MAX_FUNCTION_LINES} lines: split them"


def test_a_function_one_line_over_the_limit_is_found() -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def too_long():\n{body}\n", "sample.py") == ["sample.py:1 too_long() has 61 lines"]
    shorter = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_LINES - 1))
    assert long_functions(f"def fits():\n{shorter}\n", "sample.py") == []


def test_no_module_over_the_limit() -> None:
    found = [
        f"{path.relative_to(SRC)} has {lines} lines"
        for path in sorted(SRC.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert found == [], f"modules over {MAX_MODULE_LINES} lines: split them on a seam"

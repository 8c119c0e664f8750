"""Fuzz target `paths` (reliability/fuzz.py) with the quick example budget: every example run, no failure."""

from __future__ import annotations

from reliability.fuzz import QUICK_EXAMPLES, TARGETS


def test_paths_fuzz_finds_no_failure() -> None:
    result = TARGETS["paths"](QUICK_EXAMPLES)
    assert result.failure is None, result.failure
    assert result.examples >= QUICK_EXAMPLES

"""Fuzz target `mime` (reliability/fuzz.py) with the quick example budget: every example run, no failure."""

from __future__ import annotations

from reliability.fuzz import QUICK_EXAMPLES, TARGETS


def test_mime_fuzz_finds_no_failure() -> None:
    result = TARGETS["mime"](QUICK_EXAMPLES)
    assert result.failure is None, result.failure
    assert result.examples >= QUICK_EXAMPLES

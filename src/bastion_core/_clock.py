"""The clock every time-dependent part takes as an argument, so tests move time by hand."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds as a float: ``time.monotonic`` for durations, ``time.time`` for wall-clock instants.

``bastion_core.testing.FakeClock`` fits it."""

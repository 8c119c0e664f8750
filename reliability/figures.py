"""One figure of a scenario (value, bound, pass or miss) and the table that `make reliability` prints."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One measured number and the bound it must meet; ``ok`` is False when it misses (or was not measured)."""

    scenario: str
    name: str
    value: float | None
    bound: str
    ok: bool
    unit: str = ""
    note: str = ""

    def shown_value(self) -> str:
        if self.value is None:
            return "n/a"
        if isinstance(self.value, float) and not self.value.is_integer():
            return f"{self.value:.3g}{self.unit}"
        return f"{int(self.value)}{self.unit}"


def at_most(scenario: str, name: str, value: float | None, limit: float, *, unit: str = "", note: str = "") -> Figure:
    ok = value is not None and not math.isnan(value) and value <= limit
    return Figure(scenario=scenario, name=name, value=value, bound=f"<= {limit:g}{unit}", ok=ok, unit=unit, note=note)


def at_least(scenario: str, name: str, value: float | None, limit: float, *, unit: str = "", note: str = "") -> Figure:
    ok = value is not None and not math.isnan(value) and value >= limit
    return Figure(scenario=scenario, name=name, value=value, bound=f">= {limit:g}{unit}", ok=ok, unit=unit, note=note)


def equals(scenario: str, name: str, value: float | None, expected: float, *, note: str = "") -> Figure:
    return Figure(scenario=scenario, name=name, value=value, bound=f"= {expected:g}", ok=value == expected, note=note)


def is_true(scenario: str, name: str, holds: bool, *, note: str = "") -> Figure:
    """A yes/no figure shown as 1/0 with the bound ``= 1``."""
    return Figure(scenario=scenario, name=name, value=1 if holds else 0, bound="= 1", ok=holds, note=note)


def failed(scenario: str, reason: str) -> Figure:
    """The scenario could not measure (it raised): a miss, with the reason in the note."""
    return Figure(scenario=scenario, name="ran to the end", value=None, bound="ran", ok=False, note=reason)


def table(figures: Iterable[Figure]) -> str:
    """A Markdown table: scenario, figure, value, bound, pass/MISS, note."""
    rows = [("scenario", "figure", "value", "bound", "result", "note")]
    rows += [(f.scenario, f.name, f.shown_value(), f.bound, "pass" if f.ok else "MISS", f.note) for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)

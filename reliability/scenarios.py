"""Every scenario of `make reliability`, by name, in the order the table shows them."""

from __future__ import annotations

from reliability import hostile
from reliability.run import ScenarioFunction

SCENARIOS: dict[str, ScenarioFunction] = {
    **hostile.SCENARIOS,
}

"""What every scenario gets (the workspace, quick or full) and how one scenario's run becomes figures."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from bench.scenarios import Workspace
from reliability.figures import Figure, failed


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """``quick``: the short version (inside ``make test``); otherwise the full one (``make reliability``)."""

    ws: Workspace
    quick: bool


ScenarioFunction = Callable[[Context], list[Figure]]


def run_scenario(name: str, function: ScenarioFunction, ctx: Context) -> list[Figure]:
    """The scenario's figures; a scenario that raises gives one failed figure naming the error (never raises)."""
    started = time.monotonic()
    print(f"reliability: {name} ...", file=sys.stderr, flush=True)
    try:
        figures = function(ctx)
    except Exception as exc:  # one broken scenario must not hide the others' figures
        traceback.print_exc(file=sys.stderr)
        figures = [failed(name, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc) else ''}")]
    print(f"reliability: {name} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return figures

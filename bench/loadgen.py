"""Drive a load generator as a subprocess and read back one :class:`Sample`: wrk, or the Python fallbacks.

``wrk`` (1 thread, Lua ``done`` hook printing JSON) is preferred for HTTP; ``bench.pyload`` stands in when
it is missing. SMTP always uses ``bench.smtpload``. Every run is bounded: the generator's own duration
plus ``GRACE_SECS`` before it is killed.
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.cpus import DEFAULT, Placement
from bench.processes import REPO

GRACE_SECS = 15.0
WRK_THREADS = 1
WRK_SCRIPT = """
done = function(summary, latency, requests)
  io.write(string.format(
    '\\n{"requests": %d, "seconds": %f, "non_2xx": %d, "errors": %d, "p50_ms": %f, "p99_ms": %f, '
    .. '"p999_ms": %f, "max_ms": %f}\\n',
    summary.requests, summary.duration / 1e6, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency:percentile(99.9) / 1e3, latency.max / 1e3))
end
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One timed run of one row: throughput, latency, failures, and the CPU the generator itself used."""

    requests: int
    seconds: float
    non_2xx: int
    errors: int
    p50_ms: float
    p99_ms: float
    loadgen: str
    p999_ms: float = math.nan
    max_ms: float = math.nan
    """p99.9 and the slowest request; ``nan`` when the generator does not report them (the broker rows)."""
    loadgen_cpu: float = math.nan
    server_cpu: float = math.nan
    other_cpu: float = math.nan
    """Cores busy with anything but this row's processes (other work on a shared machine)."""

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.non_2xx == 0 and self.errors == 0


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], *, name: str, timeout: float, placement: Placement = DEFAULT) -> Sample:
    before = _children_cpu()
    proc = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=placement.loadgen_preexec(),
    )
    used = _children_cpu() - before
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        data = json.loads(last)
    except json.JSONDecodeError:
        raise RuntimeError(f"{name} printed no result: {proc.stdout[-2000:]!r} {proc.stderr[-2000:]!r}") from None
    seconds = float(data["seconds"])
    return Sample(
        requests=int(data["requests"]),
        seconds=seconds,
        non_2xx=int(data["non_2xx"]),
        errors=int(data["errors"]),
        p50_ms=float(data["p50_ms"]),
        p99_ms=float(data["p99_ms"]),
        p999_ms=float(data.get("p999_ms", math.nan)),
        max_ms=float(data.get("max_ms", math.nan)),
        loadgen=name,
        loadgen_cpu=used / seconds if seconds > 0 else math.nan,
    )


def wrk_request_script(method: str, body: bytes, fresh_header: str | None) -> str:
    """The Lua lines that make wrk send ``method`` with ``body`` and, with ``fresh_header``, that header with a
    new value on every request (``<run prefix>-<n>``, the prefix new per run, so no two runs share a value)."""
    if method == "GET" and not body and fresh_header is None:
        return ""
    text = body.decode()
    if "]]" in text or "\n" in text:
        raise ValueError("the request body must be one line without ']]' (a Lua long string)")
    lines = [f'wrk.method = "{method}"', f"wrk.body = [[{text}]]"]
    if fresh_header is not None:
        lines += [
            "local counter, headers = 0, nil",
            "request = function()",
            "  if headers == nil then",
            "    headers = {}",
            "    for name, value in pairs(wrk.headers) do headers[name] = value end",
            "  end",
            "  counter = counter + 1",
            f'  headers["{fresh_header}"] = "{uuid.uuid4().hex}-" .. counter',
            "  return wrk.format(nil, nil, headers)",
            "end",
        ]
    return "\n".join(lines) + "\n"


def http_load(
    url: str,
    *,
    duration: float,
    connections: int,
    headers: dict[str, str],
    use_wrk: bool | None = None,
    placement: Placement = DEFAULT,
    method: str = "GET",
    body: bytes = b"",
    fresh_header: str | None = None,
) -> Sample:
    """Load ``url`` for ``duration`` seconds over ``connections`` keep-alive connections, from the CPUs ``placement``
    gives the load generator: ``method`` requests with ``body`` (GETs by default), ``fresh_header`` (e.g.
    ``Idempotency-Key``) with a new value on each."""
    header_args = [item for name, value in headers.items() for item in ("-H", f"{name}: {value}")]
    if use_wrk is None:
        use_wrk = wrk_available()
    if not use_wrk:
        argv = [sys.executable, "-m", "bench.pyload", url, "--duration", str(duration)]
        argv += ["--connections", str(connections), *header_args, "--method", method]
        argv += ["--body", body.decode()] if body else []
        argv += ["--fresh-header", fresh_header] if fresh_header else []
        return _run(argv, name="pyload", timeout=duration + GRACE_SECS, placement=placement)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-wrk-", delete=False) as script:
        script.write(wrk_request_script(method, body, fresh_header) + WRK_SCRIPT)
    try:
        seconds = max(1, math.ceil(duration))
        argv = ["wrk", f"-t{WRK_THREADS}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s"]
        argv += ["-s", script.name, *header_args, url]
        return _run(argv, name="wrk", timeout=seconds + GRACE_SECS, placement=placement)
    finally:
        Path(script.name).unlink(missing_ok=True)


def grpc_load(address: str, *, duration: float, concurrency: int, token: str | None) -> Sample:
    """Unary gRPC calls to ``address`` for ``duration`` seconds, ``concurrency`` in flight (bench.grpcload)."""
    argv = [sys.executable, "-m", "bench.grpcload", address, "--duration", str(duration)]
    argv += ["--concurrency", str(concurrency)] + (["--token", token] if token else [])
    name = "h2load" if shutil.which("h2load") else "grpcload"
    return _run(argv, name=name, timeout=duration + GRACE_SECS + 30)


def smtp_load(port: int, *, duration: float, connections: int, rcpt: str) -> Sample:
    """Send messages to ``127.0.0.1:port`` for ``duration`` seconds over ``connections`` SMTP sessions."""
    argv = [sys.executable, "-m", "bench.smtpload", str(port), "--duration", str(duration)]
    argv += ["--connections", str(connections), "--rcpt", rcpt]
    return _run(argv, name="smtpload", timeout=duration + GRACE_SECS)

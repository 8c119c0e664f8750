"""gRPC load generator: unary ListDocuments calls for a fixed time over N concurrent calls (grpc.aio).

Run by the harness in its own process; prints one JSON line like the other load generators.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.address, duration=args.duration, concurrency=args.concurrency, token=args.token))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

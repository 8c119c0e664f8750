"""gRPC unary calls/s: ``bastion run`` (token auth + Cedar policy) vs. a bare grpclib server, one run.

Run: .venv/bin/python bench/grpc_calls.py [--seconds 5] [--concurrency 32]
Both servers run the example's DocumentService on 1 process; the client is grpc.aio in another process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BARE_SERVER = """
import asyncio, sys
from grpclib.server import Server
from examples.documents_api.grpc_service import DocumentService
from examples.documents_api.store import seeded_store
async def main():
    server = Server([DocumentService(seeded_store())])
    await server.start("127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.wait_closed()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


async def load(address: str, token: str | None, seconds: float, concurrency: int) -> tuple[float, float]:
    import grpc

    from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
    from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.DocumentServiceStub(channel)
        request = pb.ListDocumentsRequest(limit=2)
        await stub.ListDocuments(request, metadata=metadata, timeout=10)
        stop = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < stop:
                start = time.perf_counter()
                await stub.ListDocuments(request, metadata=metadata, timeout=10)
                latencies.append(time.perf_counter() - start)

        begin = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - begin
    latencies.sort()
    return len(latencies) / elapsed, latencies[len(latencies) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from bastion.testing import TokenMinter

    minter = TokenMinter("RS256")
    token = minter.mint(sub="alice", roles=["user"], ttl=3600)
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "public.pem"
        key.write_bytes(minter.public_pem())
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key),
            "SERVICE_LOG_LEVEL": "warning",
            "SERVICE_RATE_LIMIT_ENABLED": "false",
        }
        bastion_port, bare_port = free_port(), free_port()
        bastion = subprocess.Popen(
            [str(Path(sys.executable).with_name("bastion")), "run", "examples.documents_api:service",
             "--config", "examples/documents_api/config.toml", "--host", "127.0.0.1", "--port", str(bastion_port)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        bare = subprocess.Popen(
            [sys.executable, "-c", BARE_SERVER, str(bare_port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL
        )
        try:
            wait_port(bastion_port)
            wait_port(bare_port)
            results = {}
            for _ in range(2):  # interleave: bare, bastion, bare, bastion
                for name, port, tok in (
                    ("bare grpclib", bare_port, None),
                    ("bastion auth+policy", bastion_port, token),
                ):
                    rate, p50 = asyncio.run(load(f"127.0.0.1:{port}", tok, args.seconds, args.concurrency))
                    results.setdefault(name, []).append((rate, p50))
            for name, runs in results.items():
                rates = [rate for rate, _ in runs]
                print(f"{name:22s} {max(rates):8.0f} calls/s (runs: {', '.join(f'{r:.0f}' for r in rates)}); "
                      f"p50 {min(p for _, p in runs):.2f} ms")  # fmt: skip
            bare_best = max(rate for rate, _ in results["bare grpclib"])
            ours = max(rate for rate, _ in results["bastion auth+policy"])
            print(f"ratio bastion/bare: {ours / bare_best:.2f}")
        finally:
            for process in (bastion, bare):
                process.send_signal(signal.SIGTERM)
            for process in (bastion, bare):
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    main()

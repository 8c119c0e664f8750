"""The ceiling for the gRPC rows: the example's DocumentService on a bare grpclib server (no auth, no policy)."""

from __future__ import annotations

import asyncio
import sys

from grpclib.server import Server

from examples.documents_api.grpc_service import DocumentService
from examples.documents_api.store import seeded_store


async def main(port: int) -> None:
    server = Server([DocumentService(seeded_store())])
    await server.start("127.0.0.1", port)
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))

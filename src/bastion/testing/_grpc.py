"""gRPC for the test clients: a grpclib channel to the started app's own gRPC server, with no TCP port.

The channel speaks HTTP/2 over a Unix socket in a private temporary folder, served by the same protocol the main
port hands gRPC connections to (``GrpcServer.protocol_factory``): every call passes the guard as under ``bastion
run`` (token auth, rate limit, policy with its resource extractors, message limits, exception handlers) and
fails with the same status and trailers. grpclib is the ``[grpc]`` extra's: imported only when a test asks for
a stub.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bastion import _extras as extras

if TYPE_CHECKING:
    from grpclib.client import Channel

    from bastion._app import BastionApp

StubT = TypeVar("StubT")
NO_GRPC = (
    "the service serves no gRPC: register a grpclib service with service.add_grpc_service(...) and turn gRPC on "
    "(grpc.enabled = true, or SERVICE_GRPC_ENABLED=true)"
)
SOCKET_NAME = "grpc.sock"


class GrpcLink:
    """One in-process connection to ``app``'s gRPC server: :meth:`open` once the app started (nothing when it
    serves no gRPC), :meth:`close` before it stops (so its shutdown has no call left to drain)."""

    def __init__(self, app: BastionApp) -> None:
        self.app = app
        self._folder: Path | None = None
        self._listener: asyncio.Server | None = None
        self._channel: Channel | None = None

    async def open(self) -> None:
        server = self.app.grpc
        if server is None or not self.app.parts.grpc_services:
            return
        extras.GRPC.require()
        from grpclib.client import Channel

        self._folder = Path(tempfile.mkdtemp(prefix="bastion-grpc-"))
        path = str(self._folder / SOCKET_NAME)
        self._listener = await asyncio.get_running_loop().create_unix_server(server.protocol_factory, path)
        self._channel = Channel(path=path)

    def stub(self, stub_class: Callable[[Channel], StubT]) -> StubT:
        """``stub_class`` (a grpclib stub generated from a ``.proto`` file) on the channel to the app."""
        if self._channel is None:
            raise RuntimeError(NO_GRPC)
        return stub_class(self._channel)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        listener, self._listener = self._listener, None
        folder, self._folder = self._folder, None
        if channel is not None:
            channel.close()
        if listener is not None:
            listener.close()
            await listener.wait_closed()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class SyncStub:
    """A grpclib stub whose methods are called from sync code: ``stub.GetDocument(request, metadata=...)`` runs
    the stub's method in the client's event loop (``call``: its blocking portal's ``call``) and returns its reply
    (a list of replies for a server-streaming method), or raises its ``GRPCError``."""

    def __init__(self, stub: Any, call: Callable[..., Any]) -> None:
        self._stub = stub
        self._call = call

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        call = self._call

        def invoke(message: Any, **options: Any) -> Any:
            return call(functools.partial(method, message, **options))

        invoke.__name__ = name
        return invoke

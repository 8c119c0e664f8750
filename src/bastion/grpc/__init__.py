"""gRPC: grpclib services on the main port (protocol detection) or a separate one, guarded like HTTP.

Internal: ``service.add_grpc_service(...)`` and ``[grpc]`` are the way in (see docs/grpc.md).
"""

__all__: list[str] = []

"""gRPC: grpclib services on the main port (protocol detection) or a separate one, guarded like HTTP."""

from bastion.grpc.interceptors import GrpcGuard, GrpcResourceExtractor, grpc_error
from bastion.grpc.server import GrpcServer

__all__ = ["GrpcGuard", "GrpcResourceExtractor", "GrpcServer", "grpc_error"]

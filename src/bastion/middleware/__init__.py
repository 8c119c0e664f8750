"""The HTTP middleware, one pure-ASGI module each; ``bastion.app`` stacks them in the spec's order."""

from bastion.middleware.access_log import AccessLogMiddleware
from bastion.middleware.compression import CompressionMiddleware
from bastion.middleware.cors import CorsMiddleware
from bastion.middleware.errors import ErrorRenderingMiddleware, PanicRecoveryMiddleware
from bastion.middleware.limits import BodyLimitMiddleware, TimeoutMiddleware
from bastion.middleware.request_id import RequestIdMiddleware
from bastion.middleware.security_headers import SecurityHeadersMiddleware

__all__ = [
    "AccessLogMiddleware",
    "BodyLimitMiddleware",
    "CompressionMiddleware",
    "CorsMiddleware",
    "ErrorRenderingMiddleware",
    "PanicRecoveryMiddleware",
    "RequestIdMiddleware",
    "SecurityHeadersMiddleware",
    "TimeoutMiddleware",
]

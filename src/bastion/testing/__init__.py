"""Testing a Bastion service: test clients that build and start it, token minters, a clock to move by hand.

``ServiceClient`` / ``AsyncServiceClient`` build a service with test settings, run its lifespan and mint tokens it
accepts (``client.as_user("alice", roles=["reader"])``); ``bastion.testing.pytest_plugin`` has the fixtures.
See docs/testing.md. Development and testing only: a service never issues tokens; its identity provider does.
"""

from bastion.testing._client import AsyncServiceClient, ServiceClient
from bastion.testing._tokens import PasetoMinter, TokenMinter, write_dev_keys
from bastion.testing._websocket import AsyncWebSocketSession, WebSocketDenialResponse, WebSocketSession
from bastion_core.testing import FakeClock

__all__ = [
    "AsyncServiceClient",
    "AsyncWebSocketSession",
    "FakeClock",
    "PasetoMinter",
    "ServiceClient",
    "TokenMinter",
    "WebSocketDenialResponse",
    "WebSocketSession",
    "write_dev_keys",
]

"""Testing a Bastion service: test clients that build and start it, token minters, a clock to move by hand.

``ServiceClient`` / ``AsyncServiceClient`` build a service with test settings, run its lifespan and mint tokens it
accepts (``client.as_user("alice", roles=["reader"])``), and run the service's broker work in memory
(``client.broker``: :class:`MemoryBroker`); ``bastion.testing.pytest_plugin`` has the fixtures;
``check_policy_cases`` runs a policy-test case file (``bastion policy test``) as one assertion.
See docs/testing.md. Development and testing only: a service never issues tokens; its identity provider does.
"""

from bastion.broker._memory import MemoryBroker
from bastion.testing._broker import SyncMemoryBroker
from bastion.testing._client import AsyncServiceClient, ServiceClient
from bastion.testing._policy_cases import check_policy_cases
from bastion.testing._tokens import PasetoMinter, TokenMinter, write_dev_keys
from bastion.testing._websocket import AsyncWebSocketSession, WebSocketDenialResponse, WebSocketSession
from bastion_core.testing import FakeClock

__all__ = [
    "AsyncServiceClient",
    "AsyncWebSocketSession",
    "FakeClock",
    "MemoryBroker",
    "PasetoMinter",
    "ServiceClient",
    "SyncMemoryBroker",
    "TokenMinter",
    "WebSocketDenialResponse",
    "WebSocketSession",
    "check_policy_cases",
    "write_dev_keys",
]

"""Cedar policy authorization: engine, action normalization, decision cache, middleware, reload."""

from bastion.policy.authorizer import PolicyAuthorizer, ResourceExtractor, principal_of
from bastion.policy.cache import DecisionCache
from bastion.policy.engine import Decision, PolicyEngine, PolicyLoadError, load_policies, parse_policies
from bastion.policy.middleware import PolicyMiddleware
from bastion.policy.normalize import Normalizer, default_normalizer

__all__ = [
    "Decision",
    "DecisionCache",
    "Normalizer",
    "PolicyAuthorizer",
    "PolicyEngine",
    "PolicyLoadError",
    "PolicyMiddleware",
    "ResourceExtractor",
    "default_normalizer",
    "load_policies",
    "parse_policies",
    "principal_of",
]

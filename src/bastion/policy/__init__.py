"""Cedar policy authorization: engine, action normalization, decision cache, middleware, reload.

Configured by ``[policy]`` and assembled by the pipeline. Public: what an operator writes against (a
normalizer, a resource extractor) and the offline loader.
"""

from bastion.policy._capability import ANONYMOUS_TYPE, PRINCIPAL_TYPE, RESOURCE_TYPE, ResourceExtractor
from bastion.policy._engine import Decision, PolicyLoadError, load_policies
from bastion.policy._normalize import Normalizer, default_normalizer

__all__ = [
    "ANONYMOUS_TYPE",
    "PRINCIPAL_TYPE",
    "RESOURCE_TYPE",
    "Decision",
    "Normalizer",
    "PolicyLoadError",
    "ResourceExtractor",
    "default_normalizer",
    "load_policies",
]

"""Bearer-token authentication: JWT and PASETO validation, path rules, revocation, claims in the scope.

Configured by ``[token]`` and assembled by the pipeline; a handler reads the caller with
``Depends(current_claims)``.
"""

from bastion._claims import Claims, current_claims, optional_claims

__all__ = ["Claims", "current_claims", "optional_claims"]

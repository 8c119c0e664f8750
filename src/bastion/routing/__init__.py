"""Versioned routing: the versioned builder and deprecation (route resolution and dispatch are internal)."""

from bastion.routing._deprecation import Deprecation
from bastion.routing._sunset import Brownout
from bastion.routing._versioned import ApiVersion, VersionedApi

__all__ = ["ApiVersion", "Brownout", "Deprecation", "VersionedApi"]

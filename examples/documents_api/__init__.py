"""The reference example: ``bastion run examples.documents_api:service --config examples/documents_api/config.toml``."""

from bastion import Service
from examples.documents_api.api import register
from examples.documents_api.store import seeded_store

store = seeded_store()
service = Service("documents-api", version="1.0.0")
register(service, store)
service.mount_revoke_token_route("/admin/revoke-token", admin_role="admin")
service.mount_policy_reload_route("/admin/reload-policy", admin_role="admin")

__all__ = ["service", "store"]

"""The reference example: ``bastion run examples.documents_api:service --config examples/documents_api/config.toml``."""

from bastion import Service
from examples.documents_api.api import register
from examples.documents_api.grpc_service import GET_DOCUMENT, DocumentService, owner_of_request
from examples.documents_api.store import seeded_store

store = seeded_store()
service = Service("documents-api", version="1.0.0")
register(service, store)
service.mount_revoke_token_route("/admin/revoke-token", admin_role="admin")
service.mount_policy_reload_route("/admin/reload-policy", admin_role="admin")
service.add_grpc_service(DocumentService(store))
service.grpc_resource_extractor(GET_DOCUMENT)(owner_of_request)

__all__ = ["service", "store"]

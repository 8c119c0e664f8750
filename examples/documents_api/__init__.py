"""The reference example: ``bastion run examples.documents_api:service --config examples/documents_api/config.toml``."""

from bastion import Service
from examples.documents_api.api import register
from examples.documents_api.grpc_service import GET_DOCUMENT, DocumentService, owner_of_request
from examples.documents_api.store import DocumentStore, seeded_store


def create_service(store: DocumentStore) -> Service:
    """The example over ``store``: HTTP v1 and v2, the operator routes and gRPC (``service`` below; tests build
    their own)."""
    service = Service("documents-api", version="1.0.0")
    register(service, store)
    service.mount_revoke_token_route("/admin/revoke-token", admin_role="admin")
    service.mount_policy_reload_route("/admin/reload-policy", admin_role="admin")
    service.add_grpc_service(DocumentService(store))
    # The policies compare the caller's sub with the owner the request names (policies.cedar).
    service.grpc_resource_extractor(GET_DOCUMENT, attributes={"owner_id": str, "user_id": str, "doc_id": str})(
        owner_of_request
    )
    return service


store = seeded_store()
service = create_service(store)

__all__ = ["create_service", "service", "store"]

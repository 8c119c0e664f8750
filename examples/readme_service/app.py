"""The README's service: ``documents-api`` with a deprecated v1 and a paged v2 ``GET /documents``.

Run it (``service.toml`` names ``keys/jwt-public.pem``; ``bastion dev-keys`` writes a development pair there):

    bastion dev-keys --dir examples/readme_service/keys
    bastion run examples.readme_service.app:service --config examples/readme_service/service.toml

Its tests are tests/examples/test_readme_service.py, the file docs/testing.md shows.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from bastion import Claims, Deprecation, Service, current_claims

DOCUMENTS = [
    {"id": "doc-1", "owner_id": "alice", "title": "Quarterly report"},
    {"id": "doc-2", "owner_id": "bob", "title": "Roadmap"},
    {"id": "doc-3", "owner_id": "alice", "title": "Meeting notes"},
]

service = Service("documents-api", version="1.0.0")
v1 = service.version(
    1, deprecated=Deprecation(replacement=2, sunset="2027-06-30T00:00:00Z", message="v2 pages the document list.")
)
v2 = service.version(2)


@v1.get("/documents")
async def list_documents_v1() -> list[dict[str, str]]:
    """Every document, unpaged (v1's contract)."""
    return DOCUMENTS


@v2.get("/documents")
async def list_documents(
    claims: Annotated[Claims, Depends(current_claims)], limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> dict[str, object]:
    """The first ``limit`` documents, the total, and who asked (the token's ``sub``)."""
    return {"items": DOCUMENTS[:limit], "total": len(DOCUMENTS), "caller": claims.sub}

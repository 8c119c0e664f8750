"""The example's ``GET /api/v2/documents`` on bare FastAPI: same store, query parameters and response model.

No middleware and no security: the baseline that separates what the handler costs from what Bastion's
pipeline adds (compare ``bastion-open`` with this row, and ``fastapi`` with this row).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query

from examples.documents_api.api import PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX, DocumentPage
from examples.documents_api.store import seeded_store

store = seeded_store()
app = FastAPI()


@app.get("/api/v2/documents", response_model=DocumentPage)
async def list_documents(
    limit: Annotated[int, Query(ge=1, le=PAGE_SIZE_MAX)] = PAGE_SIZE_DEFAULT,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
) -> dict[str, object]:
    items, next_cursor = store.page(after=cursor, limit=limit)
    return {"items": [doc.as_dict() for doc in items], "next_cursor": next_cursor}

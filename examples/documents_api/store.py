"""The example's in-memory data: documents per owner and the admin-visible user list."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(slots=True)
class Document:
    id: str
    owner_id: str
    title: str
    content: str

    def as_dict(self) -> dict[str, str]:
        # Spelled out: dataclasses.asdict deep-copies and costs more than the rest of the handler.
        return {"id": self.id, "owner_id": self.owner_id, "title": self.title, "content": self.content}


@dataclass(frozen=True, slots=True)
class User:
    id: str
    username: str
    roles: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "username": self.username, "roles": list(self.roles)}


class DocumentStore:
    """Documents in insertion order, addressed by ``(owner_id, doc_id)``; not shared between processes."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        while True:
            candidate = f"doc-{next(self._ids)}"
            if candidate not in self._docs:
                return candidate

    def all(self) -> list[Document]:
        return list(self._docs.values())

    def page(self, *, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        """Up to ``limit`` documents after the one with id ``after``, and the cursor for the next page."""
        docs = self.all()
        start = 0
        if after is not None:
            ids = [doc.id for doc in docs]
            start = ids.index(after) + 1 if after in ids else len(docs)
        items = docs[start : start + limit]
        next_cursor = items[-1].id if items and start + limit < len(docs) else None
        return items, next_cursor

    def get(self, owner_id: str, doc_id: str) -> Document | None:
        doc = self._docs.get(doc_id)
        return doc if doc is not None and doc.owner_id == owner_id else None

    def put(self, doc: Document) -> Document:
        self._docs[doc.id] = doc
        return doc

    def delete(self, owner_id: str, doc_id: str) -> Document | None:
        doc = self.get(owner_id, doc_id)
        if doc is not None:
            del self._docs[doc_id]
        return doc


USERS = (
    User(id="alice", username="Alice", roles=("user",)),
    User(id="bob", username="Bob", roles=("user",)),
    User(id="admin", username="Administrator", roles=("admin",)),
)


def seeded_store() -> DocumentStore:
    """A store with a few documents for alice and bob."""
    store = DocumentStore()
    for owner, title, content in (
        ("alice", "Quarterly plan", "Ship v2 of the documents API."),
        ("alice", "Reading list", "RFC 8594, RFC 6750, the Cedar guide."),
        ("bob", "Notes", "Bob's private notes."),
    ):
        store.put(Document(id=store.new_id(), owner_id=owner, title=title, content=content))
    return store

"""The example's in-memory data: documents per owner and the admin-visible user list.

The store is bounded (the example is what people copy, and any authenticated caller may create documents): at most
MAX_DOCUMENTS documents and MAX_STORED_CHARS characters of titles and contents together. Past either, creating a
document (or growing one) raises StoreFull, which the API answers with 409 ``DOCUMENT_STORE_FULL``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

MAX_DOCUMENTS = 100_000
MAX_STORED_CHARS = 64 * 1024 * 1024


class StoreFull(Exception):
    """Storing the document would pass the store's bounds."""


class IdTaken(Exception):
    """A new document names the id of one that exists."""


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
    """Documents in insertion order, addressed by ``(owner_id, doc_id)``; not shared between processes. Holds at most
    ``max_documents`` documents and ``max_chars`` characters of titles and contents."""

    def __init__(self, *, max_documents: int = MAX_DOCUMENTS, max_chars: int = MAX_STORED_CHARS) -> None:
        self._docs: dict[str, Document] = {}
        self._ids = itertools.count(1)
        self.max_documents, self.max_chars = max_documents, max_chars
        self._chars = 0

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

    def add(self, doc: Document) -> Document:
        """A new document: IdTaken when its id is in use (a create never replaces), StoreFull past the bounds."""
        if doc.id in self._docs:
            raise IdTaken(doc.id)
        if len(self._docs) >= self.max_documents:
            raise StoreFull(f"at most {self.max_documents} documents")
        return self.put(doc)

    def put(self, doc: Document) -> Document:
        """Store ``doc``, replacing the document with its id; StoreFull when it would pass the character bound."""
        old = self._docs.get(doc.id)
        chars = self._chars + _chars(doc) - (_chars(old) if old is not None else 0)
        if chars > self.max_chars and chars > self._chars:  # a smaller replacement is always taken
            raise StoreFull(f"at most {self.max_chars} characters of titles and contents")
        self._docs[doc.id] = doc
        self._chars = chars
        return doc

    def delete(self, owner_id: str, doc_id: str) -> Document | None:
        doc = self.get(owner_id, doc_id)
        if doc is not None:
            del self._docs[doc_id]
            self._chars -= _chars(doc)
        return doc


def _chars(doc: Document) -> int:
    return len(doc.title) + len(doc.content)


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

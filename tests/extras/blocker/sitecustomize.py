"""Removes packages from this interpreter, for the tests of a missing extra: each module named in
``BLOCKED_IMPORTS`` (comma-separated; a package with its submodules) fails to import as if it were not installed.

Put this directory on ``PYTHONPATH`` of a subprocess; it is not a patch of any library, the library is simply
absent for that process (a ``sys.meta_path`` finder in front of the others)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = frozenset(name for name in os.environ.get("BLOCKED_IMPORTS", "").split(",") if name)


class _Blocker:
    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if any(name == blocked or name.startswith(f"{blocked}.") for blocked in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocker())

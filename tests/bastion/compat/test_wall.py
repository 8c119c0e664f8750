"""The wall: no private name of uvicorn, FastAPI, Starlette, grpclib, h2, hpack, hyperframe or aiosmtpd is used
in src outside the compat modules (``bastion/_compat/<library>.py``, ``mailrelay/smtp/_compat.py``), and no module
patches one of those libraries.

Read from the source (ast): an import of a private module or name of those libraries; a private attribute of an
imported library module (``grpclib.utils._current_task``); an attribute, or a ``getattr``/``setattr``/``hasattr``
string, named like one of the private names the compat modules declare (``PRIVATE_NAMES``); an assignment to a
library module's attribute or to an object's ``__class__``. And from the classes: a class of ours that
subclasses one of theirs defines no private name their class already has (an override of a private hook).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

from bastion._compat import fastapi, grpclib, hpack, starlette, uvicorn
from mailrelay.smtp import _compat as smtp_compat

LIBRARIES = frozenset({"uvicorn", "fastapi", "starlette", "grpclib", "h2", "hpack", "hyperframe", "aiosmtpd"})
SRC = Path(__file__).resolve().parents[3] / "src"
COMPAT_MODULES: tuple[ModuleType, ...] = (fastapi, grpclib, hpack, starlette, uvicorn, smtp_compat)
COMPAT_FILES = frozenset(Path(inspect.getfile(module)).resolve() for module in COMPAT_MODULES) | {
    (SRC / "bastion" / "_compat" / "__init__.py").resolve()
}
KNOWN_PRIVATE = frozenset().union(*(module.PRIVATE_NAMES for module in COMPAT_MODULES))
ABC_MACHINERY = frozenset({"_abc_impl"})  # set by ABCMeta on every abstract class's subclass
PATCHING_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library(dotted: str | None) -> bool:
    return dotted is not None and dotted.split(".")[0] in LIBRARIES


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``grpclib`` for ``grpclib.utils``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def violations(source: str, filename: str = "<src>") -> list[str]:
    """Every use of a library's private name (or patch of a library) in ``source``, as ``"line: what"``."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    library_modules: set[str] = set()  # local names bound to a library module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    library_modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and _library(node.module):
            assert node.module is not None
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                elif alias.name.islower():  # perhaps a submodule (from hpack import hpack)
                    library_modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in KNOWN_PRIVATE:
                found.append(f"{node.lineno}: .{node.attr}")
            elif _private(node.attr) and _root(node.value) in library_modules:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PATCHING_CALLS:
            args = node.args
            if len(args) >= 2 and isinstance(args[1], ast.Constant) and args[1].value in KNOWN_PRIVATE:
                found.append(f"{node.lineno}: {node.func.id}(..., {args[1].value!r})")
            if node.func.id in ("setattr", "delattr") and args and _root(args[0]) in library_modules:
                found.append(f"{node.lineno}: {node.func.id}({ast.unparse(args[0])}, ...)")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                if target.attr == "__class__":
                    found.append(f"{node.lineno}: .__class__ = ...")
                elif isinstance(target.value, ast.Name) and target.value.id in library_modules:
                    found.append(f"{node.lineno}: {target.value.id}.{target.attr} = ...")
    return found


def source_files() -> list[Path]:
    return sorted(
        path
        for package in ("bastion", "bastion_core", "mailrelay")
        for path in (SRC / package).rglob("*.py")
        if path.resolve() not in COMPAT_FILES
    )


def test_the_compat_modules_declare_their_private_names() -> None:
    for module in COMPAT_MODULES:
        assert module.PRIVATE_NAMES, module.__name__
        assert all(_private(name) for name in module.PRIVATE_NAMES), module.__name__
        assert module.VERIFIED, module.__name__


@pytest.mark.parametrize("path", source_files(), ids=lambda path: str(path.relative_to(SRC)))
def test_no_private_name_of_a_library_outside_the_compat_modules(path: Path) -> None:
    assert violations(path.read_text(), str(path)) == []


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("from fastapi._compat import ModelField", id="private-module"),
        pytest.param("from fastapi.routing import _extract_endpoint_context", id="private-name"),
        pytest.param("import grpclib._typing", id="import-private-module"),
        pytest.param("import grpclib.utils as u\nu._current_task = f", id="module-patch"),
        pytest.param("from hpack import hpack as m\nsetattr(m, 'decode_huffman', f)", id="setattr-patch"),
        pytest.param("from hpack import hpack as m\nm.decode_huffman = f", id="assign-patch"),
        pytest.param("import grpclib.utils\nx = grpclib.utils._current_task", id="module-private-attribute"),
        pytest.param("x = stream._cardinality", id="declared-attribute"),
        pytest.param("self._unset_keepalive_if_required()", id="declared-method"),
        pytest.param("x = getattr(context, '_route_context', None)", id="getattr-string"),
        pytest.param("protocol.__class__ = Ours", id="class-swap"),
    ],
)
def test_the_scan_finds_each_kind_of_use(source: str) -> None:
    assert violations(source) != []


def test_public_use_passes_the_scan() -> None:
    assert violations("from fastapi import APIRouter\nimport h2.connection\nx = h2.connection.H2Connection()") == []


# The listener's WebSocket protocol for the other uvicorn: it subclasses a module this uvicorn lacks (sansio, before
# 0.35) or one that is deprecated here (websockets' legacy implementation); `make compat` checks it where it is used.
OTHER_UVICORN = (
    "bastion._listener._websocket_legacy" if uvicorn.SANSIO_WEBSOCKETS else "bastion._listener._websocket_sansio"
)


def our_modules() -> list[ModuleType]:
    modules = []
    for package_name in ("bastion", "mailrelay"):
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if info.name.startswith(("bastion._compat.", "mailrelay.smtp._compat")) or info.name.endswith("__main__"):
                continue
            if info.name == OTHER_UVICORN:
                continue
            modules.append(importlib.import_module(info.name))
    return modules


def private_overrides(cls: type) -> list[str]:
    """The private names ``cls`` defines that a library class among its bases already has."""
    theirs = [base for base in cls.__mro__[1:] if _library(base.__module__)]
    return [
        attribute
        for attribute in vars(cls)
        if _private(attribute) and attribute not in ABC_MACHINERY and any(hasattr(base, attribute) for base in theirs)
    ]


def test_no_class_of_ours_overrides_a_private_name_of_a_library_class() -> None:
    found = [
        f"{module.__name__}.{name}.{attribute}"
        for module in our_modules()
        for name, cls in vars(module).items()
        if inspect.isclass(cls) and cls.__module__ == module.__name__
        for attribute in private_overrides(cls)
    ]
    assert found == []


def test_an_override_of_a_private_hook_is_found() -> None:
    from aiosmtpd.smtp import SMTP

    class Loop(SMTP):
        async def _handle_client(self) -> None: ...

        def _ours(self) -> None: ...

    assert private_overrides(Loop) == ["_handle_client"]

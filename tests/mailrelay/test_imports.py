"""MailRelay stays light and its modules import in any order."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import mailrelay

PACKAGE_DIR = Path(mailrelay.__file__).parent
HEAVY = ("fastapi", "uvicorn", "cedarpy", "starlette")

# Every mailrelay module (the running relay imports them through mailrelay.cli; the rest are the public API; only
# __main__, which runs the program), then whatever of Bastion's stack came along with them.
PROBE = f"""
import importlib, pkgutil, sys
import mailrelay, mailrelay.cli
for module in pkgutil.walk_packages(mailrelay.__path__, "mailrelay."):
    if module.name != "mailrelay.__main__":
        importlib.import_module(module.name)
heavy = {{
    name for name in sys.modules
    if name.split(".")[0] in {HEAVY!r} or name == "bastion" or name.startswith("bastion.")
}}
print(sorted(heavy))
"""


def test_importing_mailrelay_loads_no_bastion_web_stack() -> None:
    """Only bastion_core is shared: neither Bastion itself nor FastAPI, uvicorn, Starlette or cedarpy."""
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Modules whose top-level code runs before `name` can finish: each imported module and the packages it sits
    in, except packages `name` itself sits in (those were already importing when `name` started)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                targets.add(submodule if submodule in modules else node.module)
    runs: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for length in range(1, len(parts) + 1):
            prefix = ".".join(parts[:length])
            enclosing = name == prefix or name.startswith(prefix + ".")
            if prefix in modules and prefix != name and (length == len(parts) or not enclosing):
                runs.add(prefix)
    return runs


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return cycles


def test_no_import_cycles() -> None:
    """A cycle works or breaks depending on which module is imported first (mailrelay.policy <-> mailrelay.smtp
    did): none is allowed."""
    paths = {_module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}
    graph = {name: _imports(path, name, set(paths)) for name, path in paths.items()}
    assert graph["mailrelay._assembly"] >= {"mailrelay._config", "mailrelay.smtp", "mailrelay.smtp._server"}
    assert _cycles(graph) == []


def test_the_relay_and_the_shared_core_load_no_opentelemetry_and_the_core_no_httpx() -> None:
    """The relay uses bastion_core's Guard alone: OpenTelemetry and httpx came with the httpx transport of Bastion
    (ResilientTransport), which is now loaded only when named. (httpx itself still comes with the relay's settings,
    which parse the webhook URL with it.)"""
    code = (
        "import sys, bastion_core; core = sorted(m for m in ('httpx', 'opentelemetry') if m in sys.modules); "
        "import mailrelay.cli; relay = sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'); "
        "from bastion_core import ResilientTransport; print(core, relay, ResilientTransport.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[] [] ResilientTransport"

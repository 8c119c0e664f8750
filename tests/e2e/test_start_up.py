"""``bastion run``'s start-up failures: one ``error:`` line and exit 2 in every mode (plain, ``--workers 2``,
``--reload``), the port checked before any start-up hook runs; and the address served, said the same way."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BASTION, TOKEN_OFF, BastionProcess

APP = """
from pathlib import Path
from bastion import Service

service = Service("start-up-demo")
v1 = service.version(1)

@service.on_startup
def mark() -> None:
    Path(__file__).with_name("hook-ran").write_text("yes")
"""

FAILING_APP = """
from bastion import Service

service = Service("failing-demo")
v1 = service.version(1)

@service.on_startup
async def connect_database() -> None:
    raise RuntimeError("database down")
"""

MODES = [
    pytest.param([], id="plain"),
    pytest.param(["--workers", "2"], id="workers"),
    pytest.param(["--reload"], id="reload"),
]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "start_up_demo.py").write_text(APP)
    (tmp_path / "failing_demo.py").write_text(FAILING_APP)
    return tmp_path


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def run(app_dir: Path, app: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``bastion run`` in ``app_dir`` (the hook writes its marker there), to its end."""
    return subprocess.run(
        [BASTION, "run", app, "--app-dir", str(app_dir), "--host", "127.0.0.1", *args],
        cwd=app_dir,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **TOKEN_OFF, "SERVICE_LOG_FORMAT": "json"},
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("mode", MODES)
def test_a_port_in_use_is_one_line_before_any_start_up_hook(app_dir: Path, taken_port: int, mode: list[str]) -> None:
    result = run(app_dir, "start_up_demo:service", "--port", str(taken_port), *mode)
    assert (result.returncode, result.stderr) == (
        2,
        f"error: cannot listen on 127.0.0.1:{taken_port} (Address already in use)\n",
    )
    assert not (app_dir / "hook-ran").exists()


@pytest.mark.parametrize("mode", MODES[:2])
def test_a_failing_start_up_hook_is_one_line_and_exit_2(app_dir: Path, mode: list[str]) -> None:
    result = run(app_dir, "failing_demo:service", "--port", "0", *mode)
    assert result.returncode == 2
    assert error_lines(result.stderr) == ["error: start-up hook connect_database failed: RuntimeError: database down"]
    assert result.stderr.endswith("error: start-up hook connect_database failed: RuntimeError: database down\n")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("mode", [MODES[0], MODES[2]])
def test_the_address_served_is_said_the_same_way_with_and_without_reload(
    bastion_process: Callable[..., BastionProcess], app_dir: Path, mode: list[str]
) -> None:
    process = bastion_process("start_up_demo:service", "--app-dir", str(app_dir), *mode, env=TOKEN_OFF)
    process.wait_for_output(f'"url":"http://127.0.0.1:{process.port}","event":"service_listening"')

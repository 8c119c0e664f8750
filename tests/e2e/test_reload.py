"""``bastion run --reload``: a change restarts the worker; a broken change keeps the previous one serving."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import BastionProcess

RELOAD_TIMEOUT_SECS = 30.0

APP = """
import os
from bastion import Service

service = Service("reload-demo", version="1.0.0")
v1 = service.version(1)

@v1.get("/answer")
async def answer() -> dict[str, object]:
    return {{"answer": {answer!r}, "pid": os.getpid()}}
"""

CONFIG = """
[token]
enabled = false

[policy]
policy_path = "policies.cedar"
"""

POLICY = """
@id("anyone")
permit(principal, action, resource);
"""


def write_app(folder: Path, answer: str) -> None:
    # A new mtime and size each time, written whole (as an editor's save does).
    target = folder / "reload_demo.py"
    partial = folder / "reload_demo.py.tmp"
    partial.write_text(APP.format(answer=answer))
    partial.replace(target)


def answer(process: BastionProcess) -> dict[str, object]:
    response = httpx.get(process.url + "/api/v1/answer", timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def wait_for_answer(process: BastionProcess, expected: str) -> dict[str, object]:
    """Poll until the served answer is ``expected`` (bounded; a reload takes a second or two)."""
    deadline = time.monotonic() + RELOAD_TIMEOUT_SECS
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = answer(process)
        except httpx.TransportError as exc:
            last = exc
        if isinstance(last, dict) and last["answer"] == expected:
            return last
        time.sleep(0.1)
    raise AssertionError(f"never served {expected!r} (last: {last!r}):\n{process.output()}")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    write_app(folder, "one")
    (folder / "service.toml").write_text(CONFIG)
    (folder / "policies.cedar").write_text(POLICY)
    return folder


def start(bastion_process: Callable[..., BastionProcess], app_dir: Path) -> BastionProcess:
    return bastion_process(
        "reload_demo:service", "--app-dir", str(app_dir), "--config", str(app_dir / "service.toml"), "--reload"
    )


def test_a_code_change_is_served_and_a_broken_one_keeps_the_previous_worker(
    bastion_process: Callable[..., BastionProcess], app_dir: Path
) -> None:
    process = start(bastion_process, app_dir)
    first = wait_for_answer(process, "one")

    write_app(app_dir, "two")
    second = wait_for_answer(process, "two")
    assert second["pid"] != first["pid"]  # a new worker

    (app_dir / "reload_demo.py").write_text("def broken(:\n")
    process.wait_for_output("reload_failed_previous_version_serving", timeout=RELOAD_TIMEOUT_SECS)
    error_lines = [line for line in process.output().splitlines() if line.startswith("error: ")]
    assert error_lines == [
        f"error: importing 'reload_demo' failed: {app_dir / 'reload_demo.py'}:1: SyntaxError: invalid syntax"
    ]
    assert answer(process) == second  # the previous worker still serves, unchanged
    assert '"changed":["reload_demo.py"]' in process.output()

    write_app(app_dir, "three")
    wait_for_answer(process, "three")
    assert process.stop() == 0


def test_a_broken_policy_keeps_the_previous_worker_and_a_config_change_restarts(
    bastion_process: Callable[..., BastionProcess], app_dir: Path
) -> None:
    process = start(bastion_process, app_dir)
    first = wait_for_answer(process, "one")

    (app_dir / "policies.cedar").write_text("permit(principal, action, resource) when { ;\n")
    process.wait_for_output("reload_failed_previous_version_serving", timeout=RELOAD_TIMEOUT_SECS)
    error_lines = [line for line in process.output().splitlines() if line.startswith("error: ")]
    assert error_lines == [
        f"error: policy.policy_path = '{app_dir / 'policies.cedar'}' does not parse: statement 1 (line 1): "
        "unexpected token `;`"
    ]
    assert answer(process) == first

    (app_dir / "policies.cedar").write_text(POLICY)
    (app_dir / "service.toml").write_text(CONFIG + '\n[service]\nname = "renamed"\n')
    deadline = time.monotonic() + RELOAD_TIMEOUT_SECS
    while True:  # a connection the old worker accepted as it stopped may be reset, as in wait_for_answer
        with contextlib.suppress(httpx.TransportError):
            if answer(process)["pid"] != first["pid"]:
                break
        assert time.monotonic() < deadline, process.output()
        time.sleep(0.1)
    assert process.stop() == 0


def test_reload_with_several_workers_is_refused(bastion_process: Callable[..., BastionProcess], app_dir: Path) -> None:
    process = bastion_process(
        "reload_demo:service",
        "--app-dir",
        str(app_dir),
        "--config",
        str(app_dir / "service.toml"),
        "--reload",
        "--workers",
        "2",
        wait=False,
    )
    assert process.proc.wait(timeout=30) == 2
    assert process.output().strip().splitlines()[-1] == (
        "error: --reload runs one worker: drop --workers (or --reload, to serve with several)"
    )


def test_configured_workers_run_as_one_and_the_worker_dies_with_the_supervisor(
    bastion_process: Callable[..., BastionProcess], app_dir: Path
) -> None:
    (app_dir / "service.toml").write_text(CONFIG + "\n[service]\nworkers = 3\n")  # production's; --reload runs one
    process = start(bastion_process, app_dir)
    served = wait_for_answer(process, "one")
    os.kill(process.proc.pid, signal.SIGKILL)  # the supervisor only, not its process group
    process.proc.wait(timeout=10)
    deadline = time.monotonic() + RELOAD_TIMEOUT_SECS
    while _pid_alive(int(str(served["pid"]))):
        assert time.monotonic() < deadline, "the worker outlived its supervisor"
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"  # a zombie has exited

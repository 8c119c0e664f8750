"""The CPU-heavy steps of big messages (MIME parsing, base64, JSON encoding) on worker processes.

A thread is not enough for them: on a 25 MB message, CPython's MIME parser, base64 and the JSON encoder each run
for 50-200 ms inside one C call that holds the GIL, and every other session's reply waits that long. Nor is plain
multiprocessing: it pickles arguments and results through a pipe, copying a 25 MB message in memory while holding
the GIL (~15 ms). Here big byte strings travel through private spool files instead (written and read by the
kernel, without the GIL); only the rest is pickled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import multiprocessing
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import structlog

from mailrelay._errors import RelayError

DEFAULT_WORKERS = 2
SPOOLED_BYTES = 256 * 1024  # byte strings from this size on go through a spool file
SHARED_MEMORY_DIR = Path("/dev/shm")  # noqa: S108 - tmpfs where there is one; mkdtemp makes a private (0700) dir in it

P = ParamSpec("P")
T = TypeVar("T")

log = structlog.get_logger("mailrelay.processes")


class WorkerCrashed(RelayError):
    """A worker process died under a message (killed, out of memory): the message is deferred, not refused."""


class _SpoolingPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, directory: str) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.directory = directory
        self.spooled: dict[int, str] = {}

    def persistent_id(self, obj: object) -> str | None:
        if type(obj) is not bytes or len(obj) < SPOOLED_BYTES:
            return None
        path = self.spooled.get(id(obj))
        if path is None:
            fd, path = tempfile.mkstemp(dir=self.directory, prefix="spool-")  # mode 0600: message content
            with os.fdopen(fd, "wb") as file:
                file.write(obj)
            self.spooled[id(obj)] = path
        return path


class _SpoolUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: object) -> bytes:
        path = str(pid)
        try:
            return Path(path).read_bytes()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)


def spool_dumps(obj: object, directory: str) -> bytes:
    """Pickle `obj`, its big byte strings to files in `directory` (the loader deletes them)."""
    buffer = io.BytesIO()
    _SpoolingPickler(buffer, directory).dump(obj)
    return buffer.getvalue()


def spool_loads(data: bytes) -> Any:
    return _SpoolUnpickler(io.BytesIO(data)).load()


def _invoke(call: bytes, directory: str) -> bytes:
    """In the worker: run the pickled call, hand back its result the same way."""
    function, args, kwargs = spool_loads(call)
    return spool_dumps(function(*args, **kwargs), directory)


def _spool_directory() -> str:
    base = SHARED_MEMORY_DIR if SHARED_MEMORY_DIR.is_dir() and os.access(SHARED_MEMORY_DIR, os.W_OK) else None
    return tempfile.mkdtemp(prefix="mailrelay-", dir=base)  # mode 0700


class WorkerProcesses:
    """At most `workers` processes, started on first use ("spawn": the relay's threads are not forked) and
    started again after one dies. Functions and arguments must be picklable (module-level functions, dataclasses).
    """

    def __init__(self, *, workers: int = DEFAULT_WORKERS) -> None:
        self.workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._directory: str | None = None

    def _executor(self) -> tuple[concurrent.futures.ProcessPoolExecutor, str]:
        if self._pool is None or self._directory is None:
            self._directory = _spool_directory()
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool, self._directory

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a worker; its exceptions come back as raised there."""
        pool, directory = self._executor()
        loop = asyncio.get_running_loop()
        call = await asyncio.to_thread(spool_dumps, (fn, args, kwargs), directory)
        try:
            result = await loop.run_in_executor(pool, _invoke, call, directory)
        except BrokenProcessPool:
            log.error("worker_process_died")
            self.close()
            raise WorkerCrashed("a worker process died while handling the message") from None
        return cast(T, await asyncio.to_thread(spool_loads, result))

    def close(self) -> None:
        pool, directory, self._pool, self._directory = self._pool, self._directory, None, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

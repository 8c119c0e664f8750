"""bastion_core._random: pooled random bytes, and delivery ids shaped exactly as uuid.uuid4().hex."""

from __future__ import annotations

import os
import uuid

import pytest

from bastion_core import _random


def test_uuid4_hex_is_uuid4s_hex_of_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [bytes(16), b"\xff" * 16, *(os.urandom(16) for _ in range(200))]
    for chunk in chunks:
        monkeypatch.setattr(_random, "random16", lambda chunk=chunk: chunk)
        assert _random.uuid4_hex() == uuid.UUID(bytes=chunk, version=4).hex


def test_ids_differ_and_the_pool_refills() -> None:
    ids = {_random.uuid4_hex() for _ in range(3 * _random._RandomPool.SIZE // 16)}
    assert len(ids) == 3 * _random._RandomPool.SIZE // 16


def test_a_forked_child_starts_its_own_pool() -> None:
    _random.random16()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, _random.random16())
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert child != _random.random16()

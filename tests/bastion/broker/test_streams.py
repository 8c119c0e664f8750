"""Streams at start-up on a real JetStream: created, unchanged, updated, refused; each retention policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StreamConfig
from structlog.testing import capture_logs

from bastion import load_settings
from bastion.errors import ConfigError
from tests.bastion.broker.conftest import broker_settings, eventually, worker
from tests.conftest import TOKEN_OFF, running
from tests.nats_server import NatsServer

EAGER = {"SERVICE_BROKER_LAZY_INIT": "false"}


async def messages_in(nc: Client, stream: str) -> int:
    return int((await nc.jetstream().stream_info(stream)).state.messages)


async def stream_is_empty(nc: Client, stream: str) -> bool:
    return await messages_in(nc, stream) == 0


async def test_a_declared_stream_is_created_with_its_limits(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.events.>"], max_messages=1000, max_age=3600, retention="limits")
    with capture_logs() as logs:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    config = (await nc.jetstream().stream_info(uid)).config
    assert (config.subjects, config.max_msgs, config.max_age, config.retention) == (
        [f"{uid}.events.>"],
        1000,
        3600.0,
        RetentionPolicy.LIMITS,
    )
    assert [entry["stream"] for entry in logs if entry["event"] == "broker_stream_created"] == [uid]


async def test_num_replicas_is_declared_on_the_stream(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.a"], num_replicas=1)
    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        pass
    assert (await nc.jetstream().stream_info(uid)).config.num_replicas == 1


async def test_more_replicas_than_the_server_has_refuse_to_start(nats_server: NatsServer, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.a"], num_replicas=3)
    with pytest.raises(AssertionError) as failed:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    assert str(failed.value) == (
        f"ConfigError: broker stream '{uid}' cannot be created: replicas > 1 not supported in non-clustered mode"
    )


def test_num_replicas_outside_1_to_5_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigError, match="stream 'orders': num_replicas must be 1 to 5, got 0"):
        worker().stream("orders", subjects=["orders.>"], num_replicas=0)


async def test_starting_again_changes_nothing(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.a"], max_messages=10)
    settings = broker_settings(nats_server.url, **EAGER)
    async with running(service.build(settings)):
        pass
    with capture_logs() as logs:
        async with running(service.build(settings)):
            pass
    assert not [entry for entry in logs if entry["event"].startswith("broker_stream_")]
    assert (await nc.jetstream().stream_info(uid)).config.max_msgs == 10


async def test_changed_limits_update_the_stream_with_a_warning(nats_server: NatsServer, nc: Client, uid: str) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=uid, subjects=[f"{uid}.a"], max_msgs=10))
    service = worker()
    service.stream(uid, subjects=[f"{uid}.a", f"{uid}.b"], max_messages=20)
    with capture_logs() as logs:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    updates = [entry for entry in logs if entry["event"] == "broker_stream_updated"]
    assert [(entry["log_level"], entry["changes"]) for entry in updates] == [
        ("warning", {"subjects": [[f"{uid}.a"], [f"{uid}.a", f"{uid}.b"]], "max_messages": [10, 20]})
    ]
    config = (await nc.jetstream().stream_info(uid)).config
    assert (sorted(config.subjects or []), config.max_msgs) == ([f"{uid}.a", f"{uid}.b"], 20)


async def test_a_retention_conflict_refuses_to_start(nats_server: NatsServer, nc: Client, uid: str) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=uid, subjects=[f"{uid}.jobs"]))
    service = worker()
    service.stream(uid, subjects=[f"{uid}.jobs"], retention="workqueue")
    with pytest.raises(AssertionError) as failed:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    assert str(failed.value) == (
        f"ConfigError: broker stream '{uid}' exists with retention 'limits', declared 'workqueue': a stream's "
        "retention cannot change; delete the stream or change the declaration"
    )
    assert (await nc.jetstream().stream_info(uid)).config.retention == RetentionPolicy.LIMITS  # left as it was


async def test_subjects_taken_by_another_stream_refuse_to_start(nats_server: NatsServer, nc: Client, uid: str) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=f"{uid}-other", subjects=[f"{uid}.orders.>"]))
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders.created"])
    with pytest.raises(AssertionError) as failed:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    assert str(failed.value) == (
        f"ConfigError: broker stream '{uid}' cannot be created: subjects overlap with an existing stream"
    )


async def test_a_conflict_with_lazy_init_keeps_the_broker_unready(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=uid, subjects=[f"{uid}.jobs"]))
    service = worker()
    service.stream(uid, subjects=[f"{uid}.jobs"], retention="interest")
    with capture_logs() as logs:
        async with running(service.build(broker_settings(nats_server.url))) as app:
            await eventually(
                lambda: any(entry["event"] == "broker_setup_failed" for entry in logs), what="the setup failure"
            )
            assert app.broker is not None and not app.broker.connected
            ready, _ = await app.health.readiness()
            assert ready is False
    [failure] = [entry for entry in logs if entry["event"] == "broker_setup_failed"]
    assert failure["error"].startswith(f"broker stream '{uid}' exists with retention 'limits', declared 'interest'")


async def test_a_config_table_replaces_the_declaration_of_the_same_name(
    nats_server: NatsServer, nc: Client, uid: str, tmp_path: Path
) -> None:
    config = tmp_path / "service.toml"
    config.write_text(
        f"""
[broker]
url = "{nats_server.url}"
lazy_init = false

[broker.streams.{uid}]
subjects = ["{uid}.configured.>"]
max_messages = 5
max_age = "1h"
retention = "WorkQueue"
"""
    )
    service = worker()
    service.stream(uid, subjects=[f"{uid}.declared"], max_messages=100)
    async with running(service.build(load_settings(config, environ=TOKEN_OFF))):
        pass
    stream = (await nc.jetstream().stream_info(uid)).config
    assert (stream.subjects, stream.max_msgs, stream.max_age, stream.retention) == (
        [f"{uid}.configured.>"],
        5,
        3600.0,
        RetentionPolicy.WORK_QUEUE,
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("subjects = []\n", "a stream needs at least one subject"),
        ('subjects = ["a..b"]\n', "'a..b' is not a subject"),
        ('subjects = ["a"]\nretention = "forever"\n', "expected one of Limits, Interest, WorkQueue"),
        ('subjects = ["a"]\nmax_messages = -5\n', "greater than or equal to -1"),
        ('subjects = ["a"]\nmax_age = "soon"\n', "max_age"),
        ('subjects = ["a"]\nmaxmessages = 5\n', "maxmessages"),
        ('subjects = ["a"]\nnum_replicas = 0\n', "greater than or equal to 1"),
        ('subjects = ["a"]\nnum_replicas = 7\n', "less than or equal to 5"),
    ],
)
def test_malformed_stream_tables_refuse_to_load(tmp_path: Path, table: str, message: str) -> None:
    config = tmp_path / "service.toml"
    config.write_text(f'[broker]\nurl = "nats://127.0.0.1:4222"\n\n[broker.streams.orders]\n{table}')
    with pytest.raises(ConfigError, match=r"broker\.streams\.orders") as failed:
        load_settings(config, environ=TOKEN_OFF)
    assert message in str(failed.value)


class TestRetention:
    async def test_limits_keeps_acked_messages_up_to_max_messages(
        self, nats_server: NatsServer, nc: Client, uid: str
    ) -> None:
        service = worker()
        service.stream(uid, subjects=[f"{uid}.log"], max_messages=3, retention="limits")
        handled: list[bytes] = []

        @service.consume(f"{uid}.log", durable=f"{uid}-reader", stream=uid)
        async def read(raw: bytes) -> None:
            handled.append(raw)

        async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
            assert app.broker is not None
            for number in range(5):
                await app.broker.publish(f"{uid}.log", str(number).encode(), ack=True)
            await eventually(lambda: len(handled) == 5, what="five handled")
        info = await nc.jetstream().stream_info(uid)
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (3, 3, 5)

    async def test_workqueue_removes_a_message_once_acked(self, nats_server: NatsServer, nc: Client, uid: str) -> None:
        service = worker()
        service.stream(uid, subjects=[f"{uid}.jobs"], retention="workqueue")
        handled: list[bytes] = []

        @service.consume(f"{uid}.jobs", durable=f"{uid}-worker", stream=uid)
        async def work(raw: bytes) -> None:
            handled.append(raw)

        async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
            assert app.broker is not None
            for number in range(3):
                await app.broker.publish(f"{uid}.jobs", str(number).encode(), ack=True)
            await eventually(lambda: len(handled) == 3, what="three handled")
            assert handled == [b"0", b"1", b"2"]
            await eventually(lambda: stream_is_empty(nc, uid), what="the acked messages removed")

    async def test_interest_drops_what_no_consumer_wants_and_removes_what_all_acked(
        self, nats_server: NatsServer, nc: Client, uid: str
    ) -> None:
        js = nc.jetstream()
        service = worker()
        service.stream(uid, subjects=[f"{uid}.news"], retention="interest")
        settings = broker_settings(nats_server.url, **EAGER)
        async with running(service.build(settings)) as app:
            assert app.broker is not None
            await app.broker.publish(f"{uid}.news", b"nobody listens", ack=True)
        assert await messages_in(nc, uid) == 0

        handled: list[bytes] = []
        with_reader = worker()
        with_reader.stream(uid, subjects=[f"{uid}.news"], retention="interest")

        @with_reader.consume(f"{uid}.news", durable=f"{uid}-reader", stream=uid)
        async def read(raw: bytes) -> None:
            handled.append(raw)

        async with running(with_reader.build(settings)) as app:
            assert app.broker is not None
            await app.broker.publish(f"{uid}.news", b"read me", ack=True)
            await eventually(lambda: handled == [b"read me"], what="the message handled")
            await eventually(lambda: stream_is_empty(nc, uid), what="the acked message removed")
        assert (await js.stream_info(uid)).state.last_seq == 2

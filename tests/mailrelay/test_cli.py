"""The console entry point's argument and configuration handling (in-process; e2e starts the real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mailrelay
from mailrelay import parse_settings
from mailrelay._assembly import attachment_policy, dmarc_checker, message_queue, raw_store, s3_sink
from mailrelay._attachment_policy import AttachmentPolicy, PolicyAction
from mailrelay._config import REMOVED_VARIABLES, VARIABLES
from mailrelay._mailauth import DmarcChecker
from mailrelay._raw import InlineRaw, S3Raw
from mailrelay._s3 import S3Sink
from mailrelay.cli import EXIT_CONFIG, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"MailRelay/{mailrelay.__version__}"


def test_docs_prints_the_manual_installed_with_the_relay(capsys: pytest.CaptureFixture[str]) -> None:
    """`--help` points here, not to a repository path a pip user does not have."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert main(["docs"]) == 0
    assert capsys.readouterr().out == (docs / "mailrelay.md").read_text()
    assert main(["docs", "installation"]) == 0
    assert capsys.readouterr().out == (docs / "installation.md").read_text()
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "More on each variable: `mailrelay docs`" in help_text
    assert "docs/" not in help_text


def test_unknown_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == EXIT_CONFIG
    assert capsys.readouterr().err == (
        "usage: mailrelay [--help] [--version] [docs [TOPIC]] [dead-letters list|show|replay ...]   (configured by "
        "MAIL_RELAY_* variables and ./.env)\n"
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_variable_once_the_required_first(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each variable on one line with its default and what it is for; the old attachment-limit name is named on
    the new name's line, not listed again."""
    assert main([flag]) == 0
    out = capsys.readouterr().out
    listed = [line.split(None, 2) for line in out.splitlines() if line.startswith("MAIL_RELAY_")]
    names = [name for name, _, _ in listed]
    rows = {name: (default, meaning) for name, default, meaning in listed}
    assert len(names) == len(set(names))
    old_name = "MAIL_RELAY_MAX_ATTACHMENT_SIZE"
    assert set(names) == VARIABLES - REMOVED_VARIABLES - {old_name}  # every variable a setting reads, once
    assert names[:2] == ["MAIL_RELAY_TARGET_EMAILS", "MAIL_RELAY_WEBHOOK_URL"]
    assert rows["MAIL_RELAY_TARGET_EMAILS"] == (
        "required",
        "comma-separated recipients to accept: addresses, *@domain, user+*@domain (required without ROUTES_FILE)",
    )
    assert rows["MAIL_RELAY_PORT"] == ("2525", "SMTP port")
    assert rows["MAIL_RELAY_ATTACHMENT_MAX_BYTES"] == (
        "10485760",
        "decoded bytes per attachment (old name MAIL_RELAY_MAX_ATTACHMENT_SIZE, either works)",
    )
    assert rows["MAIL_RELAY_WEBHOOK_SIGNING_SECRET"][0] == "unset"
    assert rows["MAIL_RELAY_ATTACHMENT_DENIED_TYPES"][0] == "empty"
    assert all(meaning.strip() for _, meaning in rows.values())
    assert out.startswith("usage: mailrelay [--help] [--version]")


def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("MAIL_RELAY_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param(
            "MAIL_RELAY_WEBHOK_URL",
            "MAIL_RELAY_WEBHOK_URL: not a MailRelay variable (did you mean MAIL_RELAY_WEBHOOK_URL?); fix the name, "
            "or set MAIL_RELAY_IGNORE_UNKNOWN_VARIABLES=true to start anyway",
            id="typo",
        ),
        pytest.param(
            "MAIL_RELAY_COLOUR",
            "MAIL_RELAY_COLOUR: not a MailRelay variable; fix the name, or set "
            "MAIL_RELAY_IGNORE_UNKNOWN_VARIABLES=true to start anyway",
            id="nothing-close",
        ),
    ],
)
def test_an_unknown_variable_stops_the_start(
    name: str, message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    for variable, value in REQUIRED.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv(name, "x")
    assert main([]) == EXIT_CONFIG
    assert capsys.readouterr().err == f"mailrelay: configuration error: {message}\n"


def test_an_unknown_variable_in_dotenv_stops_the_start_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    (tmp_path / ".env").write_text(
        "MAIL_RELAY_TARGET_EMAILS=inbox@example.test\nMAIL_RELAY_WEBHOOK_URL=https://hooks.example/m\n"
        "MAIL_RELAY_PROT=25\nMAIL_RELAY_MAX_MESAGE_SIZE=1\n"
    )
    assert main([]) == EXIT_CONFIG
    assert capsys.readouterr().err == (
        "mailrelay: configuration error: MAIL_RELAY_MAX_MESAGE_SIZE: not a MailRelay variable (did you mean "
        "MAIL_RELAY_MAX_MESSAGE_SIZE?) (1 more unknown); fix the name, or set "
        "MAIL_RELAY_IGNORE_UNKNOWN_VARIABLES=true to start anyway\n"
    )


def test_configuration_error_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    monkeypatch.setenv("MAIL_RELAY_TARGET_EMAILS", "inbox@example.test")
    monkeypatch.setenv("MAIL_RELAY_WEBHOOK_URL", "http://example.com/hook")
    monkeypatch.setenv("MAIL_RELAY_WEBHOOK_SIGNING_SECRET", "do-not-print")
    assert main([]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err == (
        "mailrelay: configuration error: MAIL_RELAY_WEBHOOK_URL: expected an https URL (plain http is allowed only"
        " to loopback hosts unless MAIL_RELAY_WEBHOOK_ALLOW_INSECURE=true), got 'http://example.com/hook'\n"
    )
    assert "do-not-print" not in err


REQUIRED = {"MAIL_RELAY_TARGET_EMAILS": "inbox@example.test", "MAIL_RELAY_WEBHOOK_URL": "https://hooks.example/m"}


def test_dmarc_checker_only_when_dmarc_is_on() -> None:
    assert dmarc_checker(parse_settings(REQUIRED)) is None
    checker = dmarc_checker(
        parse_settings({**REQUIRED, "MAIL_RELAY_DMARC_MODE": "monitor", "MAIL_RELAY_DNS_SERVERS": "127.0.0.1:5353"})
    )
    assert isinstance(checker, DmarcChecker)
    checker.close()


@pytest.mark.usefixtures("aws_credentials")
def test_s3_sink_and_policy_from_the_settings() -> None:
    assert s3_sink(parse_settings(REQUIRED)) is None
    s3 = parse_settings(
        {
            **REQUIRED,
            "MAIL_RELAY_ATTACHMENT_DELIVERY": "s3",
            "MAIL_RELAY_S3_BUCKET": "bucket-1",
            "MAIL_RELAY_S3_ENDPOINT_URL": "http://127.0.0.1:9",
            "MAIL_RELAY_S3_REGION": "us-east-1",
        }
    )
    sink = s3_sink(s3)
    assert isinstance(sink, S3Sink) and sink.bucket == "bucket-1"
    sink.close()
    values = {
        **REQUIRED,
        "MAIL_RELAY_MAX_ATTACHMENT_SIZE": "9",
        "MAIL_RELAY_ATTACHMENT_POLICY_ACTION": "reject",
        "MAIL_RELAY_ATTACHMENT_DENIED_EXTENSIONS": "exe",
    }
    assert attachment_policy(parse_settings(values)) == AttachmentPolicy(
        max_bytes=9, denied_extensions=frozenset({"exe"}), action=PolicyAction.REJECT
    )


@pytest.mark.usefixtures("aws_credentials")
def test_raw_store_from_the_settings() -> None:
    assert raw_store(parse_settings(REQUIRED), None) is None
    inline = raw_store(parse_settings({**REQUIRED, "MAIL_RELAY_RAW": "inline"}), None)
    assert isinstance(inline, InlineRaw) and inline.max_bytes == 524_288
    settings = parse_settings(
        {
            **REQUIRED,
            "MAIL_RELAY_RAW": "s3",
            "MAIL_RELAY_S3_BUCKET": "bucket-1",
            "MAIL_RELAY_S3_ENDPOINT_URL": "http://127.0.0.1:9",
            "MAIL_RELAY_S3_REGION": "us-east-1",
        }
    )
    sink = s3_sink(settings)
    assert settings.attachment_delivery == "inline" and isinstance(sink, S3Sink)
    store = raw_store(settings, sink)
    assert isinstance(store, S3Raw) and store.sink is sink
    sink.close()


def test_queue_only_in_jetstream_mode_with_every_nats_url_and_a_masked_one_to_show() -> None:
    assert message_queue(parse_settings(REQUIRED)) is None
    queue = message_queue(
        parse_settings(
            {
                **REQUIRED,
                "MAIL_RELAY_QUEUE": "jetstream",
                "MAIL_RELAY_NATS_URL": "nats://u:pw@a:4222,nats://t0ken@b:4222",
                "MAIL_RELAY_QUEUE_STREAM": "MAIL",
                "MAIL_RELAY_QUEUE_ACK_WAIT": "45",
            }
        )
    )
    assert queue is not None
    assert (queue.servers, queue.stream, queue.ack_wait) == (["nats://u:pw@a:4222", "nats://t0ken@b:4222"], "MAIL", 45)
    assert queue.shown_url == "nats://u:***@a:4222,nats://***@b:4222"

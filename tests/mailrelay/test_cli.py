"""The console entry point's argument and configuration handling (in-process; e2e starts the real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mailrelay
from mailrelay.cli import EXIT_CONFIG, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"MailRelay/{mailrelay.__version__}"


def test_unknown_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == EXIT_CONFIG
    assert capsys.readouterr().err == "usage: mailrelay [--version]   (configured by MAIL_RELAY_* variables)\n"


def test_configuration_error_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("MAIL_RELAY_")]:
        monkeypatch.delenv(name)
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

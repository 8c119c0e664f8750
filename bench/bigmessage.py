"""How much one 25 MB message holds up the relay's other sessions: a probe session sends NOOP after NOOP while
another session sends the big message, and the probe's reply times are reported per phase.

The relay runs as in the MailRelay rows (direct mode, signed webhooks to ``bench.apps.webhook_sink``) with the
attachment limit raised so the ~18 MB attachment is delivered inline (the worst case: MIME parsing, base64 of the
attachment, JSON encoding and signing of a ~25 MB payload). The big message is sent by a child process, so its
client work (encoding, dot-stuffing) never runs on the probe's loop. Timings go to stdout; nothing is asserted.
Run: ``python -m bench.bigmessage [--rounds 3] [--src DIR]`` (``--src``: run the relay from another source tree,
e.g. an exported older commit, to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import smtplib
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import REPO, ServerProcess, free_port, port_open, venv_script
from bench.stats import percentile

RCPT = "inbox@bench.test"
ATTACHMENT_BYTES = 18_000_000  # ~24.7 MB once base64-encoded in the message, under the 25 MiB default limit
PROBE_INTERVAL_SECS = 0.002
SETTLE_SECS = 0.5


def big_message() -> bytes:
    blob = base64.encodebytes(os.urandom(ATTACHMENT_BYTES)).replace(b"\n", b"\r\n")
    return (
        b"From: Big Sender <big@bench.test>\r\nTo: <" + RCPT.encode() + b">\r\nSubject: a big one\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b1\r\n\r\n"
        b"--b1\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nsee the attachment\r\n"
        b"--b1\r\nContent-Type: application/octet-stream\r\n"
        b'Content-Disposition: attachment; filename="big.bin"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
        + blob
        + b"--b1--\r\n"
    )


def send_big(port: int) -> None:
    """Child process: one big transaction; prints when the data was sent and when the reply came."""
    message = big_message()
    with smtplib.SMTP("127.0.0.1", port, timeout=120) as smtp:
        smtp.ehlo("big.bench.test")
        smtp.mail("big@bench.test")
        smtp.rcpt(RCPT)
        code, _ = smtp.docmd("DATA")
        assert code == 354, code
        started = time.time()
        smtp.send(message + b".\r\n")  # already CRLF and no line starts with a dot (base64 never does)
        sent = time.time()
        code, _ = smtp.getreply()
        replied = time.time()
    print(json.dumps({"size": len(message), "started": started, "sent": sent, "replied": replied, "code": code}))


async def probe(port: int, stop: asyncio.Event) -> list[tuple[float, float]]:
    """(when sent, seconds to the reply) of every NOOP until `stop` is set."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()
    writer.write(b"EHLO probe.bench.test\r\n")
    while not (await reader.readline()).startswith(b"250 "):
        pass
    samples: list[tuple[float, float]] = []
    while not stop.is_set():
        sent = time.time()
        started = time.perf_counter()
        writer.write(b"NOOP\r\n")
        await reader.readline()
        samples.append((sent, time.perf_counter() - started))
        await asyncio.sleep(PROBE_INTERVAL_SECS)
    writer.write(b"QUIT\r\n")
    writer.close()
    return samples


async def one_round(port: int) -> dict[str, object]:
    stop = asyncio.Event()
    probing = asyncio.create_task(probe(port, stop))
    await asyncio.sleep(SETTLE_SECS)
    argv = [sys.executable, "-m", "bench.bigmessage", "--send-big", str(port)]
    child = await asyncio.create_subprocess_exec(*argv, cwd=REPO, stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    await asyncio.sleep(SETTLE_SECS)
    stop.set()
    samples = await probing
    sent = json.loads(out.decode().strip().splitlines()[-1])

    def window(low: float, high: float) -> dict[str, float]:
        times = [rtt * 1000 for at, rtt in samples if low <= at < high]
        if not times:
            return {"probes": 0}
        return {"probes": len(times), "p50_ms": percentile(times, 50), "max_ms": max(times)}

    return {
        "message_bytes": sent["size"],
        "reply": sent["code"],
        "upload_s": round(sent["sent"] - sent["started"], 3),
        "processing_s": round(sent["replied"] - sent["sent"], 3),
        "idle": window(0, sent["started"]),
        "during_upload": window(sent["started"], sent["sent"]),
        "during_processing": window(sent["sent"], sent["replied"] + 0.001),
    }


def run(rounds: int, src: Path | None) -> list[dict[str, object]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-big-"))
    hook_port, smtp_port, health_port = free_port(), free_port(), free_port()
    started: list[ServerProcess] = []
    try:
        sink = ServerProcess(
            "webhook-sink",
            [sys.executable, "-m", "bench.apps.webhook_sink", str(hook_port)],
            log_path=workdir / "sink.log",
        )
        started.append(sink)
        sink.wait_ready(lambda: port_open(hook_port))
        env = {
            "MAIL_RELAY_TARGET_EMAILS": RCPT,
            "MAIL_RELAY_WEBHOOK_URL": f"http://127.0.0.1:{hook_port}/webhook",
            "MAIL_RELAY_WEBHOOK_SIGNING_SECRET": secrets.token_hex(32),
            "MAIL_RELAY_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_PORT": str(smtp_port),
            "MAIL_RELAY_HEALTH_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_HEALTH_PORT": str(health_port),
            "MAIL_RELAY_LOG_LEVEL": "WARNING",
            "MAIL_RELAY_ATTACHMENT_MAX_BYTES": "26214400",
            "MAIL_RELAY_WEBHOOK_TIMEOUT": "120",
        }
        if src is not None:
            env["PYTHONPATH"] = f"{src}{os.pathsep}{REPO}"
        relay = ServerProcess(
            "mailrelay", [venv_script("mailrelay")], log_path=workdir / "relay.log", env=env, cwd=workdir
        )
        started.append(relay)
        relay.wait_ready(lambda: port_open(smtp_port))
        return [asyncio.run(one_round(smtp_port)) for _ in range(rounds)]
    finally:
        for process in reversed(started):
            process.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bigmessage", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--src", type=Path, help="run the relay from this source tree (its src/ directory)")
    parser.add_argument("--send-big", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.send_big:
        send_big(args.send_big)
        return
    for number, result in enumerate(run(args.rounds, args.src), 1):
        print(json.dumps({"round": number, **result}))


if __name__ == "__main__":
    main()

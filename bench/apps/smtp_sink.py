"""The MailRelay ceiling: plain aiosmtpd accepting every message and discarding it.

Same event loop as ``mailrelay`` (the standard asyncio loop). Run: ``python -m bench.apps.smtp_sink PORT``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from aiosmtpd.smtp import SMTP


class Discard:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "250 OK: Message accepted for delivery"


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    handler = Discard()
    server = await loop.create_server(lambda: SMTP(handler, hostname="sink.test"), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    asyncio.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()

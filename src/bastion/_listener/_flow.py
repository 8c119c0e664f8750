"""Reading on an HTTP/1.1 connection: uvicorn's flow control, plus input held unparsed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from uvicorn.protocols.http.flow_control import FlowControl


class ReadGate(FlowControl):
    """uvicorn's flow control for one connection, with a second reason not to read: bytes received but held
    unparsed (``hold``).

    uvicorn pauses reading while a request is queued or a body is over its high-water mark, and resumes it when
    a response completes or the app waits for body. The transport reads only while neither pauses it. A resume
    while bytes are held calls ``on_resume`` instead, which parses them first (the transport stays paused).
    """

    def __init__(self, transport: asyncio.Transport, on_resume: Callable[[], None]) -> None:
        super().__init__(transport)
        self.reader = transport
        self.on_resume = on_resume
        self.held = False

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            if not self.held:
                self.reader.pause_reading()

    def resume_reading(self) -> None:
        if self.held:
            self.read_paused = False
            self.on_resume()
        elif self.read_paused:
            self.read_paused = False
            self.reader.resume_reading()

    def hold(self) -> None:
        if not self.held:
            self.held = True
            if not self.read_paused:
                self.reader.pause_reading()

    def release(self) -> None:
        if self.held:
            self.held = False
            if not self.read_paused and not self.reader.is_closing():
                self.reader.resume_reading()

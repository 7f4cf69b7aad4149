"""A loopback TCP proxy that injects faults into the link between one client and a server.

``FaultProxy`` listens on ``127.0.0.1`` (a free port) and forwards every connection to
the real server. For each chunk the server sends back, with probability ``p`` it does
one of three things, chosen uniformly:

* **delay**: holds the chunk (and so everything behind it on that connection) for a
  uniform time in ``[0, max_delay_s]``: a slow reply;
* **cut**: closes both sides of the connection (FIN): the reply is lost, the request
  may or may not have been executed;
* **reset**: the same with ``SO_LINGER`` 0, so that both sides see an RST.

Faults hit replies only: a lost or late reply is what makes an outcome ambiguous (the
client cannot tell whether its request ran), and a request that never arrives looks
the same to the client. :meth:`FaultProxy.pause` holds every byte in both directions
(and every new connection) for a span: a partition of this one client. The random
choices are seeded per connection (``seed``, proxy name, connection number) and every
fault is counted in :attr:`FaultProxy.counts` and logged with its wall time in
:attr:`FaultProxy.log` (so that an analysis can tell what one link suffered when).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["FaultCounts", "FaultProxy"]

CHUNK = 65_536
_LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass
class FaultCounts:
    """What one proxy did; summed over proxies with :meth:`add`."""

    connections: int = 0
    replies: int = 0  # chunks forwarded from the server
    delayed: int = 0
    delay_s: float = 0.0
    cut: int = 0
    reset: int = 0
    pauses: int = 0
    paused_s: float = 0.0

    def add(self, other: FaultCounts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _Link:
    """The two sockets of one proxied connection."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.writers = (client, server)
        self.closed = False

    def close(self, *, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in self.writers:
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                writer.transport.abort()  # close now: the kernel sends RST (linger 0)
            else:
                writer.close()


class FaultProxy:
    """One client's faulty link to ``target`` (host, port); see the module docstring."""

    def __init__(
        self,
        name: str,
        target: tuple[str, int],
        *,
        p: float,
        max_delay_s: float,
        seed: int,
    ) -> None:
        self.name = name
        self.target = target
        self.p = p
        self.max_delay_s = max_delay_s
        self.seed = seed
        self.counts = FaultCounts()
        #: Every fault: (wall time it began, "delay" | "cut" | "reset" | "pause", seconds).
        self.log: list[tuple[float, str, float]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._numbers = itertools.count()
        self._open = asyncio.Event()
        self._open.set()

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        self._open.set()
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        if self._handlers:  # every connection's handler ends once its link is closed
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def pause(self, seconds: float) -> None:
        """Hold every byte and every new connection for ``seconds`` (if not paused already)."""
        if self.paused:
            return
        self.counts.pauses += 1
        self.counts.paused_s += seconds
        self.log.append((time.time(), "pause", seconds))
        self._open.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._open.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        number = next(self._numbers)
        rng = random.Random(f"{self.seed}:{self.name}:{number}")
        self.counts.connections += 1
        await self._open.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, link, None)),
            asyncio.ensure_future(self._pump(up_reader, writer, link, rng)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            link.close()
            self._links.discard(link)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        rng: random.Random | None,
    ) -> None:
        """Forward one direction; ``rng`` is given for the server's replies (faults)."""
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    return
                await self._open.wait()
                if rng is not None:
                    self.counts.replies += 1
                    if self.p > 0 and rng.random() < self.p:
                        kind = rng.choice(("delay", "cut", "reset"))
                        if kind == "delay":
                            delay = rng.uniform(0, self.max_delay_s)
                            self.counts.delayed += 1
                            self.counts.delay_s += delay
                            self.log.append((time.time(), "delay", delay))
                            await asyncio.sleep(delay)
                            await self._open.wait()
                        else:
                            setattr(self.counts, kind, getattr(self.counts, kind) + 1)
                            self.log.append((time.time(), kind, 0.0))
                            link.close(reset=kind == "reset")
                            return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

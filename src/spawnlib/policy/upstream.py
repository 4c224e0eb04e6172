"""The gateway's way to the model: HTTP/1.1 on asyncio streams, parsed by h11, its connections kept for the next call.

httpx's pool looks at every connection it keeps for each request it places
(a poll of each idle socket) and runs each read under an anyio cancel scope:
with 16 streams through the gateway that put tens of milliseconds in front of
a call's first byte and about a millisecond of CPU on each relayed chunk. The
gateway needs one thing of a client: send a request, hand back the answer's
body bytes as they come. So this does that, on the event loop's own streams,
with h11 (which uvicorn and httpx already bring) for the protocol.

A proxy from the environment (HTTPS_PROXY and the like) is httpx's to speak:
the gateway keeps httpx for an upstream reached through one (see proxied).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: every runner imports the gateway's module, and only the gateway runs this
    import asyncio
    import ssl

READ_BYTES = 1 << 16
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0  # between two reads of one answer: as long as a model may think
IDLE_KEEP_S = 30.0  # an idle connection older than this is closed rather than reused (servers drop theirs)
IDLE_KEPT = 64


def proxied(url: str, environ: Mapping[str, str]) -> bool:
    """Whether the environment routes url through a proxy (then httpx, which speaks to proxies, carries the calls)."""
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxies = {k[: -len("_proxy")].lower(): v for k, v in environ.items() if k.lower().endswith("_proxy") and v}
    if not proxies.get(parts.scheme) and not proxies.get("all"):
        return False
    # Python's NO_PROXY rule, from the proxies given rather than its own read of os.environ (typeshed lacks it).
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    return not bypass(parts.hostname or "", proxies)


def tls_context(environ: Mapping[str, str]) -> ssl.SSLContext:
    """The CAs an upstream's certificate is checked against: SSL_CERT_FILE / SSL_CERT_DIR when set, else
    certifi's (as httpx has them: a slim image may have no system store), else the system's."""
    import ssl

    cafile, capath = environ.get("SSL_CERT_FILE") or None, environ.get("SSL_CERT_DIR") or None
    if cafile is None and capath is None:
        with contextlib.suppress(ImportError):
            import certifi

            cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)


class Headers:
    """An answer's headers as h11 gives them (names in lower case), in order, repeats kept."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def get(self, name: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.pairs if k == name.lower()), default)

    def items(self) -> list[tuple[str, str]]:
        return list(self.pairs)


@dataclass
class Connection:
    """One HTTP/1.1 connection to the upstream, and where its h11 state machine is."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: Any
    idle_since: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Response:
    """An answer whose body is read as it comes (aiter_raw), then closed (aclose), which keeps its connection if it can."""

    def __init__(self, upstream: Upstream, conn: Connection, status: int, headers: Headers) -> None:
        self.upstream, self.conn, self.status_code, self.headers = upstream, conn, status, headers
        self.done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        import asyncio

        import h11

        conn = self.conn
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    data = await conn.reader.read(READ_BYTES)
                conn.h11.receive_data(data)  # b"" at the end of the stream: h11 says whether that ends the body
                continue
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.done = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                return

    async def aclose(self) -> None:
        """Give the connection back for the next call when the answer was read whole and both sides may go on; else close it."""
        import h11

        conn = self.conn
        if self.done and conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            with contextlib.suppress(h11.LocalProtocolError):
                conn.h11.start_next_cycle()
                conn.idle_since = time.monotonic()
                self.upstream.keep(conn)
                return
        conn.close()


class Upstream:
    """Calls to one base URL (scheme, host, port, path prefix) over kept HTTP/1.1 connections."""

    def __init__(self, base_url: str, environ: Mapping[str, str]) -> None:
        import urllib.parse

        parts = urllib.parse.urlsplit(base_url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = self.port == (443 if self.tls else 80)
        self.authority = self.host if default_port else f"{self.host}:{self.port}"
        self.idle: list[Connection] = []
        self.context: ssl.SSLContext | None = tls_context(environ) if self.tls else None

    def keep(self, conn: Connection) -> None:
        if len(self.idle) < IDLE_KEPT:
            self.idle.append(conn)
        else:
            conn.close()

    async def connect(self) -> Connection:
        import asyncio

        import h11

        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.context, server_hostname=self.host if self.tls else None, limit=READ_BYTES
            )
        return Connection(reader, writer, h11.Connection(our_role=h11.CLIENT))

    def reuse(self) -> Connection | None:
        """The newest idle connection still fit to carry a call (none that has idled long, or that the server closed)."""
        while self.idle:
            conn = self.idle.pop()
            if time.monotonic() - conn.idle_since < IDLE_KEEP_S and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    async def send(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        """The answer's status and headers (its body to be read); OSError or h11's errors when the upstream fails.

        A kept connection the server has closed meanwhile fails before any answer: the call is
        then sent once more on a new one, as no byte of it was answered.
        """
        import asyncio

        import h11

        framing = ("host", "content-length", "transfer-encoding")
        pairs = [("host", self.authority), *((k, v) for k, v in headers.items() if k.lower() not in framing)]
        pairs.append(("content-length", str(len(body))))
        request = h11.Request(method=method, target=self.prefix + path, headers=pairs)
        for reused in (True, False):
            conn = self.reuse() if reused else None
            if reused and conn is None:
                continue
            conn = conn or await self.connect()
            try:
                conn.writer.write(conn.h11.send(request) + conn.h11.send(h11.Data(data=body)) + conn.h11.send(h11.EndOfMessage()))
                await conn.writer.drain()
                while True:
                    event = conn.h11.next_event()
                    if event is h11.NEED_DATA:
                        async with asyncio.timeout(READ_TIMEOUT_S):
                            conn.h11.receive_data(await conn.reader.read(READ_BYTES))
                        continue
                    if isinstance(event, h11.Response):
                        names = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
                        return Response(self, conn, event.status_code, Headers(names))
                    if isinstance(event, h11.ConnectionClosed):
                        raise ConnectionResetError("the upstream closed the connection before answering")
                    # An informational answer (100 Continue): read on.
            except (OSError, h11.ProtocolError, TimeoutError):
                conn.close()
                if not reused:
                    raise
        raise ConnectionError("unreachable")  # both passes return or raise: for the type checker

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop().close()

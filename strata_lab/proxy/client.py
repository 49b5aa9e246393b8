"""The proxy's client towards `--upstream`: HTTP/1.1 with keep-alive, over asyncio, parsed by httptools.

A general-purpose client (httpx) spent most of the proxy's time per call (its request and response models, the
connection pool's bookkeeping, two socket writes a request); this one writes each request in one piece, reads
the answer with httptools' C parser and hands the body on as it arrives (de-chunked; any content-encoding left
as it is). Idle connections are kept (`max_idle`) and reused; a reused connection that turns out to be closed
before any answer byte came is replaced once. `timeout`: seconds without a byte from the upstream while an
answer is awaited or read; `connect_timeout`: seconds to connect. The upstream is reached directly: an
HTTP(S)_PROXY setting that would apply to it is refused when the client is made (ValueError).
"""
from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

try:
    import httptools
except ImportError:  # pragma: no cover - part of the server extra
    httptools = None

__all__ = ["UpstreamClient", "UpstreamError", "Response"]

_HIGH = 1 << 20          # body bytes buffered from the upstream before reading pauses


class UpstreamError(OSError):
    """The upstream could not be reached, or its answer broke off; `kind` names what happened."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class _Conn(asyncio.Protocol):
    """One connection; one request at a time. The httptools callbacks fill the current answer."""

    def __init__(self, loop):
        self.loop = loop
        self.transport = None
        self.closed = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list = []
        self.head = False          # the status line and headers are in
        self.done = False          # the whole answer is in
        self.keep_alive = False
        self.got = 0               # answer bytes received
        self.error: BaseException | None = None
        self.chunks: deque = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.last = self.loop.time()
        self.head_only = False

    # --- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # noqa: BLE001 - httptools' parser errors and upgrades
            self._fail(UpstreamError("bad answer", f"{type(exc).__name__}: {exc}"))
            self.transport.close()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.done:
            if self.head and exc is None and self._until_close():
                self.done = True      # an answer without a length ends with the connection
            else:
                self._fail(UpstreamError("connection closed" if exc is None else type(exc).__name__,
                                         "" if exc is None else str(exc)))
        self._wake()

    # --- httptools callbacks ---------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:     # an interim answer (100 Continue): the real one follows
            self.headers, self.status = [], 0
            return
        self.head = True
        self.keep_alive = self.parser.should_keep_alive()
        if self.head_only:
            self.done = True
            self.keep_alive = False     # the parser would wait for a body that HEAD never gets
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.head:
            self.done = True
            self._wake()

    # --- for the client ----------------------------------------------------------------------------------
    def _until_close(self) -> bool:
        names = {k.lower() for k, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until something arrives (or the connection ends); UpstreamError after `timeout` s of silence."""
        self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._check_silence, timeout)
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None

    def _check_silence(self, timeout: float) -> None:
        if self.waiter is None or self.waiter.done():
            return
        idle = self.loop.time() - self.last
        if idle >= timeout * 0.999:
            self._fail(UpstreamError("ReadTimeout", f"no answer byte in {timeout:g} s"))
            self.abort()
        else:
            self.loop.call_later(timeout - idle, self._check_silence, timeout)

    def take(self) -> bytes | None:
        if not self.chunks:
            return None
        out = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return out

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """An answer: `status`, `headers` (raw (name, value) pairs as sent), the body by `chunks()` or `read()`.
    `aclose()` hands the connection back (whole answer read) or closes it."""

    def __init__(self, client: "UpstreamClient", conn: _Conn):
        self._client, self._conn = client, conn
        self.status = conn.status
        self.headers = conn.headers
        self._closed = False

    def header(self, name: bytes) -> str:
        for k, v in self.headers:
            if k.lower() == name:
                return v.decode("latin-1")
        return ""

    async def chunks(self):
        """The body as it arrives (each piece all that came since the last); UpstreamError if it breaks off."""
        conn, timeout = self._conn, self._client.timeout
        while True:
            data = conn.take()
            if data:
                yield data
                continue
            if conn.done:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(timeout)

    async def read(self, limit: int) -> tuple[list, bool]:
        """The body's pieces, up to past `limit` bytes; (pieces, over): over means more than `limit` came."""
        out, n = [], 0
        async for data in self.chunks():
            out.append(data)
            n += len(data)
            if n > limit:
                return out, True
        return out, False

    def abort(self, why: str) -> None:
        """Close the connection now (the client left): a read in progress ends with UpstreamError(why)."""
        self._conn._fail(UpstreamError(why))
        self._conn.abort()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        if conn.done and conn.keep_alive and not conn.closed and conn.error is None:
            self._client._release(conn)
        else:
            conn.abort()


class UpstreamClient:
    """Requests to one upstream base URL (http or https; its path is put before each request's)."""

    def __init__(self, base: str, *, timeout: float = 600.0, connect_timeout: float = 10.0, max_idle: int = 64):
        if httptools is None:
            raise RuntimeError("strata-lab proxy needs httptools: pip install 'strata-lab[server]'")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--upstream must be an http(s) URL, got {base!r}")
        proxy = getproxies().get(parts.scheme)
        if proxy and not proxy_bypass(parts.hostname):
            raise ValueError(f"--upstream {base} would go through the {parts.scheme}_proxy setting ({proxy}); "
                             "the proxy connects to its upstream directly: add the host to NO_PROXY")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = _ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/").encode()
        default = parts.port is None
        self.host_header = (f"[{self.host}]" if ":" in self.host else self.host).encode() + \
            (b"" if default else b":%d" % self.port)
        self.timeout, self.connect_timeout, self.max_idle = timeout, connect_timeout, max_idle
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None), self.connect_timeout)
        except asyncio.TimeoutError:
            raise UpstreamError("ConnectTimeout", f"{self.host}:{self.port}") from None
        except OSError as exc:
            raise UpstreamError("ConnectError", f"{self.host}:{self.port}: {exc}") from None
        return conn

    def _release(self, conn: _Conn) -> None:
        if len(self._idle) < self.max_idle:
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.abort()

    async def request(self, method: str, target: bytes, headers: list, body: bytes) -> Response:
        """Send `method` `target` (path and query, as bytes; the base's path goes before it) with `headers`
        ((name, value) bytes pairs, hop-by-hop ones already out) and `body`; the answer once its head is in."""
        head = [method.encode("ascii"), b" ", self.prefix + target, b" HTTP/1.1\r\nhost: ", self.host_header,
                b"\r\n"]
        for k, v in headers:
            head += [k, b": ", v, b"\r\n"]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            head += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        head.append(b"\r\n")
        data = b"".join(head) + body if len(body) < 65536 else None
        for attempt in (0, 1):
            conn = None
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    conn = c
                    break
            if conn is None:
                conn = await self._connect()
            conn._reset()
            conn.head_only = method == "HEAD"
            if data is not None:
                conn.transport.write(data)
            else:
                conn.transport.writelines([b"".join(head), body])
            try:
                while not conn.head:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self.timeout)
            except UpstreamError:
                conn.abort()
                if attempt == 0 and conn.reused and conn.got == 0 and conn.error is not None and \
                        conn.error.kind != "ReadTimeout":
                    continue   # a kept connection the upstream had closed: once more on a new one
                raise
            except BaseException:
                conn.abort()
                raise
            return Response(self, conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()

"""The server's front door: who may talk to it, in what shape, and for how long (docs/SECURITY.md).

Two ASGI middlewares wrap the app, outermost first:

* `Guard` refuses what a browser page on another site could send: a `Host` that is not a name of the
  bound address or an `--allowed-host` (DNS rebinding, 403), an `Origin` not given with `--cors` (403),
  and a non-JSON body on a POST route (415: a page may POST `text/plain` without a CORS preflight).
  CORS itself is opt-in: for `--cors` origins Starlette's `CORSMiddleware` answers preflights and adds the
  response headers.
* `Gate` checks the API key (Bearer or x-api-key, any of the configured keys; /health and preflights are
  open), the body size, how long the whole body may take to arrive (a total deadline: a stalled or trickled
  upload gets a 408, never an open-ended hold), and how many requests one client has in flight (429 over
  `--max-client-requests`; /health and /props are not counted, so they always answer). A client is its API
  key when keys are required (several keys: each has its own limit, so one key's load never blocks
  another's), else its address. Keys go by their names (`--api-key-file` lines `NAME KEY`, else a hash of
  the key: `config.key_name`) in errors and logs, never by their text.

>>> allowed_hosts("127.0.0.1", ()) >= {"127.0.0.1", "localhost"}
True
>>> allowed_hosts("0.0.0.0", ()) is None  # a wildcard bind checks no Host unless names are given
True
>>> host_name("[::1]:8080"), host_name("LocalHost:80"), host_name("example.com")
('::1', 'localhost', 'example.com')
>>> is_json_type("application/json; charset=utf-8"), is_json_type("text/plain"), is_json_type(None)
(True, False, False)
"""
from __future__ import annotations

import asyncio
import hmac
import json

from strata_lab.server.errors import RequestError, error_body

__all__ = ["Guard", "Gate", "allowed_hosts", "host_name", "is_json_type", "wrap"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_WILDCARD = {"0.0.0.0", "::", ""}
_BODY_METHODS = {"POST", "PUT", "PATCH"}
CORS_HEADERS = ["authorization", "content-type", "x-api-key", "anthropic-version", "anthropic-beta",
                "openai-organization", "openai-project", "x-stainless-lang", "x-stainless-arch"]


def allowed_hosts(bind: str, extra) -> set[str] | None:
    """Host header names the server answers to; None: any (a wildcard bind with no names given)."""
    names = {host_name(h) for h in extra}
    bind = bind.strip("[]").lower()
    if bind in _WILDCARD:
        return names or None
    names.add(bind)
    if bind in _LOOPBACK:
        names |= _LOOPBACK
    return names


def host_name(value: str) -> str:
    """The name in a Host header: lower case, without the port (IPv6 literals without brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_json_type(value: str | None) -> bool:
    """A JSON media type (`application/json`, `application/*+json`), parameters ignored."""
    if not value:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def send_error(send, err: RequestError, path: str) -> None:
    body = json.dumps(error_body(err, path)).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: Host, Origin and content-type policy (see the module docstring)."""

    def __init__(self, app, *, hosts: set[str] | None, origins: tuple[str, ...]):
        self.app = app
        self.hosts = hosts
        self.origins = set(origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        path = scope.get("path", "")
        err = self._refusal(scope, headers)
        if err is not None:
            return await send_error(send, err, path)
        await self.app(scope, receive, send)

    def _refusal(self, scope, headers) -> RequestError | None:
        host = headers.get("host")
        if self.hosts is not None and host is not None and host_name(host) not in self.hosts:
            return RequestError(None, f"Host {host!r} is not a name this server answers to (see --allowed-host)",
                                code="host_not_allowed", status=403)
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return RequestError(None, f"Origin {origin!r} is not allowed (cross-origin requests need --cors "
                                "ORIGIN)", code="origin_not_allowed", status=403)
        if scope.get("method") in _BODY_METHODS and not is_json_type(headers.get("content-type")):
            return RequestError("body", "must be sent with Content-Type: application/json, got "
                                f"{headers.get('content-type')!r}", code="unsupported_media_type", status=415)
        return None


class Gate:
    """ASGI middleware: API key (Bearer or x-api-key), body size limit and body arrival time limit."""

    OPEN_PATHS = ("/health",)
    UNCOUNTED_PATHS = ("/health", "/props")

    def __init__(self, app, *, keys: dict[str, str] | None, max_body_bytes: int, body_timeout: float = 30.0,
                 max_client_requests: int = 16):
        """`keys`: every accepted API key -> its name (ServerConfig.keys()); empty or None: no key required."""
        self.app = app
        self.keys = [(k.encode("utf-8", "surrogatepass"), name) for k, name in (keys or {}).items()]
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.max_client_requests = max_client_requests
        self.in_flight: dict[str, int] = {}  # client address -> requests being served

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        path = scope.get("path", "")
        key_name = None
        if self.keys and path not in self.OPEN_PATHS and scope.get("method") != "OPTIONS":
            key_name = self._key_name(headers)
            if key_name is None:
                return await send_error(send, RequestError(None, "a valid API key is required (Authorization: "
                                                           "Bearer KEY or x-api-key: KEY)", code="invalid_api_key",
                                                           status=401), path)
            scope.setdefault("state", {})["api_key_name"] = key_name
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await send_error(send, self._too_large(), path)
        # the limit's unit: the API key when keys are required (one key per client), else the address
        client = ("key", key_name) if key_name is not None else ("address", (scope.get("client") or ("?", 0))[0])
        counted = path not in self.UNCOUNTED_PATHS
        if counted:
            if self.in_flight.get(client, 0) >= self.max_client_requests:
                who = f"the API key {key_name!r}" if key_name is not None else "this client address"
                return await send_error(send, RequestError(
                    None, f"{who} already has {self.max_client_requests} requests in flight "
                    "(--max-client-requests); retry when one has finished", code="too_many_requests", status=429),
                    path)
            self.in_flight[client] = self.in_flight.get(client, 0) + 1
        seen = 0
        body_done = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout  # for the whole body, however it is sliced

        async def limited_receive():
            nonlocal seen, body_done
            if body_done:  # later receives wait for a disconnect: no time limit on those
                return await receive()
            try:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                raise RequestError("body", f"did not arrive within {self.body_timeout:g} s",
                                   code="request_timeout", status=408) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise self._too_large()
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        try:
            await self.app(scope, limited_receive, send)
        finally:
            if counted:
                n = self.in_flight.get(client, 1) - 1
                if n > 0:
                    self.in_flight[client] = n
                else:
                    self.in_flight.pop(client, None)

    def _key_name(self, headers: dict) -> str | None:
        """The name of the API key the request carries, None when it carries none of ours. Every key is
        compared, in constant time, whichever matches: the time taken tells nothing about the keys."""
        given = headers.get("x-api-key") or ""
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = given or auth[7:].strip()
        if not given:
            return None
        raw = given.encode("latin-1")  # the header's bytes (decoded as latin-1 above); keys are compared as UTF-8
        found = None
        for key, name in self.keys:
            if hmac.compare_digest(raw, key) and found is None:
                found = name
        return found

    def _too_large(self) -> RequestError:
        return RequestError("body", f"is larger than the limit of {self.max_body_bytes} bytes",
                            code="request_too_large", status=413)


def wrap(app, config):
    """`app` behind Gate, CORS (when `config.cors_origins`) and Guard, for a ServerConfig."""
    inner = Gate(app, keys=config.keys(), max_body_bytes=config.max_body_bytes,
                 body_timeout=config.body_timeout, max_client_requests=config.max_client_requests)
    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        inner = CORSMiddleware(inner, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                               allow_headers=CORS_HEADERS, max_age=600)
    return Guard(inner, hosts=allowed_hosts(config.host, config.allowed_hosts), origins=config.cors_origins)

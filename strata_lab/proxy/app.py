"""The recording proxy's ASGI app: every request goes to `--upstream` as it came; the calls of the LLM routes
(engines.ROUTES) are recorded, one strata-dump/1 line each, with the engine's own ids where it can return them.

Per call: the body is read (at most `max_body` bytes), the engine's id options are added (engines.plan_request),
the request is sent on with the client's headers (hop-by-hop ones aside; `accept-encoding: identity` on the
recorded routes, so the proxy can read the answer), and the answer comes back with the upstream's status and
headers. A streamed answer goes on event by event as each arrives (an SSE event is held only until its blank
line); a whole one is read, then sent. The keys the added options brought are taken out of each JSON document
again, byte for byte (engines.strip). Upstream errors pass through untouched and are recorded as errors; a
client that leaves mid-stream closes the upstream request and the line records what was seen (finish
`cancelled`). Nothing about the request's headers is written: API keys pass through and are never recorded.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from strata_lab.proxy.engines import PROFILES, ROUTES, Capture, plan_request, strip

try:
    import orjson as _orjson

    _loads = _orjson.loads
except ImportError:  # pragma: no cover - orjson is a core dependency
    _loads = json.loads

__all__ = ["ProxyConfig", "Upstream", "create_app", "probe_upstream", "HOP_BY_HOP"]

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
MAX_EVENT = 8 << 20        # an SSE event longer than this is passed on unread (never held whole)
MAX_TEXT = 1 << 20         # reply text kept per call (characters)


@dataclass
class ProxyConfig:
    upstream: str
    dump: str
    engine: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8090
    max_body: int = 32 << 20          # request bytes read (413 past it)
    max_answer: int = 64 << 20        # a whole answer read to record it; past it, passed on unrecorded
    max_record_messages: int = 1 << 20  # request text kept on a line without ids (fidelity messages)
    timeout: float = 600.0

    def __post_init__(self):
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--upstream must be an http(s) URL, got {self.upstream!r}")
        if self.engine != "auto" and self.engine not in PROFILES:
            raise ValueError(f"--engine must be auto or one of {', '.join(PROFILES)}, got {self.engine!r}")
        for name in ("max_body", "max_answer", "max_record_messages"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


@dataclass
class Upstream:
    """Who answers: the engine and what it says about itself (model, version, flags where it exposes them)."""

    engine: str
    model: str | None = None
    version: str | None = None
    flags: dict = field(default_factory=dict)

    def identity(self) -> dict:
        out: dict = {"engine": self.engine}
        for k in ("model", "version"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.flags:
            out["flags"] = self.flags
        return out


def _get_json(client, path: str):
    try:
        r = client.get(path, timeout=5.0)
    except Exception:  # noqa: BLE001 - a probe that fails says nothing
        return None, {}
    try:
        return (r.json() if r.status_code == 200 else None), dict(r.headers)
    except ValueError:
        return None, dict(r.headers)


def probe_upstream(base: str, engine: str = "auto", headers: dict | None = None) -> Upstream:
    """Ask the upstream what it is (GET /v1/models, /version, /props, /get_server_info): nothing else is sent."""
    import httpx

    from strata_lab.proxy.engines import detect_engine

    with httpx.Client(base_url=base.rstrip("/"), headers=headers or {}) as c:
        models, h = _get_json(c, "/v1/models")
        version, _ = _get_json(c, "/version")
        props, _ = _get_json(c, "/props")
        info, _ = _get_json(c, "/get_server_info")
    name = engine if engine != "auto" else detect_engine(models, version, props, info, h,
                                                         urlsplit(base).hostname or "")
    up = Upstream(name)
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0] if isinstance(models["data"][0], dict) else {}
        up.model = first.get("id") if isinstance(first.get("id"), str) else None
        if isinstance(first.get("max_model_len"), int):
            up.flags["max_model_len"] = first["max_model_len"]
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        up.version = version["version"]
    if isinstance(info, dict):
        up.version = up.version or (info.get("version") if isinstance(info.get("version"), str) else None)
        for k in ("page_size", "context_length", "chunked_prefill_size", "disable_radix_cache", "enable_cache_report",
                  "schedule_policy", "max_running_requests", "tp_size"):
            v = info.get(k)
            if isinstance(v, (int, float, str, bool)):
                up.flags[k] = v
    if isinstance(props, dict):
        gen = props.get("default_generation_settings")
        if isinstance(gen, dict) and isinstance(gen.get("n_ctx"), int):
            up.flags["n_ctx"] = gen["n_ctx"]
        for k in ("total_slots", "build_info", "reply_reuse"):
            v = props.get(k)
            if isinstance(v, (int, str, bool)):
                up.flags[k] = v
        if up.version is None and isinstance(props.get("build_info"), str):
            up.version = props["build_info"]
    return up


def _session(request_headers, body: dict) -> str | None:
    """The client's own session name: X-Session-Id, metadata.session_id, metadata.user_id, user (else None)."""
    sid = request_headers.get("x-session-id")
    if sid:
        return sid[:256]
    meta = body.get("metadata")
    if isinstance(meta, dict):
        for k in ("session_id", "user_id"):
            if isinstance(meta.get(k), str) and meta[k]:
                return meta[k][:256]
    if isinstance(body.get("user"), str) and body["user"]:
        return body["user"][:256]
    return None


def _conversation(kind: str, body: dict) -> list | None:
    """The request's messages in chat form (for the session chain and a line without ids)."""
    msgs = body.get("messages")
    out: list = []
    if kind == "messages" and body.get("system") is not None:
        out.append({"role": "system", "content": body["system"]})
    if isinstance(msgs, list):
        out.extend(m for m in msgs if isinstance(m, dict))
        return out
    if kind == "responses":
        if body.get("instructions") is not None:
            out.append({"role": "system", "content": body["instructions"]})
        inp = body.get("input")
        if isinstance(inp, str):
            out.append({"role": "user", "content": inp})
        elif isinstance(inp, list):
            out.extend(m for m in inp if isinstance(m, dict))
        return out
    if kind in ("completions", "llama") and isinstance(body.get("prompt"), str):
        return [{"role": "user", "content": body["prompt"]}]
    return None


_FINISH = {"stop": "stop", "end_turn": "stop", "stop_sequence": "stop", "tool_calls": "stop", "tool_use": "stop",
           "eos": "stop", "word": "stop", "length": "length", "max_tokens": "length", "limit": "length",
           "error": "error", "cancelled": "cancelled", "abort": "cancelled"}


class Recorder:
    """Builds and writes the line of each call; the session chain for calls that name no session."""

    def __init__(self, config: ProxyConfig, upstream: Upstream, writer):
        from strata_lab.traces.log_calls import SessionChain

        self.config, self.upstream, self.writer = config, upstream, writer
        self.chain = SessionChain("proxy")
        self.lines = 0
        self.failed = 0

    def write(self, *, plan, cap: Capture, body: dict, headers, status: int, t0: float, t_first: float | None,
              t_end: float, cancelled: bool, prompt_ids=None, gen_ids=None, notes=()) -> None:
        try:
            self._write(plan=plan, cap=cap, body=body, headers=headers, status=status, t0=t0, t_first=t_first,
                        t_end=t_end, cancelled=cancelled, prompt_ids=prompt_ids, gen_ids=gen_ids, notes=notes)
        except Exception as exc:  # noqa: BLE001 - recording never breaks the service
            self.failed += 1
            print(f"strata-lab proxy: a call was not recorded ({type(exc).__name__}: {exc})", file=sys.stderr,
                  flush=True)

    def _write(self, *, plan, cap, body, headers, status, t0, t_first, t_end, cancelled, prompt_ids, gen_ids,
               notes) -> None:
        prompt = prompt_ids if prompt_ids is not None else cap.prompt_ids
        gen = gen_ids if gen_ids is not None else cap.generated()
        have_ids = prompt is not None
        trace_notes = list(plan.notes) + list(notes)
        if status >= 400 or cap.error is not None:
            finish = "error"
        elif cancelled:
            finish = "cancelled"
        else:
            finish = _FINISH.get(cap.finish or "", "stop" if cap.finish is None else "stop")
        messages = _conversation(plan.kind, body)
        reply_text = "".join(cap.text)[:MAX_TEXT]
        session = _session(headers, body)
        if session is None:
            if have_ids and prompt:
                session = self.chain.session_of_ids(prompt, gen or [])
            elif messages:
                session = self.chain.session_of_messages(messages, {"role": "assistant", "content": reply_text})
            else:
                session = "proxy-0"
        rec: dict[str, Any] = {"schema": "strata-dump/1", "ts": t0, "done_ts": max(t_end, t0),
                               "request_id": uuid.uuid4().hex, "session": session, "call": 0,
                               "prompt_ids": list(prompt or []), "gen_ids": list(gen or []), "drained_ids": [],
                               "finish": finish}
        tm = cap.timings
        if isinstance(tm.get("prompt_ms"), (int, float)) and isinstance(tm.get("predicted_ms"), (int, float)):
            rec["timings"] = {"prefill_ms": float(tm["prompt_ms"]), "decode_ms": float(tm["predicted_ms"])}
        else:  # the proxy's own view: time to the first answer byte, then the rest
            first = t_first if t_first is not None else t_end
            rec["timings"] = {"prefill_ms": round((first - t0) * 1000.0, 3),
                              "decode_ms": round(max(0.0, t_end - first) * 1000.0, 3)}
        rec["checkpoints"] = []
        rec["model"] = cap.model or (body.get("model") if isinstance(body.get("model"), str) else None) or \
            self.upstream.model or "unknown"
        rec.update(cap.reported())
        rec["cache_engine"] = self.upstream.engine
        rec["fidelity"] = "ids" if have_ids and gen is not None else "messages"
        if have_ids and gen is None:
            trace_notes.append("the reply's ids were not returned: gen_ids empty")
        if not have_ids:
            trace_notes.append("the engine returned no prompt ids: prompt_ids empty, the request's messages kept")
            if messages is not None:
                text = json.dumps(messages, ensure_ascii=False)
                if len(text) <= self.config.max_record_messages:
                    rec["messages"] = messages
                    if isinstance(body.get("tools"), list):
                        rec["tools"] = body["tools"]
                else:
                    trace_notes.append(f"messages over {self.config.max_record_messages} characters: not kept")
            rec["reply_text"] = reply_text
        if cap.choices > 1:
            trace_notes.append(f"{cap.choices} choices: the line records choice 0")
        rec["source"] = "proxy"
        rec["route"] = plan.kind
        rec["stream"] = plan.stream
        rec["status"] = status
        rec["upstream"] = self.upstream.identity()
        if cap.upstream_id:
            rec["upstream_id"] = cap.upstream_id[:200]
        rec["proxy_timings"] = {"first_byte_ms": None if t_first is None else round((t_first - t0) * 1000.0, 3),
                                "total_ms": round((t_end - t0) * 1000.0, 3)}
        if cap.error is not None:
            rec["error"] = cap.error
        if trace_notes:
            rec["trace_notes"] = trace_notes
        self.writer.write(rec)
        self.lines += 1


def create_app(config: ProxyConfig, upstream: Upstream, writer, *, client=None):
    """The ASGI app. `writer`: a strata_lab.dump.writer Recorder (or StoreRecorder); `client`: an
    httpx.AsyncClient (default: one made here, closed at shutdown)."""
    import contextlib

    import anyio
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    base = config.upstream.rstrip("/")
    own_client = client is None
    if client is None:
        client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout, connect=10.0),
                                   limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
    profile = PROFILES[upstream.engine]
    rec = Recorder(config, upstream, writer)

    def error(status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": code, "code": status}}, status_code=status)

    async def read_body(request) -> bytes | None:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > config.max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def out_headers(h: httpx.Headers, *, decoded: bool) -> list[tuple[bytes, bytes]]:
        drop = HOP_BY_HOP | ({"content-encoding"} if decoded else frozenset())
        return [(k, v) for k, v in h.raw if k.decode("latin-1").lower() not in drop]

    async def tokenize(text: str, headers: dict, *, special: bool) -> list | None:
        """The upstream's own ids for a text (llama.cpp /tokenize)."""
        try:
            r = await client.post(base + "/tokenize", json={"content": text, "add_special": special,
                                                            "parse_special": True}, headers=headers)
            ids = r.json().get("tokens") if r.status_code == 200 else None
        except Exception:  # noqa: BLE001
            return None
        return ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None

    async def engine_ids(plan, body: dict, cap: Capture, headers: dict):
        """llama.cpp: prompt ids the proxy asks the upstream for (its template and tokenizer); (prompt, gen, notes)."""
        if not profile.tokenize or cap.error is not None:
            return None, None, ()
        auth = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key")}
        if plan.kind == "llama":
            p = body.get("prompt")
            if isinstance(p, list) and all(isinstance(i, int) for i in p):
                return list(p), None, ()
            if isinstance(p, str):
                return await tokenize(p, auth, special=True), None, ("prompt ids: the upstream's /tokenize",)
            return None, None, ()
        if plan.kind == "chat":
            try:
                r = await client.post(base + "/apply-template", json={k: body[k] for k in
                                      ("messages", "tools", "chat_template_kwargs") if k in body}, headers=auth)
                text = r.json().get("prompt") if r.status_code == 200 else None
            except Exception:  # noqa: BLE001
                text = None
            if not isinstance(text, str):
                return None, None, ("/apply-template failed: no prompt ids",)
            prompt = await tokenize(text, auth, special=True)
            gen = await tokenize("".join(cap.text), auth, special=False)
            return prompt, gen, ("prompt ids: the upstream's /apply-template + /tokenize; reply ids: its text "
                                 "tokenized",)
        return None, None, ()

    async def handle(request):
        t0 = time.time()
        raw = await read_body(request)
        if raw is None:
            return error(413, f"the request body is over the proxy's limit of {config.max_body} bytes",
                         "request_too_large")
        path = request.url.path
        kind = ROUTES.get(path) if request.method == "POST" else None
        body: Any = None
        plan = None
        send_raw = raw
        if kind is not None:
            try:
                body = _loads(raw) if raw else None
            except ValueError:
                body = None
            fwd, plan = plan_request(profile, path, body)
            if fwd is not body:
                send_raw = json.dumps(fwd, ensure_ascii=False, separators=(",", ":")).encode()
            if not isinstance(body, dict):
                plan = None  # not a JSON object: passed on as it is, nothing to record
        headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP]
        if plan is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"] + \
                [(b"accept-encoding", b"identity")]
        url = base + path + (("?" + request.url.query) if request.url.query else "")
        req = client.build_request(request.method, url, headers=headers, content=send_raw)
        try:
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as exc:
            if plan is not None:
                cap = Capture(plan.kind)
                cap.error = f"upstream unreachable: {type(exc).__name__}"
                rec.write(plan=plan, cap=cap, body=body, headers=request.headers, status=502, t0=t0, t_first=None,
                          t_end=time.time(), cancelled=False)
            return error(502, f"the upstream did not answer ({type(exc).__name__})", "bad_gateway")
        if plan is None:
            return _Raw(resp, out_headers(resp.headers, decoded=False))
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" in ctype:
            return _Stream(resp, out_headers(resp.headers, decoded=True), plan, body, request.headers, t0)
        return await whole(resp, plan, body, request.headers, t0)

    async def whole(resp, plan, body, req_headers, t0):
        cap = Capture(plan.kind)
        chunks, n, t_first, over = [], 0, None, False
        try:
            async for chunk in resp.aiter_bytes():
                if t_first is None:
                    t_first = time.time()
                n += len(chunk)
                chunks.append(chunk)
                if n > config.max_answer:
                    over = True
                    break
        except httpx.HTTPError as exc:
            await resp.aclose()
            cap.error = f"upstream answer cut: {type(exc).__name__}"
            rec.write(plan=plan, cap=cap, body=body, headers=req_headers, status=502, t0=t0, t_first=t_first,
                      t_end=time.time(), cancelled=False)
            return error(502, "the upstream's answer was cut short", "bad_gateway")
        if over:  # too large to hold: pass the rest on as it comes, unrecorded beyond a note
            cap.error = f"answer over {config.max_answer} bytes: not read"
            rec.write(plan=plan, cap=cap, body=body, headers=req_headers, status=resp.status_code, t0=t0,
                      t_first=t_first, t_end=time.time(), cancelled=False)

            async def rest():
                try:
                    for c in chunks:
                        yield c
                    async for c in resp.aiter_bytes():
                        yield c
                finally:
                    await resp.aclose()
            return _Gen(rest(), resp.status_code, out_headers(resp.headers, decoded=True))
        await resp.aclose()
        data = b"".join(chunks)
        t_end = time.time()
        obj = None
        if resp.headers.get("content-type", "").startswith("application/json") or data[:1] in (b"{", b"["):
            try:
                obj = _loads(data)
            except ValueError:
                obj = None
        if isinstance(obj, list) and plan.kind == "llama":   # a batch of prompts: the first one is recorded
            cap.feed(obj[0] if obj else None)
        else:
            cap.feed(obj)
        if obj is None and resp.status_code < 400:
            cap.error = "the upstream's answer is not JSON"
        elif resp.status_code >= 400 and cap.error is None:
            cap.error = f"HTTP {resp.status_code}: {data[:300].decode('utf-8', 'replace')}"
        if resp.status_code < 400 and obj is not None:
            data = strip(data, plan)
        notes = []
        prompt_ids = gen_ids = None
        if resp.status_code < 400 and cap.prompt_ids is None:
            prompt_ids, gen_ids, notes = await engine_ids(plan, body, cap, dict(req_headers))
        rec.write(plan=plan, cap=cap, body=body, headers=req_headers, status=resp.status_code, t0=t0,
                  t_first=t_first, t_end=t_end, cancelled=False, prompt_ids=prompt_ids, gen_ids=gen_ids,
                  notes=notes)
        return _Bytes(data, resp.status_code, out_headers(resp.headers, decoded=True))

    class _Raw:
        """An unrecorded answer, passed on as it comes (compressed bytes stay compressed)."""

        def __init__(self, resp, headers):
            self.resp, self.headers = resp, headers

        async def __call__(self, scope, receive, send):
            try:
                await send({"type": "http.response.start", "status": self.resp.status_code,
                            "headers": self.headers})
                async for chunk in self.resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except (OSError, httpx.HTTPError):
                pass
            finally:
                with anyio.CancelScope(shield=True):
                    await self.resp.aclose()

    class _Bytes:
        def __init__(self, data, status, headers):
            self.data, self.status = data, status
            self.headers = headers + [(b"content-length", str(len(data)).encode())]

        async def __call__(self, scope, receive, send):
            await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
            await send({"type": "http.response.body", "body": self.data, "more_body": False})

    class _Gen:
        def __init__(self, gen, status, headers):
            self.gen, self.status, self.headers = gen, status, headers

        async def __call__(self, scope, receive, send):
            await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
            async for chunk in self.gen:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    class _Stream:
        """A streamed answer: each SSE event goes on once complete (ids stripped), a client that leaves closes
        the upstream request; the call's line is written when the stream ends, however it ends."""

        def __init__(self, resp, headers, plan, body, req_headers, t0):
            self.resp, self.headers, self.plan, self.body = resp, headers, plan, body
            self.req_headers, self.t0 = req_headers, t0
            self.cap = Capture(plan.kind)
            self.t_first = None

        def event(self, ev: bytes) -> bytes | None:
            """One SSE event (its bytes, blank line included): read, stripped; None: dropped."""
            data_lines = [ln[5:].lstrip(b" ") for ln in ev.splitlines() if ln.startswith(b"data:")]
            if not data_lines:
                return ev
            payload = b"\n".join(data_lines)
            if payload.strip() == b"[DONE]":
                return ev
            try:
                obj = _loads(payload)
            except ValueError:
                return ev
            self.cap.feed(obj)
            if self.plan.drop_usage_chunk and isinstance(obj, dict) and obj.get("choices") == [] and \
                    isinstance(obj.get("usage"), dict):
                return None
            return strip(ev, self.plan) if self.plan.keys and b'token' in ev else ev

        async def __call__(self, scope, receive, send):
            cancelled = True
            status = self.resp.status_code
            gone = anyio.Event()

            async def watch():
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        gone.set()
                        tg.cancel_scope.cancel()
                        return

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch)
                    await send({"type": "http.response.start", "status": status, "headers": self.headers})
                    buf = b""
                    async for chunk in self.resp.aiter_bytes():
                        if self.t_first is None:
                            self.t_first = time.time()
                        buf += chunk
                        out = []
                        while True:
                            cut = _event_end(buf)
                            if cut < 0:
                                break
                            ev, buf = buf[:cut], buf[cut:]
                            kept = self.event(ev)
                            if kept is not None:
                                out.append(kept)
                        if len(buf) > MAX_EVENT:  # a runaway event: passed on unread
                            out.append(buf)
                            buf = b""
                        if out:
                            await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                    if buf:
                        kept = self.event(buf)
                        if kept:
                            await send({"type": "http.response.body", "body": kept, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    cancelled = False
                    tg.cancel_scope.cancel()
            except (OSError, httpx.HTTPError) as exc:
                if not gone.is_set():
                    self.cap.error = self.cap.error or f"stream cut: {type(exc).__name__}"
            finally:
                cancelled = cancelled and (gone.is_set() or self.cap.error is None)
                with anyio.CancelScope(shield=True):
                    await self.resp.aclose()
                    t_end = time.time()
                    prompt_ids = gen_ids = None
                    notes = ()
                    if not cancelled and status < 400 and self.cap.prompt_ids is None:
                        prompt_ids, gen_ids, notes = await engine_ids(self.plan, self.body, self.cap,
                                                                      dict(self.req_headers))
                    if status >= 400 and self.cap.error is None:
                        self.cap.error = f"HTTP {status}"
                    rec.write(plan=self.plan, cap=self.cap, body=self.body, headers=self.req_headers,
                              status=status, t0=self.t0, t_first=self.t_first, t_end=t_end, cancelled=cancelled,
                              prompt_ids=prompt_ids, gen_ids=gen_ids, notes=notes)

    async def app_route(request):
        try:
            return await handle(request)
        except ClientDisconnect:
            return Response(status_code=499)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            if own_client:
                await client.aclose()
            writer.close()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    app = Starlette(routes=[Route("/{path:path}", app_route, methods=methods)], lifespan=lifespan)
    app.state.recorder = rec
    return app


def _event_end(buf: bytes) -> int:
    """The end (exclusive) of the first whole SSE event in `buf` (its blank line included), else -1."""
    cuts = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buf.find(sep)) >= 0]
    return min(cuts) if cuts else -1

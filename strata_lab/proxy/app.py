"""The recording proxy's ASGI app: every request goes to `--upstream` as it came; the calls of the LLM routes
(engines.ROUTES) are recorded, one strata-dump/1 line each, with the engine's own ids where it can return them.

Per call: the body is read (at most `max_body` bytes), the engine's id options are added (engines.plan_request;
put into the client's bytes before the closing brace, the rest untouched), the request is sent on with the
client's headers (hop-by-hop ones aside; `accept-encoding: identity` on the recorded routes, so the proxy can
read the answer), and the answer comes back with the upstream's status and headers. A streamed answer goes on
as it arrives: each upstream read at once where nothing is edited, else the whole SSE events of each read in one
piece (an event is held only until its blank line), and is parsed for the line after it went on. A whole
answer is read, then sent; its line is written after. The keys the added options brought are taken out again,
byte for byte (engines.strip). Upstream errors pass through untouched and are recorded as errors; a client that
leaves mid-stream closes the upstream request and the line records what was seen (finish `cancelled`). Nothing
about the request's headers is written: API keys pass through and are never recorded.

The app is a plain ASGI callable and its client (proxy.client) a small HTTP/1.1 one: on loopback the proxy's
cost per call is mostly the Python it runs, so neither a web framework nor a general-purpose HTTP client is on
the hot path (benchmarks/proxy.py).

Why one module: the request plan, the forwarding and the recording of one call share its state (the
body, the added id options, the stream being seen); apart, that state would travel through every call.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
import random as _random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from strata_lab.proxy.engines import PROFILES, ROUTES, Capture, plan_request, strip

try:
    import orjson as _orjson

    _loads, _dumps = _orjson.loads, _orjson.dumps
except ImportError:  # pragma: no cover - orjson is a core dependency
    _loads = json.loads

    def _dumps(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

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


def _request_id() -> str:
    """A random 128-bit id in hex (uuid4's form; from `random`, not os.urandom, which costs a system call)."""
    return f"{_random.getrandbits(128):032x}"


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
                               "request_id": _request_id(), "session": session, "call": 0,
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


def _json_error(status: int, message: str, code: str) -> tuple[int, list, bytes]:
    body = json.dumps({"error": {"message": message, "type": code, "code": status}}).encode()
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


def _forward_body(raw: bytes, body: Any, fwd: Any) -> bytes:
    """The bytes to send on: the client's own, with the keys the plan added put before the closing brace (the
    rest untouched); re-serialised only where an added key was already there with another value."""
    if fwd is body:
        return raw
    added = [k for k in fwd if k not in body]
    if len(added) == len(fwd) - len(body) and all(fwd[k] is body[k] for k in body):
        end = len(raw.rstrip())
        if end and raw[end - 1:end] == b"}":
            extra = b",".join(_dumps(k) + b":" + _dumps(fwd[k]) for k in added)
            return raw[:end - 1] + (b"," if body else b"") + extra + raw[end - 1:]
    return _dumps(fwd)


def _events(ready: bytes) -> list[bytes]:
    """The SSE events in `ready` (whole events only), each with its blank line."""
    if b"\r" not in ready:
        parts = ready.split(b"\n\n")
        out = [p + b"\n\n" for p in parts[:-1]]
        if parts[-1]:
            out.append(parts[-1])
        return out
    out = []
    while ready:
        cut = _event_end(ready)
        if cut < 0:
            out.append(ready)
            break
        out.append(ready[:cut])
        ready = ready[cut:]
    return out


def _event_obj(ev: bytes) -> Any:
    """One SSE event's data, parsed (None: no data, [DONE], not JSON)."""
    if ev.startswith(b"data:") and b"\ndata:" not in ev and b"\rdata:" not in ev:
        payload = ev[5:]
    else:
        lines = [ln[5:] for ln in ev.splitlines() if ln.startswith(b"data:")]
        if not lines:
            return None
        payload = b"\n".join(ln[1:] if ln[:1] == b" " else ln for ln in lines)
    payload = payload.strip()
    if not payload or payload == b"[DONE]":
        return None
    try:
        return _loads(payload)
    except ValueError:
        return None


_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def create_app(config: ProxyConfig, upstream: Upstream, writer, *, client=None):
    """The ASGI app (a plain ASGI callable: the proxy's hot path has no framework in it). `writer`: a
    strata_lab.dump.writer Recorder (or StoreRecorder); `client`: an UpstreamClient (default: one made here for
    `config.upstream`, closed at shutdown)."""
    from strata_lab.proxy.client import UpstreamClient, UpstreamError

    own_client = client is None
    if client is None:
        client = UpstreamClient(config.upstream, timeout=config.timeout, connect_timeout=10.0)
    profile = PROFILES[upstream.engine]
    rec = Recorder(config, upstream, writer)

    async def respond(send, status: int, headers: list, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def out_headers(resp, *, length: bool) -> list:
        drop = _HOP_KEEP_LENGTH if length else HOP_BY_HOP_B
        return [(k, v) for k, v in resp.headers if k.lower() not in drop]

    async def post_json(path: bytes, obj: dict, auth: list):
        """A JSON POST of the proxy's own to the upstream (llama.cpp's /tokenize, /apply-template)."""
        try:
            resp = await client.request("POST", path, [(b"content-type", b"application/json")] + auth,
                                        _dumps(obj))
            try:
                pieces, over = await resp.read(config.max_answer)
            finally:
                await resp.aclose()
            return _loads(b"".join(pieces)) if resp.status == 200 and not over else None
        except (UpstreamError, ValueError):
            return None

    async def tokenize(text: str, auth: list, *, special: bool) -> list | None:
        """The upstream's own ids for a text (llama.cpp /tokenize)."""
        out = await post_json(b"/tokenize", {"content": text, "add_special": special, "parse_special": True}, auth)
        ids = out.get("tokens") if isinstance(out, dict) else None
        return ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None

    async def engine_ids(plan, body: dict, cap: Capture, auth: list):
        """llama.cpp: prompt ids the proxy asks the upstream for (its template and tokenizer); (prompt, gen, notes)."""
        if not profile.tokenize or cap.error is not None:
            return None, None, ()
        if plan.kind == "llama":
            p = body.get("prompt")
            if isinstance(p, list) and all(isinstance(i, int) for i in p):
                return list(p), None, ()
            if isinstance(p, str):
                return await tokenize(p, auth, special=True), None, ("prompt ids: the upstream's /tokenize",)
            return None, None, ()
        if plan.kind == "chat":
            out = await post_json(b"/apply-template", {k: body[k] for k in ("messages", "tools", "chat_template_kwargs")
                                                       if k in body}, auth)
            text = out.get("prompt") if isinstance(out, dict) else None
            if not isinstance(text, str):
                return None, None, ("/apply-template failed: no prompt ids",)
            prompt = await tokenize(text, auth, special=True)
            gen = await tokenize("".join(cap.text), auth, special=False)
            return prompt, gen, ("prompt ids: the upstream's /apply-template + /tokenize; reply ids: its text "
                                 "tokenized",)
        return None, None, ()

    async def app(scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            return await handle(scope, receive, send)
        if kind == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    if own_client:
                        await client.aclose()
                    writer.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if kind == "websocket":   # not an LLM route: refused plainly
            await receive()
            await send({"type": "websocket.close", "code": 1003})

    async def handle(scope, receive, send):
        t0 = time.time()
        chunks, n = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return                           # the client left before its request was whole
            chunk = msg.get("body", b"")
            if chunk:
                n += len(chunk)
                if n > config.max_body:
                    return await respond(send, *_json_error(
                        413, f"the request body is over the proxy's limit of {config.max_body} bytes",
                        "request_too_large"))
                chunks.append(chunk)
            if not msg.get("more_body"):
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        path, method = scope["path"], scope["method"]
        route = ROUTES.get(path) if method == "POST" else None
        body: Any = None
        plan = None
        send_raw = raw
        if route is not None:
            try:
                body = _loads(raw) if raw else None
            except ValueError:
                body = None
            fwd, plan = plan_request(profile, path, body)
            if not isinstance(body, dict):
                plan = None  # not a JSON object: passed on as it is, nothing to record
            else:
                send_raw = _forward_body(raw, body, fwd)
        req_headers = scope["headers"]
        if plan is None:
            headers = [(k, v) for k, v in req_headers if k not in HOP_BY_HOP_B]
        else:
            headers = [(k, v) for k, v in req_headers if k not in HOP_BY_HOP_B and k != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        target = scope.get("raw_path") or path.encode()
        if scope.get("query_string"):
            target = target + b"?" + scope["query_string"]
        try:
            resp = await client.request(method, target, headers, send_raw)
        except UpstreamError as exc:
            if plan is not None:
                cap = Capture(plan.kind)
                cap.error = f"upstream unreachable: {exc.kind}"
                rec.write(plan=plan, cap=cap, body=body, headers=_hdict(req_headers), status=502, t0=t0,
                          t_first=None, t_end=time.time(), cancelled=False)
            return await respond(send, *_json_error(502, f"the upstream did not answer ({exc.kind})", "bad_gateway"))
        if plan is None:
            return await passthrough(resp, send, out_headers(resp, length=method != "HEAD"))
        encoding = resp.header(b"content-encoding")
        if encoding and encoding != "identity":   # asked for identity, got a compressed answer: not read
            cap = Capture(plan.kind)
            cap.error = f"answer compressed ({encoding}): not read"
            rec.write(plan=plan, cap=cap, body=body, headers=_hdict(req_headers), status=resp.status, t0=t0,
                      t_first=None, t_end=time.time(), cancelled=False)
            return await passthrough(resp, send, out_headers(resp, length=True))
        if "text/event-stream" in resp.header(b"content-type"):
            return await stream(resp, send, receive, plan, body, req_headers, t0)
        return await whole(resp, send, plan, body, req_headers, t0)

    async def passthrough(resp, send, headers, first=()):
        """An answer passed on as it comes (an unrecorded route; compressed bytes stay compressed)."""
        try:
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            for data in first:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            async for data in resp.chunks():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass
        finally:
            await resp.aclose()

    async def whole(resp, send, plan, body, req_headers, t0):
        cap = Capture(plan.kind)
        hdict = _hdict(req_headers)
        t_first = None
        try:
            pieces, over = await resp.read(config.max_answer)
            t_first = time.time()   # the head and body of a whole answer: first byte ~ last for the proxy
        except UpstreamError as exc:
            await resp.aclose()
            cap.error = f"upstream answer cut: {exc.kind}"
            rec.write(plan=plan, cap=cap, body=body, headers=hdict, status=502, t0=t0, t_first=t_first,
                      t_end=time.time(), cancelled=False)
            return await respond(send, *_json_error(502, "the upstream's answer was cut short", "bad_gateway"))
        except BaseException:
            await resp.aclose()
            raise
        if over:  # too large to hold: pass the rest on as it comes, unrecorded beyond a note
            cap.error = f"answer over {config.max_answer} bytes: not read"
            rec.write(plan=plan, cap=cap, body=body, headers=hdict, status=resp.status, t0=t0,
                      t_first=t_first, t_end=time.time(), cancelled=False)
            return await passthrough(resp, send, out_headers(resp, length=False), pieces)
        await resp.aclose()
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        t_end = time.time()
        status = resp.status
        obj = None
        if resp.header(b"content-type").startswith("application/json") or data[:1] in (b"{", b"["):
            try:
                obj = _loads(data)
            except ValueError:
                obj = None
        if isinstance(obj, list) and plan.kind == "llama":   # a batch of prompts: the first one is recorded
            cap.feed(obj[0] if obj else None)
        else:
            cap.feed(obj)
        if obj is None and status < 400:
            cap.error = "the upstream's answer is not JSON"
        elif status >= 400 and cap.error is None:
            cap.error = f"HTTP {status}: {data[:300].decode('utf-8', 'replace')}"
        if status < 400 and obj is not None:
            data = strip(data, plan)
        headers = out_headers(resp, length=False)
        headers.append((b"content-length", str(len(data)).encode()))
        await respond(send, status, headers, data)     # the client has its answer; then the line
        notes = []
        prompt_ids = gen_ids = None
        if status < 400 and cap.prompt_ids is None:
            prompt_ids, gen_ids, notes = await engine_ids(plan, body, cap, _auth(req_headers))
        rec.write(plan=plan, cap=cap, body=body, headers=hdict, status=status, t0=t0, t_first=t_first,
                  t_end=t_end, cancelled=False, prompt_ids=prompt_ids, gen_ids=gen_ids, notes=notes)

    async def stream(resp, send, receive, plan, body, req_headers, t0):
        """A streamed answer. Without edits each upstream read goes on as it came, before it is parsed; with
        edits (the added ids taken out, the added usage chunk dropped) the whole events of each read go on at
        once, edited in one pass. A client that leaves closes the upstream request; the line is written when
        the stream ends, however it ends."""
        cap = Capture(plan.kind)
        status = resp.status
        edit = bool(plan.keys) or plan.drop_usage_chunk
        state = {"gone": False, "first": None, "done": False}

        async def watch():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not state["done"]:
                        state["gone"] = True
                        resp.abort("client gone")
                    return

        watcher = asyncio.ensure_future(watch())
        cancelled = True

        async def ship(ready: bytes) -> None:
            """Whole events: edited and sent (edit), then fed to the capture."""
            events = None
            if plan.drop_usage_chunk and b'"usage"' in ready and _EMPTY_CHOICES.search(ready):
                kept = []
                for ev in _events(ready):
                    obj = _event_obj(ev)
                    cap.feed(obj)
                    if not (isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)):
                        kept.append(ev)
                ready = b"".join(kept)
            else:
                events = ready
            if edit:
                if plan.keys:
                    ready = strip(ready, plan)
                if ready:
                    await send({"type": "http.response.body", "body": ready, "more_body": True})
            if events is not None:
                for ev in _events(events):
                    cap.feed(_event_obj(ev))

        try:
            await send({"type": "http.response.start", "status": status, "headers": out_headers(resp, length=False)})
            buf = b""
            async for data in resp.chunks():
                if state["first"] is None:
                    state["first"] = time.time()
                if not edit:   # the bytes go on as they came, before anything is read from them
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                buf = buf + data if buf else data
                cut = _last_event_end(buf)
                if cut < 0:
                    if len(buf) > MAX_EVENT:  # a runaway event: passed on unread
                        if edit:
                            await send({"type": "http.response.body", "body": buf, "more_body": True})
                        buf = b""
                    continue
                ready, buf = (buf, b"") if cut == len(buf) else (buf[:cut], buf[cut:])
                await ship(ready)
            if buf:
                await ship(buf)
            state["done"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            cancelled = False
        except (UpstreamError, OSError) as exc:
            if not state["gone"]:
                cap.error = cap.error or f"stream cut: {getattr(exc, 'kind', type(exc).__name__)}"
        finally:
            watcher.cancel()
            await resp.aclose()
            cancelled = cancelled and (state["gone"] or cap.error is None)
            t_end = time.time()
            prompt_ids = gen_ids = None
            notes = ()
            if not cancelled and status < 400 and cap.prompt_ids is None:
                prompt_ids, gen_ids, notes = await engine_ids(plan, body, cap, _auth(req_headers))
            if status >= 400 and cap.error is None:
                cap.error = f"HTTP {status}"
            rec.write(plan=plan, cap=cap, body=body, headers=_hdict(req_headers), status=status, t0=t0,
                      t_first=state["first"], t_end=t_end, cancelled=cancelled, prompt_ids=prompt_ids,
                      gen_ids=gen_ids, notes=notes)

    app.recorder = rec
    app.client = client
    return app


HOP_BY_HOP_B = frozenset(k.encode() for k in HOP_BY_HOP)
_HOP_KEEP_LENGTH = HOP_BY_HOP_B - {b"content-length"}


def _hdict(raw_headers) -> dict:
    """The request's headers by lower-case name (for the session header; never written)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}


def _auth(raw_headers) -> list:
    return [(k, v) for k, v in raw_headers if k in (b"authorization", b"x-api-key")]


def _last_event_end(buf: bytes) -> int:
    """The end (exclusive) of the last whole SSE event in `buf` (its blank line included), else -1."""
    i = buf.rfind(b"\n\n")
    cut = i + 2 if i >= 0 else -1
    if b"\r" in buf:
        j, k = buf.rfind(b"\r\n\r\n"), buf.rfind(b"\r\r")
        cut = max(cut, j + 4 if j >= 0 else -1, k + 2 if k >= 0 else -1)
    return cut


def _event_end(buf: bytes) -> int:
    """The end (exclusive) of the first whole SSE event in `buf` (its blank line included), else -1."""
    cuts = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buf.find(sep)) >= 0]
    return min(cuts) if cuts else -1

"""What the proxy knows about each engine: how to ask it for its token ids, how to take them out of its answer
again, and where it reports what it served from its cache.

One `Profile` per engine (`PROFILES`). `plan_request(profile, route, body)` returns the body to forward and a
`Plan` saying what was added; `strip(raw, plan)` edits an answer's JSON bytes so that the client gets what it
would have got without the additions (the rest of the bytes untouched); `Capture.feed(obj)` reads ids, usage,
timings and text out of each answer object or stream chunk.

The options, from each engine's own source:
- vLLM (`vllm/entrypoints/openai/protocol.py`): `return_token_ids` on chat and completions. A chat answer then
  carries `prompt_token_ids` (a stream: in its first chunk) and `choices[].token_ids` (a stream: each chunk's
  new ids); a completion carries both per choice. Without the option vLLM sends the same keys as null, so they
  are set back to null. Usage in a stream only with `stream_options.include_usage` (one extra chunk with no
  choices, dropped again when the client did not ask for it); cached tokens in
  `usage.prompt_tokens_details.cached_tokens` (`--enable-prompt-tokens-details`).
- SGLang (`python/sglang/srt/entrypoints/openai/protocol.py`): chat `return_prompt_token_ids` +
  `return_token_ids` (`choices[].prompt_token_ids`, `choices[].token_ids`), completions `return_token_ids`;
  refused with streaming, so a streamed SGLang call keeps text and usage only. Without the option the keys are
  absent, so they are removed again.
- llama.cpp (`tools/server`): `/completion` with `return_tokens` fills `tokens` (an empty list without it);
  the prompt ids are the request's when it sends ids, else the server's own `/tokenize` (add_special, as the
  server tokenizes a completion prompt); chat routes: `/apply-template` + `/tokenize` give the prompt ids,
  the reply's ids are its text tokenized (fidelity of the reply: text). Cached tokens: `timings.cache_n`.
- strata (`strata-lab serve`): vLLM's `return_token_ids`, the keys absent without it.
- OpenAI, Anthropic: no ids; text and usage (`cached_tokens`, `cache_read_input_tokens`,
  `cache_creation_input_tokens`), fidelity `messages`.

>>> p = PROFILES["vllm"]
>>> body, plan = plan_request(p, "/v1/chat/completions", {"messages": [], "stream": False})
>>> body["return_token_ids"], plan.keys
(True, ('prompt_token_ids', 'token_ids'))
>>> strip(b'{"id":"x","prompt_token_ids":[1,2],"choices":[{"text":"a","token_ids":[3]}]}', plan)
b'{"id":"x","prompt_token_ids":null,"choices":[{"text":"a","token_ids":null}]}'
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Profile", "PROFILES", "ENGINE_NAMES", "ROUTES", "Plan", "plan_request", "strip", "Capture",
           "detect_engine"]

# the routes whose calls are recorded (any other path is passed through and not recorded)
ROUTES = {"/v1/chat/completions": "chat", "/chat/completions": "chat", "/v1/completions": "completions",
          "/completions": "completions", "/v1/responses": "responses", "/responses": "responses",
          "/v1/messages": "messages", "/completion": "llama"}


@dataclass(frozen=True)
class Profile:
    name: str                       # the dump's cache_engine
    ids: dict                       # route kind -> (options to set, response keys they add) when not streamed
    stream_ids: dict                # the same for streamed calls
    absent: str                     # what the keys hold without the option: "null", "drop" (key absent), "empty"
    include_usage: bool = True      # a stream's usage needs stream_options.include_usage (OpenAI dialect)
    tokenize: bool = False          # prompt ids by the upstream's /tokenize (+ /apply-template for chat)


_VLLM_IDS = {"chat": ({"return_token_ids": True}, ("prompt_token_ids", "token_ids")),
             "completions": ({"return_token_ids": True}, ("prompt_token_ids", "token_ids"))}
PROFILES: dict[str, Profile] = {
    "vllm": Profile("vllm", _VLLM_IDS, _VLLM_IDS, "null"),
    "strata": Profile("strata", _VLLM_IDS, _VLLM_IDS, "drop"),
    "sglang": Profile("sglang", {"chat": ({"return_prompt_token_ids": True, "return_token_ids": True},
                                          ("prompt_token_ids", "token_ids")),
                                 "completions": ({"return_token_ids": True}, ("prompt_token_ids", "token_ids"))},
                      {}, "drop"),
    "llama.cpp": Profile("llama.cpp", {"llama": ({"return_tokens": True}, ("tokens",))},
                         {"llama": ({"return_tokens": True}, ("tokens",))}, "empty", tokenize=True),
    "openai": Profile("openai", {}, {}, "drop"),
    "anthropic": Profile("anthropic", {}, {}, "drop", include_usage=False),
}
ENGINE_NAMES = ("vllm", "sglang", "llama.cpp", "openai", "anthropic", "strata")


@dataclass
class Plan:
    """What the proxy added to one request, so the answer can be given back without it."""

    kind: str | None                # route kind (ROUTES), None: not recorded
    stream: bool = False
    keys: tuple = ()                # response keys the added options bring (stripped again)
    absent: str = "drop"
    drop_usage_chunk: bool = False  # stream_options.include_usage was added: drop the usage-only chunk
    notes: list = field(default_factory=list)


def plan_request(profile: Profile, path: str, body: Any) -> tuple[Any, Plan]:
    """The body to forward (a copy when changed) and what was added to it."""
    kind = ROUTES.get(path)
    if kind is None or not isinstance(body, dict):
        return body, Plan(None)
    stream = body.get("stream") is True
    plan = Plan(kind, stream=stream, absent=profile.absent)
    options, keys = (profile.stream_ids if stream else profile.ids).get(kind, ({}, ()))
    out = body
    wanted = [k for k, v in options.items() if body.get(k) != v]
    if options and not wanted:
        plan.notes.append("the client asked for the ids itself")   # nothing added, nothing stripped
    elif wanted:
        out = dict(body)
        out.update({k: options[k] for k in wanted})
        # only what the additions bring is stripped: a key the client asked for stays
        asked = {k for k in options if k not in wanted}
        plan.keys = tuple(k for k in keys if not (asked and _brought_by(k, asked)))
    if stream and profile.include_usage and kind in ("chat", "completions"):
        opts = body.get("stream_options")
        if not (isinstance(opts, dict) and opts.get("include_usage") is True):
            if opts is None or isinstance(opts, dict):
                out = dict(out) if out is body else out
                out["stream_options"] = {**(opts or {}), "include_usage": True}
                plan.drop_usage_chunk = True
    return out, plan


def _brought_by(key: str, asked: set) -> bool:
    return (key == "prompt_token_ids" and "return_prompt_token_ids" in asked) or \
        (key == "token_ids" and "return_token_ids" in asked)


_KEYS: dict = {}      # plan.keys -> (the keys with a list of ints for value, a pattern; each key quoted, in bytes)
_SEP = frozenset(b"{,\t\n\r ")          # what may come before a key of an object
_SEP_DROP = frozenset(b"{\t\n\r ")


def _key_pattern(keys: tuple) -> tuple:
    found = _KEYS.get(keys)
    if found is None:
        names = "|".join(re.escape(k) for k in keys)
        # it starts with a literal quote, so the regex engine skips to candidates fast; the byte before the
        # key must be "{", "," or white space (checked in `strip`): inside a JSON string a quote has a backslash
        found = _KEYS[keys] = (re.compile(rb'(,\s*)?"(' + names.encode() + rb')"\s*:\s*\[[-0-9,\s]*\](\s*,)?'),
                               tuple(f'{k}"'.encode() for k in keys),
                               re.compile(rb'"(' + names.encode() + rb')"\s*:\s*\[[-0-9,\s]*\]'))
    return found


def strip(raw: bytes, plan: Plan) -> bytes:
    """`raw` (one JSON document, or several SSE events) with the keys the plan added set back to what the
    engine sends without them: null, [] or nothing. Every other byte stays as it was."""
    if not plan.keys:
        return raw
    pat, needles, keep_key = _key_pattern(plan.keys)
    if not any(k in raw for k in needles):
        return raw
    if plan.absent != "drop":       # the key stays, its value becomes null / []: the pieces joined once
        value = b'":null' if plan.absent == "null" else b'":[]'
        out, pos = [], 0
        for m in keep_key.finditer(raw):
            at = m.start()
            if at > 0 and raw[at - 1] in _SEP:
                out += (raw[pos:at], b'"', m.group(1), value)
                pos = m.end()
        if not out:
            return raw
        out.append(raw[pos:])
        return b"".join(out)

    def edit(m: re.Match) -> bytes:
        lead, tail = m.group(1), m.group(3) or b""
        if lead is not None:          # a key after a comma goes with that comma
            return tail
        at = m.start(2) - 1           # a first key (after "{" or white space) goes with the comma after it
        return b"" if at > 0 and raw[at - 1] in _SEP_DROP else m.group(0)

    for _ in range(len(plan.keys) + 1):   # adjacent dropped keys: one pass each
        raw, n = pat.subn(edit, raw)
        if not n:
            break
    return raw


_INT = {int}


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class Capture:
    """What one call's answer says: ids, usage, timings, text, finish; fed each answer object or chunk."""

    def __init__(self, kind: str):
        self.kind = kind
        self.prompt_ids: list | None = None
        self.gen_ids: list | None = None
        self.final_tokens: list | None = None   # llama.cpp: the final object's tokens (a stream: its parts first)
        self.text: list[str] = []
        self.usage: dict = {}
        self.timings: dict = {}
        self.model: str | None = None
        self.upstream_id: str | None = None
        self.finish: str | None = None
        self.error: str | None = None
        self.choices = 1

    def feed(self, obj: Any) -> None:
        # called once per streamed chunk: each key is looked up once, types tested exactly (JSON gives no
        # subclasses), the dialect branches entered only where their keys are there
        if type(obj) is not dict:
            return
        get = obj.get
        err = get("error")
        if err is not None and isinstance(err, (dict, str)) and "choices" not in obj:
            self.error = str(err.get("message") if isinstance(err, dict) else err)[:500]
            self.finish = "error"
        v = get("model")
        if type(v) is str:
            self.model = v
        if self.upstream_id is None and type(v := get("id")) is str:
            self.upstream_id = v
        v = get("prompt_token_ids")
        if v is not None:
            self._ids(v, prompt=True)
        v = get("usage")
        if type(v) is dict:
            self._usage(v)
        v = get("timings")
        if type(v) is dict:
            self.timings.update(v)
        kind = get("type")
        if self.kind == "messages" or (type(kind) is str and kind.startswith(("message", "content_block"))):
            self._anthropic(obj)
        if self.kind == "responses" or (type(kind) is str and kind.startswith("response.")):
            self._responses(obj)
        choices = get("choices")
        if type(choices) is list:
            if len(choices) > self.choices:
                self.choices = len(choices)
            for ch in choices:
                if type(ch) is dict and ch.get("index", 0) == 0:
                    self._choice(ch)
        if self.kind == "llama":
            self._llama(obj)

    def _ids(self, ids, *, prompt: bool = False, gen: bool = False) -> None:
        # ints only (not bools), none negative; the type test runs in C (a per-id Python test cost the proxy
        # more than the rest of a call's recording)
        if type(ids) is not list or ids and (not set(map(type, ids)) <= _INT or min(ids) < 0):
            return
        if prompt and self.prompt_ids is None:
            self.prompt_ids = list(ids)
        if gen:
            if self.gen_ids is None:
                self.gen_ids = []
            self.gen_ids.extend(ids)

    def _choice(self, ch: dict) -> None:
        get = ch.get
        v = get("prompt_token_ids")
        if v is not None:
            self._ids(v, prompt=True)
        v = get("token_ids")
        if v is not None:
            self._ids(v, gen=True)
        for part in (get("message"), get("delta")):
            if type(part) is dict:
                for k in ("reasoning_content", "content"):
                    if type(v := part.get(k)) is str:
                        self.text.append(v)
        if type(v := get("text")) is str:
            self.text.append(v)
        if type(v := get("finish_reason")) is str:
            self.finish = v

    def _llama(self, obj: dict) -> None:
        if isinstance(obj.get("content"), str):
            self.text.append(obj["content"])
        if obj.get("stop") is True:
            if isinstance(obj.get("tokens"), list) and obj["tokens"]:
                self.final_tokens = list(obj["tokens"])
            self.finish = "length" if obj.get("stop_type") == "limit" else "stop"
            for k in ("tokens_cached", "tokens_evaluated", "tokens_predicted"):
                if _int(obj.get(k)) is not None:
                    self.usage[k] = obj[k]
        else:
            self._ids(obj.get("tokens"), gen=True)

    def _anthropic(self, obj: dict) -> None:
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else obj
        if isinstance(msg.get("usage"), dict) and msg is not obj:
            self._usage(msg["usage"])
        if isinstance(msg.get("model"), str):
            self.model = msg["model"]
        if isinstance(msg.get("id"), str) and self.upstream_id is None:
            self.upstream_id = msg["id"]
        for block in msg.get("content") or [] if isinstance(msg.get("content"), list) else []:
            if isinstance(block, dict):
                for k in ("text", "thinking"):
                    if isinstance(block.get(k), str):
                        self.text.append(block[k])
        delta = obj.get("delta")
        if isinstance(delta, dict):
            for k in ("text", "thinking", "partial_json"):
                if isinstance(delta.get(k), str):
                    self.text.append(delta[k])
            if isinstance(delta.get("stop_reason"), str):
                self.finish = delta["stop_reason"]
        if isinstance(msg.get("stop_reason"), str):
            self.finish = msg["stop_reason"]

    def _responses(self, obj: dict) -> None:
        resp = obj.get("response") if isinstance(obj.get("response"), dict) else obj
        if isinstance(resp.get("usage"), dict) and resp is not obj:
            self._usage(resp["usage"])
        if isinstance(resp.get("model"), str):
            self.model = resp["model"]
        if obj.get("type") == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            self.text.append(obj["delta"])
        elif resp is obj and isinstance(resp.get("output"), list):
            for item in resp["output"]:
                for c in (item.get("content") or []) if isinstance(item, dict) else []:
                    if isinstance(c, dict) and isinstance(c.get("text"), str):
                        self.text.append(c["text"])
        if isinstance(resp.get("status"), str) and resp.get("status") in ("completed", "incomplete"):
            self.finish = "stop" if resp["status"] == "completed" else "length"

    def _usage(self, u: dict) -> None:
        for k, v in u.items():
            if _int(v) is not None:
                self.usage[k] = v
            elif isinstance(v, dict):
                for k2, v2 in v.items():
                    if _int(v2) is not None:
                        self.usage[f"{k}.{k2}"] = v2

    # --- the dump line's figures ------------------------------------------------------------------
    def reported(self) -> dict:
        """Contract 4's reported figures: cached, prompt, completion and written tokens, as the engine said."""
        u, out = self.usage, {}
        cached = next((u[k] for k in ("prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens",
                                      "cache_read_input_tokens") if k in u), None)
        if cached is None and _int(self.timings.get("cache_n")) is not None:
            cached = self.timings["cache_n"]
        if cached is None and "tokens_cached" in u:
            cached = u["tokens_cached"]
        if self.kind == "messages" or "cache_read_input_tokens" in u:   # Anthropic: input excludes the cache
            prompt = sum(u.get(k, 0) for k in ("input_tokens", "cache_read_input_tokens",
                                               "cache_creation_input_tokens")) if "input_tokens" in u else None
            completion = u.get("output_tokens")
            if "cache_creation_input_tokens" in u:
                out["reported_cache_write_tokens"] = u["cache_creation_input_tokens"]
        else:
            prompt = next((u[k] for k in ("prompt_tokens", "input_tokens", "tokens_evaluated") if k in u), None)
            if prompt is None and _int(self.timings.get("prompt_n")) is not None and cached is not None:
                prompt = self.timings["prompt_n"] + cached
            completion = next((u[k] for k in ("completion_tokens", "output_tokens", "tokens_predicted") if k in u),
                              None)
        if cached is not None:
            out["reported_cached_tokens"] = cached
        if prompt is not None:
            out["reported_prompt_tokens"] = prompt
        if completion is not None:
            out["reported_completion_tokens"] = completion
        return out

    def generated(self) -> list | None:
        if self.kind == "llama" and self.final_tokens is not None and not self.gen_ids:
            return self.final_tokens
        return self.gen_ids


def detect_engine(models: Any, version: Any, props: Any, server_info: Any, headers: dict, host: str) -> str:
    """The engine behind the upstream from what it answered (None where a probe failed): /v1/models'
    owned_by, SGLang's /get_server_info, vLLM's /version, llama.cpp's /props, the Server header, the host.

    >>> detect_engine({"data": [{"id": "m", "owned_by": "vllm"}]}, None, None, None, {}, "127.0.0.1")
    'vllm'
    >>> detect_engine(None, None, {"default_generation_settings": {}}, None, {}, "127.0.0.1")
    'llama.cpp'
    """
    owned = None
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        owned = first.get("owned_by") if isinstance(first, dict) else None
    by_owner = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "llama.cpp": "llama.cpp",
                "strata_lab": "strata", "anthropic": "anthropic", "openai": "openai", "system": "openai",
                "openai-internal": "openai"}
    if isinstance(owned, str) and owned.lower() in by_owner:
        return by_owner[owned.lower()]
    if isinstance(server_info, dict) and ("version" in server_info or "page_size" in server_info):
        return "sglang"
    if isinstance(props, dict) and "default_generation_settings" in props:
        return "strata" if "reply_reuse" in props else "llama.cpp"
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        return "vllm"
    server = str(headers.get("server", "")).lower()
    if "llama" in server:
        return "llama.cpp"
    if host.endswith("anthropic.com"):
        return "anthropic"
    return "openai"

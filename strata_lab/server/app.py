"""The HTTP layer: one route table, one error wrapper; the front door (Host, Origin, key, limits) is security.py.

Each dialect's JSON is parsed into one `ChatRequest` at the edge (request.py); everything after that is
dialect-free until the response is shaped again (dialects.py). Engine work goes through one FIFO worker
with a lane per slot (worker.py): requests on different slots run at once, their decode steps batched by
the engine; one slot serves one request at a time.

Why one module: it is the route table; every route's handler is a few lines that hand over to the
parsers, the worker and the stream shapers, and one place lists them all.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from strata_lab.server.config import ServerConfig
from strata_lab.server.body import json_body as _json_body, json_object as _json_object
from strata_lab.server.completions import logprob_entry
from strata_lab.server.cpu import LIGHT_BYTES, ClientGone, CpuPool, min_prompt_tokens
from strata_lab.server.dialects import (AnthropicStream, OpenAIStream, anthropic_response, new_id, openai_response)
from strata_lab.server.errors import RequestError, error_body
from strata_lab.server.generation import ChatRunner
from strata_lab.server.prompt import render_prompt
from strata_lab.server.request import ChatRequest, check_int, parse_anthropic, parse_openai
from strata_lab.server.slots import SlotPool, slot_names
from strata_lab.server.worker import EngineWorker

from starlette.requests import Request

__all__ = ["create_app", "load_state", "ServerState", "serve"]


@dataclass
class ServerState:
    config: ServerConfig
    tokenizer: Any
    template: Any
    runner: ChatRunner
    worker: EngineWorker
    model_name: str
    model_path: str
    started: float
    responses: Any = None        # responses.ResponseStore: /v1/responses kept for previous_response_id
    cpu: CpuPool | None = None        # CPU-heavy request work off the event loop (cpu.py)
    weights: Any = None               # WeightsWatch: the weights files as loaded (a change is refused)

    def __post_init__(self) -> None:
        if self.cpu is None:
            self.cpu = CpuPool(self.config.cpu_workers, self.config.cpu_queue, self.config.cpu_timeout)
        if getattr(self.runner, "grammars", None) is not None:
            self.cpu.after_fork.append(self.runner.grammars.after_fork)


def load_state(config: ServerConfig) -> ServerState:
    """Load tokenizer, template, engine, encoder and recorder for `config`."""
    from pathlib import Path

    from strata_lab.text.encoder import PromptEncoder
    from strata_lab.engine import Engine
    from strata_lab.rules import CheckpointPolicy
    from strata_lab.dump.writer import Recorder
    from strata_lab.recording import stop_env_recording
    from strata_lab.text.tokenizer import load_tokenizer

    from strata_lab.tiny import embedded_model

    # the dump first: a bad one fails in a moment, not after the model has loaded. The server records through
    # its own recorder (--dump, else $STRATA_PROMPT_DUMP), observing its engine; the process-wide one is off.
    stop_env_recording()
    recorder = Recorder(config.dump, on_error="count") if config.dump else Recorder.from_env(on_error="count")
    if recorder is not None:
        recorder.check_writable()  # fail fast at start-up, not after the first generation
    kwargs = {"max_context": config.max_context, "mmap": not config.no_mmap, "check_weights": config.check_weights,
              "kv_cache": config.kv_cache}
    if config.threads:
        kwargs["threads"] = config.threads
    model_path = Path(config.model) if config.model else embedded_model("hybrid")
    check_context(model_path, config.max_context)
    template = load_template(config.template)  # a bad template file fails before the model loads
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:  # the engine loads without the GIL while the tokenizer loads here
        loading = ex.submit(Engine.load, str(model_path), **kwargs)
        tokenizer = load_tokenizer("qwen3")
        encoder = PromptEncoder(tokenizer)
        engine = loading.result()
    weights = WeightsWatch(model_path)
    name = config.model_name or model_path.name
    policy = CheckpointPolicy(before_last=tokenizer.token_id("<|im_start|>")) if config.header_checkpoint else None
    names = slot_names(config.session, config.slots)
    pool = SlotPool([engine.session(n, checkpoints=policy) for n in names], names=names,
                    similarity=config.slot_similarity)
    from strata_lab.server.grammar import GrammarCompiler

    runner = ChatRunner(tokenizer=tokenizer, pool=pool, encoder=encoder,
                        max_context=config.max_context, recorder=recorder, reply_reuse=config.reply_reuse,
                        model_name=name, stop_latency=config.stop_latency, engine=engine,
                        max_tokens_default=config.max_tokens_default, default_seed=config.seed,
                        grammars=GrammarCompiler(tokenizer, engine.vocab_size, max_string=config.grammar_max_string,
                                                 max_items=config.grammar_max_items))
    return ServerState(config=config, tokenizer=tokenizer, template=template,
                       runner=runner, worker=EngineWorker(lanes=config.slots), model_name=name, model_path=str(model_path),
                       started=time.time(), weights=weights)


def check_context(model_path, max_context: int) -> None:
    """`--ctx` must fit the model: at most config.json's max_position_embeddings (a ValueError naming both)."""
    import json as _json
    from pathlib import Path

    try:
        cfg = _json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the engine's loader names what is wrong with the folder
    limit = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool) and max_context > limit > 0:
        raise ValueError(f"--ctx {max_context} is over the model's max_position_embeddings ({limit}, "
                         f"{Path(model_path) / 'config.json'})")


class WeightsWatch:
    """The model folder's weights files as loaded (size, mtime, inode). A file rewritten or truncated in place
    under a running server changes mapped pages under the engine (a truncation is a SIGBUS on the next read
    of a page that is still mapped): `check()` before each engine job refuses the request instead."""

    def __init__(self, model_path) -> None:
        import os
        from pathlib import Path

        self.files = {}
        folder = Path(model_path)
        for f in sorted(folder.glob("*.safetensors")):
            st = os.stat(f)
            self.files[str(f)] = (st.st_size, st.st_mtime_ns, st.st_ino)
        self.changed: str | None = None

    def check(self) -> None:
        import os

        if self.changed is None:
            for path, seen in self.files.items():
                try:
                    st = os.stat(path)
                    now = (st.st_size, st.st_mtime_ns, st.st_ino)
                except OSError:
                    now = None
                if now != seen:
                    self.changed = path
                    break
        if self.changed is not None:
            raise RequestError(None, f"the weights file {os.path.basename(self.changed)} changed under the running "
                               "server; restart it to load the new weights", code="weights_changed", status=503)


def load_template(spec: str):
    """`--chat-template NAME|PATH`: a preset name, else any HF template file or folder (ChatTemplate.from_file)."""
    from strata_lab.text.template import TEMPLATE_PRESETS, ChatTemplate

    return ChatTemplate.from_name(spec) if spec in TEMPLATE_PRESETS else ChatTemplate.from_file(spec)


# --- request helpers --------------------------------------------------------------------------------
def _as_error(payload) -> Exception:
    return payload if isinstance(payload, Exception) else RuntimeError(str(payload))


async def _cancel_on_disconnect(request, job, every: float = 0.1) -> None:
    """A non-streaming client that goes away stops its generation too (its drained ids are kept)."""
    while True:
        if await request.is_disconnected():
            job.cancel()
            return
        await asyncio.sleep(every)


def _key_of(request) -> str | None:
    """The name of the API key the request came with (security.Gate); None when the server needs none."""
    return request.scope.get("state", {}).get("api_key_name")


def _cache_owner(st: "ServerState", request) -> str | None:
    """Whose cached prompts a request may reuse: its API key's own (None for all with --shared-cache)."""
    return None if st.config.shared_cache else _key_of(request)


def _session_key(request) -> str | None:
    key = request.headers.get("x-session-id")
    if key is not None and not 0 < len(key) <= 256:
        raise RequestError("x-session-id", "must be a non-empty header of at most 256 characters")
    return key


def _big(request) -> bool:
    """A body large enough that its CPU work goes through the bounded pool (cpu.py)."""
    return getattr(request.state, "body_bytes", 0) > LIGHT_BYTES


async def _parsed(request, parser, **kw):
    """The body parsed into a ChatRequest, off the event loop. Never behind large work in the bounded pool:
    parsing is bounded by the body limit and the schema limits (counted first, cheaply), and a request the
    cheap checks refuse must not wait for a 4 MB count to end."""
    from functools import partial

    st: ServerState = request.app.state.strata
    body = await _json_body(request)
    return await st.cpu.run(partial(parser, body, **kw), heavy=False, what="checking the request",
                            request=request)


def _check_min_context(st: ServerState, req: ChatRequest) -> None:
    """The cheap context check: a prompt that cannot fit whatever it tokenizes to is refused before rendering.
    The assistant prefix is prompt text too, appended as it is: it counts (and is named when it alone is over)."""
    from strata_lab.server.cpu import MAX_TOKEN_BYTES

    prefix = -(-len((req.assistant_prefix or "").encode("utf-8", "surrogatepass")) // MAX_TOKEN_BYTES)
    low = min_prompt_tokens(req.messages) + prefix
    if low > st.config.max_context:
        field = "assistant_prefix" if prefix > st.config.max_context else "messages"
        raise RequestError(field, f"the prompt is at least {low} tokens, over the context of "
                           f"{st.config.max_context} tokens", code="context_length_exceeded")


def _check_min_completion(st: ServerState, rendered) -> None:
    """The cheap context check for a completion prompt given as text (ids are counted as they are)."""
    from strata_lab.server.cpu import MAX_TOKEN_BYTES

    if rendered.prompt_ids is None and rendered.prompt_text:
        low = -(-len(rendered.prompt_text.encode("utf-8", "surrogatepass")) // MAX_TOKEN_BYTES)
        if low > st.config.max_context:
            raise RequestError("prompt", f"the prompt is at least {low} tokens, over the context of "
                               f"{st.config.max_context} tokens", code="context_length_exceeded")


async def _chat(request, req: ChatRequest):
    st: ServerState = request.app.state.strata
    _check_min_context(st, req)
    rendered = await st.cpu.run(render_prompt, st.template, req, heavy=_big(request), what="rendering the chat template",
                            request=request, bulk=True)
    openai = req.dialect == "openai"
    rendered.request_id = new_id("chatcmpl-" if openai else "msg_")
    if openai:
        def build(summary, **kw):
            return openai_response(summary, tokenizer=st.tokenizer, logprobs=req.features.logprobs is not None, **kw)
    else:
        build = anthropic_response
    return await _run(request, req, rendered, build, OpenAIStream if openai else AnthropicStream)


async def _run(request, req: ChatRequest, rendered, build, stream_cls):
    """Queue the request's engine work; answer with build(summary) or stream_cls's SSE frames."""
    from starlette.responses import JSONResponse, StreamingResponse

    st: ServerState = request.app.state.strata
    if req.features.constraint is not None or req.features.tool_choice not in (None, "none") or \
            req.response_format is not None:
        # a bad grammar / schema is a 400 before the request queues; a new one compiles in a worker process
        # (killed over its budget), which hands the compiled grammar back (a deserialization here)
        grammars = st.runner.grammars
        if grammars.known(req):
            await st.cpu.run(grammars.check, req, rendered, heavy=False, what="checking the grammar", request=request)
        else:
            await st.cpu.run(grammars.ensure, heavy=False, what="building the grammar compiler")
            exported = await st.cpu.run(grammars.export_check, req, rendered, heavy=True,
                                        what="compiling the grammar", request=request)
            await st.cpu.run(grammars.adopt, req, exported, heavy=False, what="loading the compiled grammar")
    if st.weights is not None:
        st.weights.check()

    owner = _cache_owner(st, request)

    def work(job):
        if st.weights is not None:
            st.weights.check()  # again right before the engine reads the weights
        st.runner.run(job, req, rendered, owner=owner)

    job = st.worker.submit(work, left=request.is_disconnected)
    events = job.events()
    # from the moment it queues: a client that leaves drops its job (never started if still queued)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        try:
            kind, payload = await events.__anext__()
        except StopAsyncIteration:  # dropped before it ran: its client left
            raise ClientGone() from None
        if kind == "error":
            raise _as_error(payload)
        if not req.stream:
            summary = None
            async for kind, payload in events:
                if kind == "error":
                    raise _as_error(payload)
                if kind == "done":
                    summary = payload
            return JSONResponse(build(summary, model=st.model_name, request_id=rendered.request_id))
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()  # a stream's response watches for the disconnect from here on

    fmt = stream_cls(rendered.request_id, st.model_name, payload["prompt_tokens"], include_usage=req.include_usage,
                     cached_tokens=payload.get("cached_tokens", 0))

    if hasattr(fmt, "prompt_info"):
        fmt.prompt_info(payload)

    async def frames():
        for frame in fmt.start():
            yield frame
        async for kind, payload in events:
            if kind == "event":
                out = fmt.event(payload)
            elif kind == "choice_event":
                out = fmt.choice_event(*payload) if hasattr(fmt, "choice_event") else []
            elif kind == "logprobs":
                if hasattr(fmt, "raw_logprobs"):
                    out = fmt.raw_logprobs(payload)
                else:
                    out = fmt.logprobs(logprob_entry(st.tokenizer, payload)) if hasattr(fmt, "logprobs") else []
            elif kind == "choice_logprobs":  # n > 1 (OpenAI chat only: the other streams refuse n > 1)
                out = fmt.logprobs(logprob_entry(st.tokenizer, payload[1]), payload[0])
            elif kind == "done":
                out = fmt.done(payload)
            else:
                err = payload if isinstance(payload, RequestError) else \
                    RequestError(None, "internal error", code="internal_error", status=500)
                out = fmt.error(err)
            for frame in out:
                yield frame

    class _SSE(StreamingResponse):
        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:  # finished, failed or the client left: a running job stops its stream
                job.cancel()

    return _SSE(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# --- handlers ---------------------------------------------------------------------------------------
async def chat_completions(request: Request):
    return await _chat(request, await _parsed(request, parse_openai, session_key=_session_key(request)))


async def messages(request: Request):
    return await _chat(request, await _parsed(request, parse_anthropic, session_key=_session_key(request)))


async def completions(request: Request):
    """OpenAI /v1/completions: a text or token-id prompt (or a batch of them), no chat template."""
    from functools import partial

    from starlette.responses import JSONResponse

    from strata_lab.server.completions import (CompletionStream, completion_response, merge_completions,
                                               parse_completion_batch)

    st: ServerState = request.app.state.strata
    req, renders = await _parsed(request, parse_completion_batch, dialect="openai",
                               vocab_size=st.runner.engine.vocab_size, session_key=_session_key(request))
    request_id = new_id("cmpl-")
    for rendered in renders:
        _check_min_completion(st, rendered)
        rendered.request_id = request_id

    def build(summary, **kw):
        return completion_response(summary, req, st.tokenizer, **kw)

    stream_cls = partial(CompletionStream, req=req, tokenizer=st.tokenizer)
    if len(renders) == 1:
        return await _run(request, req, renders[0], build, stream_cls)
    bodies = []  # a batch: the prompts run one after another (never streamed)
    for rendered in renders:
        bodies.append(json.loads((await _run(request, req, rendered, build, stream_cls)).body))
    return JSONResponse(merge_completions(bodies, req.features.n))


async def llama_completion(request: Request):
    """llama.cpp /completion: prompt as text or ids, n_predict, cache_prompt, n_probs, id_slot, timings.
    A batch of prompts (["a", [1, 2]]) is answered as llama-server does: a list of results, in order."""
    from functools import partial

    from starlette.responses import JSONResponse

    from strata_lab.server.completions import LlamaStream, llama_response, parse_completion_batch

    st: ServerState = request.app.state.strata
    req, renders = await _parsed(request, parse_completion_batch, dialect="llama",
                                 vocab_size=st.runner.engine.vocab_size, session_key=_session_key(request))
    for rendered in renders:
        _check_min_completion(st, rendered)
        rendered.request_id = new_id("cmpl-")

    def build(summary, **kw):
        return llama_response(summary, req, st.tokenizer, **kw)

    stream_cls = partial(LlamaStream, req=req, tokenizer=st.tokenizer)
    if len(renders) == 1:
        return await _run(request, req, renders[0], build, stream_cls)
    results = []  # one after another (never streamed: parse_completion_batch refuses that)
    for i, rendered in enumerate(renders):
        body = json.loads((await _run(request, req, rendered, build, stream_cls)).body)
        results.append({**body, "index": i})
    return JSONResponse(results)


async def embeddings(request: Request):
    """OpenAI /v1/embeddings (llama-server --embeddings): not served. A 501 saying why, before any work."""
    raise RequestError(None, "embeddings are not served: the engine returns logits only, not the final hidden "
                       "states a pooled embedding needs (exposing them is a change to the C++ engine); "
                       "see docs/SERVER_BEHAVIOUR.md", code="not_implemented", status=501)


async def responses(request: Request):
    """OpenAI /v1/responses: input items or text, instructions, function tools, previous_response_id."""
    from functools import partial

    from strata_lab.server.responses import ResponsesBuilder, output_messages, parse_responses

    st: ServerState = request.app.state.strata
    if st.responses is None:
        st.responses = _response_store(st.config)
    key = _key_of(request)
    body = await _json_body(request)
    prior, previous = None, body.get("previous_response_id") if isinstance(body, dict) else None
    if previous is not None:
        if not isinstance(previous, str):
            raise RequestError("previous_response_id", "must be a string")
        found = st.responses.get(previous, owner=key)
        if found is None:
            raise RequestError("previous_response_id", f"no response {previous!r} is held (the server keeps the "
                               f"last {st.responses.max_entries} of each API key for "
                               f"{st.config.response_ttl:g} s, in memory)", code="not_found")
        prior = found[0]
    req, conversation = await st.cpu.run(partial(parse_responses, body, prior=prior, session_key=_session_key(request)),
                                         heavy=False, what="checking the request", request=request)
    _check_min_context(st, req)
    rendered = await st.cpu.run(render_prompt, st.template, req, heavy=_big(request), what="rendering the chat template",
                            request=request, bulk=True)
    rendered.request_id = new_id("resp_")

    def store(final: dict) -> None:
        if body.get("store", True):
            st.responses.put(final["id"], conversation + output_messages(final), final, owner=key)

    builder = partial(ResponsesBuilder, body=body, previous_id=previous, on_done=store)

    def build(summary, *, model, request_id):
        return builder(request_id, model, summary.prompt_tokens, cached_tokens=summary.cached_tokens).whole(summary)

    return await _run(request, req, rendered, build, builder)


def _response_store(config: ServerConfig):
    from strata_lab.server.responses import ResponseStore

    return ResponseStore(config.response_store, config.response_store_bytes, config.response_ttl)


async def get_response(request: Request):
    """OpenAI GET /v1/responses/{id}: a response this server still holds."""
    st: ServerState = request.app.state.strata
    rid = request.path_params["response_id"]
    # another key's response is answered as one never held: the 404 tells nothing about it
    found = st.responses.get(rid, owner=_key_of(request)) if st.responses is not None else None
    if found is None:
        raise RequestError("response_id", f"no response {rid!r} is held", code="not_found", status=404)
    return found[1]


async def count_tokens(request: Request):
    """Anthropic /v1/messages/count_tokens: the rendered prompt's length, nothing generated."""
    st: ServerState = request.app.state.strata
    body = await _json_object(request)

    def work():
        rendered = render_prompt(st.template, parse_anthropic({"max_tokens": 1, **body}))
        return {"input_tokens": len(_encode(st.tokenizer, rendered.prompt_text))}

    return await st.cpu.run(work, heavy=_big(request), what="counting tokens", request=request,
                            bulk=True)


async def slots(request: Request):
    """Each slot: its session name, held length, requests served, last use, checkpoints, whether it is
    processing and the size of the engine's latest decode step (the batch it is in) if so."""
    st: ServerState = request.app.state.strata
    return st.runner.pool.as_list(batch=st.runner.engine.step_stats()["last_batch"],
                                  viewer=_cache_owner(st, request))


async def models(request: Request):
    st: ServerState = request.app.state.strata
    return {"object": "list", "data": [{"id": st.model_name, "object": "model", "created": int(st.started),
                                        "owned_by": "strata_lab",
                                        "meta": {"n_ctx": st.config.max_context, "path": st.model_path}}]}


def _dump_status(st: ServerState) -> dict | None:
    rec = st.runner.recorder
    if rec is None:
        return None
    return {"path": rec.path, "lines": rec.lines, "lost_lines": rec.lost, "last_error": rec.last_error}


async def health(request: Request):
    st: ServerState = request.app.state.strata
    out = {"status": "ok"}
    if st.runner.recorder is not None:  # lost dump lines do not stop the service, but they are visible
        out["dump_lost_lines"] = st.runner.recorder.lost
    return out


async def props(request: Request):
    """Settings and counters, from the event loop. The chat template's text only with ?chat_template=1 (its name
    and sha256 otherwise: a template file is the operator's, not every client's, to read)."""
    import hashlib

    st: ServerState = request.app.state.strata
    cap = st.config.max_tokens_default
    source = st.template.source
    show = request.query_params.get("chat_template") in ("1", "true")
    return {"chat_template_sha256": hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest(),
            "cpu": {"workers": st.cpu.workers, "pending": st.cpu.pending, "running": st.cpu.running,
                    "refused": st.cpu.refused, "stopped": st.cpu.stopped},
            "weights_changed": st.weights is not None and st.weights.changed is not None,
            **({"chat_template": source} if show else {}),
            "default_generation_settings": {"n_ctx": st.config.max_context, "params": {"n_predict": cap}},
            "max_tokens_default": cap,
            "total_slots": len(st.runner.pool), "model_alias": st.model_name, "model_path": st.model_path,
            "template": st.template.name,
            "reply_reuse": st.runner.reply_reuse, "stop_latency": st.runner.stop_latency, "dump": _dump_status(st),
            "queue": {"waiting": st.worker.waiting, "done": st.worker.done, "dropped": st.worker.dropped,
                      "running": st.worker.running, "lanes": st.worker.lanes},
            "batch": st.runner.engine.step_stats(),
            "engine_calls": st.runner.engine_calls}


def _encode(tokenizer, text: str) -> list[int]:
    # encode_batch releases the GIL (encode holds it): a 4 MB text must not stall /health and the rest
    return tokenizer.encode_batch([text])[0] if len(text) > 65536 else tokenizer.encode(text)


def _piece(tokenizer, token_id: int):
    """A token's text when its bytes are whole UTF-8, else the list of its byte values (as llama.cpp)."""
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def tokenize(request: Request):
    st: ServerState = request.app.state.strata
    body = await _json_object(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise RequestError("content", "must be a string")
    pieces = body.get("with_pieces")
    if pieces is not None and not isinstance(pieces, bool):
        raise RequestError("with_pieces", "must be a boolean")
    special = body.get("add_special")  # llama.cpp: add the BOS id; the vocabularies served here have none
    if special is not None and not isinstance(special, bool):
        raise RequestError("add_special", "must be a boolean")

    def work():
        ids = _encode(st.tokenizer, content)
        if pieces:
            return {"tokens": [{"id": i, "piece": _piece(st.tokenizer, i)} for i in ids]}
        return {"tokens": ids}

    return await st.cpu.run(work, heavy=_big(request), what="tokenizing", request=request, bulk=True)


async def detokenize(request: Request):
    st: ServerState = request.app.state.strata
    body = await _json_object(request)
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise RequestError("tokens", "must be an array of token ids")
    for i, value in enumerate(ids):
        check_int(value, f"tokens[{i}]", minimum=0, maximum=st.tokenizer.vocab_size - 1)
    return {"content": st.tokenizer.decode(ids)}


async def apply_template(request: Request):
    """The prompt text a chat request renders to, and its ids (plain BPE: no remembered reply ids)."""
    st: ServerState = request.app.state.strata
    body = await _json_body(request)

    def work():
        rendered = render_prompt(st.template, parse_openai(body))
        return {"prompt": rendered.prompt_text, "ids": _encode(st.tokenizer, rendered.prompt_text)}

    return await st.cpu.run(work, heavy=_big(request), what="rendering the chat template", request=request,
                            bulk=True)


def _body_schema(properties: dict, required: list[str]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": properties, "required": required}}}}}


_MESSAGE = {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
            "required": ["role", "content"]}
_CHAT = {"messages": {"type": "array", "items": _MESSAGE}, "max_tokens": {"type": "integer"},
         "n_predict": {"type": "integer"}, "stream": {"type": "boolean"}, "temperature": {"type": "number"},
         "assistant_prefix": {"type": "string"}, "thinking_budget": {"type": "integer"},
         "seed": {"type": "integer"}}

_MESSAGES = {k: v for k, v in _CHAT.items() if k not in ("n_predict", "thinking_budget")}
_MESSAGES["system"] = {"type": "string"}

_COMPLETION = {"prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
               "max_tokens": {"type": "integer"}, "n_predict": {"type": "integer"}, "stream": {"type": "boolean"},
               "temperature": {"type": "number"}, "seed": {"type": "integer"}, "logprobs": {"type": "integer"},
               "echo": {"type": "boolean"}, "n": {"type": "integer"}, "cache_prompt": {"type": "boolean"},
               "n_probs": {"type": "integer"}, "id_slot": {"type": "integer"}}

_RESPONSES = {"input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
              "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer"},
              "previous_response_id": {"type": "string"}, "stream": {"type": "boolean"},
              "temperature": {"type": "number"}, "top_p": {"type": "number"}, "tools": {"type": "array"},
              "tool_choice": {}, "store": {"type": "boolean"}, "metadata": {"type": "object"},
              "text": {"type": "object"}, "seed": {"type": "integer"}}

# The route table: method, path, handler, OpenAPI request body.
ROUTES = [
    ("POST", "/v1/chat/completions", chat_completions, _body_schema(_CHAT, ["messages"])),
    ("POST", "/v1/messages", messages, _body_schema(_MESSAGES, ["messages", "max_tokens"])),
    ("GET", "/v1/models", models, None),
    ("POST", "/chat/completions", chat_completions, _body_schema(_CHAT, ["messages"])),  # aliases without /v1
    ("GET", "/models", models, None),
    ("POST", "/v1/completions", completions, _body_schema(_COMPLETION, ["prompt"])),
    ("POST", "/completions", completions, _body_schema(_COMPLETION, ["prompt"])),
    ("POST", "/completion", llama_completion, _body_schema(_COMPLETION, ["prompt"])),
    ("POST", "/v1/messages/count_tokens", count_tokens, _body_schema(_MESSAGES, ["messages"])),
    ("POST", "/v1/responses", responses, _body_schema(_RESPONSES, ["input"])),
    ("POST", "/responses", responses, _body_schema(_RESPONSES, ["input"])),
    ("GET", "/v1/responses/{response_id}", get_response, None),
    ("GET", "/slots", slots, None),
    ("GET", "/health", health, None),
    ("GET", "/props", props, None),
    ("POST", "/tokenize", tokenize, _body_schema({"content": {"type": "string"}, "with_pieces": {"type": "boolean"},
                                                  "add_special": {"type": "boolean"}}, ["content"])),
    ("POST", "/detokenize", detokenize, _body_schema({"tokens": {"type": "array", "items": {"type": "integer"}}},
                                                     ["tokens"])),
    ("POST", "/apply-template", apply_template, _body_schema(_CHAT, ["messages"])),
    ("POST", "/v1/embeddings", embeddings, None),  # 501: see embeddings()
    ("POST", "/embeddings", embeddings, None),
    ("POST", "/embedding", embeddings, None),
]


def create_app(state: ServerState):
    """The ASGI app for a loaded `ServerState` (see `load_state`)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    app = FastAPI(title="strata_lab server", version="1", docs_url=None, redoc_url=None)
    app.state.strata = state
    for method, path, handler, body in ROUTES:
        app.add_api_route(path, handler, methods=[method], openapi_extra=body)

    def shaped(request, err: RequestError):
        return JSONResponse(error_body(err, request.url.path), status_code=err.status)

    @app.exception_handler(RequestError)
    async def _request_error(request, exc: RequestError):
        return shaped(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return shaped(request, RequestError("body", str(exc)))

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc):
        return shaped(request, RequestError(None, str(exc.detail), code="http_error", status=exc.status_code))

    @app.exception_handler(ClientGone)
    async def _client_gone(request, exc):  # nobody reads it: the client left while its work waited
        return shaped(request, RequestError(None, "the client closed the connection", code="client_closed",
                                            status=499))

    @app.exception_handler(Exception)
    async def _internal(request, exc):
        return shaped(request, RequestError(None, f"internal error: {type(exc).__name__}", code="internal_error",
                                            status=500))

    @app.on_event("shutdown")
    def _close():
        state.worker.close()
        state.cpu.close()
        if state.runner.recorder is not None:
            state.runner.recorder.close()

    from strata_lab.server.security import wrap

    return wrap(app, state.config)


def serve(config: ServerConfig) -> None:
    """Load the model and serve until interrupted."""
    import sys

    import uvicorn

    state = load_state(config)
    app = create_app(state)
    names = sorted(config.keys().values())  # keys by name (or hash), never their text
    keys = (f", {len(names)} API key{'s' if len(names) > 1 else ''}: {', '.join(names[:8])}"
            f"{' ...' if len(names) > 8 else ''}") if names else ", no API key"
    print(f"strata-lab serve: {state.model_name} on http://{config.host}:{config.port} "
          f"(context {config.max_context}, kv cache {state.runner.engine.info['kv_cache']}, reply reuse {'on' if config.reply_reuse else 'off'}{keys})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                timeout_keep_alive=config.keep_alive_timeout)
    state.cpu.close()  # a worker still at work is killed (it would die with the server anyway)

"""LangSmith run exports: runs (``langsmith/schemas.py`` ``Run``: ``id``, ``name``, ``run_type``, ``start_time``,
``inputs``, ``outputs``, ``extra`` with ``metadata`` and ``invocation_params``, ``error``, ``trace_id``,
``parent_run_id``, ``child_runs``, ``prompt_tokens``, ``completion_tokens``, ``prompt_token_details``), one JSON
per line or a JSON array (``client.list_runs`` dumped). Each ``run_type: "llm"`` run is one call per prompt in
it (child runs are searched too; chains, tools and retrievers are passed over and counted).

Prompts: ``inputs.messages`` (a list of message lists, LangChain's batch shape, or one list) with messages
serialised by LangChain (``{"lc": 1, "type": "constructor", "id": [..., "HumanMessage"], "kwargs":
{"content", "tool_calls", "tool_call_id", "additional_kwargs"}}``), as ``message_to_dict`` writes them
(``{"type": "human", "data": {...}}``) or OpenAI-shaped (``wrap_openai``); ``inputs.prompts`` (completion
models) are prompt text. Replies: ``outputs.generations[i][0]`` (its ``message`` or ``text``) or an OpenAI
response in ``outputs``. Usage: the run's ``prompt_tokens`` / ``completion_tokens`` /
``prompt_token_details.cache_read`` (single-prompt runs), else the reply message's ``usage_metadata``
(``input_tokens``, ``output_tokens``, ``input_token_details.cache_read`` / ``cache_creation``), else
``outputs.llm_output.token_usage``, else the OpenAI response's ``usage``. Tools: ``extra.invocation_params.tools``
(or the ``wrap_openai`` request's ``tools``). Session: ``extra.metadata`` ``thread_id`` / ``session_id`` /
``conversation_id`` (the run's own ``session_id`` is its tracing project, not a conversation), else the
``trace_id``; `--session-key` names another field.

>>> lc_message({"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "AIMessage"],
...             "kwargs": {"content": "", "tool_calls": [{"name": "ls", "args": {"path": "."}, "id": "t1"}]}}, [])
{'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'ls', 'arguments': \
{'path': '.'}}, 'id': 't1'}]}
"""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.claude_code import parse_ts
from strata_lab.traces.log_calls import SessionChain, new_call, text_parts, tool_call
from strata_lab.traces.openai import apply_response, convert_messages
from strata_lab.traces.source import Source

NAME = "langsmith"
SESSION_KEY = True  # --session-key names a field of each run
_ROLES = {"HumanMessage": "user", "HumanMessageChunk": "user", "human": "user",
          "AIMessage": "assistant", "AIMessageChunk": "assistant", "ai": "assistant",
          "SystemMessage": "system", "SystemMessageChunk": "system", "system": "system",
          "ToolMessage": "tool", "ToolMessageChunk": "tool", "tool": "tool",
          "FunctionMessage": "tool", "FunctionMessageChunk": "tool", "function": "tool",
          "ChatMessage": None, "ChatMessageChunk": None, "chat": None}
_THREAD_KEYS = ("thread_id", "session_id", "conversation_id")


def detect(first: dict) -> bool:
    return isinstance(first.get("run_type"), str) and isinstance(first.get("inputs"), dict) \
        and ("trace_id" in first or "parent_run_id" in first or "extra" in first or "start_time" in first)


def lc_message(m, notes: list) -> dict:
    """A LangChain message (serialised, ``message_to_dict``'s or OpenAI-shaped) as an OpenAI chat message."""
    if not isinstance(m, dict):
        raise ValueError(f"message must be an object, got {type(m).__name__}")
    if m.get("lc") == 1 and isinstance(m.get("id"), list) and m["id"]:
        cls, kw = m["id"][-1], m.get("kwargs") if isinstance(m.get("kwargs"), dict) else {}
    elif isinstance(m.get("data"), dict) and isinstance(m.get("type"), str):
        cls, kw = m["type"], m["data"]
    elif "role" in m:
        return convert_messages([m], notes)[0]
    elif isinstance(m.get("type"), str) and "content" in m:
        cls, kw = m["type"], m
    else:
        raise ValueError(f"message: neither LangChain ({{lc, id, kwargs}}) nor OpenAI (role) shaped: "
                         f"keys {sorted(m)[:5]}")
    if cls not in _ROLES:
        raise ValueError(f"message: unknown LangChain message class {cls!r}")
    role = _ROLES[cls] or {"human": "user", "ai": "assistant"}.get(kw.get("role"), kw.get("role") or "user")
    extra = kw.get("additional_kwargs") if isinstance(kw.get("additional_kwargs"), dict) else {}
    content = text_parts(kw.get("content"), notes)
    out = {"role": role, "content": content if content is not None else ""}
    if role == "assistant":
        calls = [tool_call(c.get("id"), c.get("name"), c.get("args"))
                 for c in kw.get("tool_calls") or () if isinstance(c, dict)]
        if not calls:  # older runs: the OpenAI tool calls in additional_kwargs
            calls = [tool_call(c.get("id"), (c.get("function") or {}).get("name"),
                               (c.get("function") or {}).get("arguments"))
                     for c in extra.get("tool_calls") or () if isinstance(c, dict)]
        if calls:
            out["tool_calls"] = calls
        reasoning = extra.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
    elif role == "tool":
        out["tool_call_id"] = str(kw.get("tool_call_id") or kw.get("name") or "call")
    return out


def _runs(rec: dict) -> Iterator[dict]:
    """A run and its child runs (exports made with ``load_child_runs``), depth first."""
    stack = [rec]
    while stack:
        run = stack.pop()
        yield run
        kids = run.get("child_runs")
        if isinstance(kids, list):
            stack.extend(reversed([k for k in kids if isinstance(k, dict)]))


def _usage_metadata(call: dict, um: dict) -> None:
    details = um.get("input_token_details") if isinstance(um.get("input_token_details"), dict) else {}
    call["prompt_tokens"] = um.get("input_tokens")
    call["completion_tokens"] = um.get("output_tokens")
    call["cached_tokens"] = call["cache_read_tokens"] = details.get("cache_read")
    call["cache_creation_tokens"] = details.get("cache_creation")


def _token_usage(call: dict, tu: dict) -> None:
    call["prompt_tokens"] = tu.get("prompt_tokens")
    call["completion_tokens"] = tu.get("completion_tokens")
    cached = (tu.get("prompt_tokens_details") or {}).get("cached_tokens")
    call["cached_tokens"] = cached if cached is not None else tu.get("cache_read_input_tokens")


def _calls_of_run(run: dict, notes_src: list) -> list[dict]:
    """The calls of one llm run (one per prompt of its batch), without session and source."""
    inputs, outputs = run["inputs"], run.get("outputs") if isinstance(run.get("outputs"), dict) else {}
    extra = run.get("extra") if isinstance(run.get("extra"), dict) else {}
    params = extra.get("invocation_params") if isinstance(extra.get("invocation_params"), dict) else {}
    meta = extra.get("metadata") if isinstance(extra.get("metadata"), dict) else {}
    model = params.get("model") or params.get("model_name") or meta.get("ls_model_name") or inputs.get("model")
    tools = params.get("tools") or inputs.get("tools")
    tools = [t for t in tools if isinstance(t, dict)] or None if isinstance(tools, list) else None
    gens = outputs.get("generations") if isinstance(outputs.get("generations"), list) else []
    raw = inputs.get("messages")
    if isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        prompts = raw
    elif isinstance(raw, list) and raw:
        prompts = [raw]
    elif isinstance(inputs.get("prompts"), list) and inputs["prompts"]:
        prompts = [str(p) for p in inputs["prompts"]]
    else:
        raise ValueError("inputs: neither messages nor prompts")
    out = []
    for i, prompt in enumerate(prompts):
        notes: list = []
        if isinstance(prompt, str):
            call = new_call(format=NAME, fidelity="text", prompt_text=prompt, notes=notes)
        else:
            call = new_call(format=NAME, fidelity="messages", messages=[lc_message(m, notes) for m in prompt],
                            notes=notes)
        call.update(model=model, tools=tools, request_id=str(run.get("id")) if run.get("id") else None,
                    ts=parse_ts(run.get("start_time")))
        if tools is None and call["fidelity"] == "messages":
            notes.append("tool definitions not in the run (invocation_params.tools)")
        gen = gens[i][0] if i < len(gens) and isinstance(gens[i], list) and gens[i] \
            and isinstance(gens[i][0], dict) else None
        msg = gen.get("message") if gen is not None and isinstance(gen.get("message"), dict) else None
        if msg is not None:
            reply = lc_message(msg, notes)
            call["response_text"] = reply["content"] if isinstance(reply["content"], str) else \
                "".join(p.get("text", "") for p in reply["content"])
            call["response_tool_calls"] = reply.get("tool_calls")
            call["response_reasoning"] = reply.get("reasoning_content")
        elif gen is not None:
            call["response_text"] = gen.get("text")
        elif "choices" in outputs:  # wrap_openai: the chat completion itself
            apply_response(call, outputs)
        if gen is not None:
            call["finish"] = (gen.get("generation_info") or {}).get("finish_reason")
        # usage: the run's totals (one prompt), the reply's usage_metadata, llm_output.token_usage
        kw = (msg.get("kwargs") or msg.get("data") or {}) if msg is not None else {}
        um = kw.get("usage_metadata") if isinstance(kw.get("usage_metadata"), dict) else \
            outputs.get("usage_metadata") if isinstance(outputs.get("usage_metadata"), dict) else None
        token_usage = (outputs.get("llm_output") or {}).get("token_usage") \
            if isinstance(outputs.get("llm_output"), dict) else None
        if len(prompts) == 1 and isinstance(run.get("prompt_tokens"), int):
            details = run.get("prompt_token_details") if isinstance(run.get("prompt_token_details"), dict) else {}
            call["prompt_tokens"] = run["prompt_tokens"]
            call["completion_tokens"] = run.get("completion_tokens")
            call["cached_tokens"] = call["cache_read_tokens"] = details.get("cache_read")
            call["cache_creation_tokens"] = details.get("cache_creation")
        elif um is not None:
            _usage_metadata(call, um)
        elif len(prompts) == 1 and isinstance(token_usage, dict):
            _token_usage(call, token_usage)
        if len(prompts) > 1:
            notes.append(f"prompt {i + 1} of a batch of {len(prompts)}")
        out.append(call)
    return out


def read(src: Source) -> Iterator[dict]:
    chain = SessionChain(src.stem)
    records = src.array_items() if src.head(4096).lstrip().startswith(b"[") else src.json_lines()
    passed = {}
    for lineno, rec in records:
        if not isinstance(rec, dict) or not detect(rec):
            src.skip(lineno, "not a LangSmith run (run_type, inputs)")
            continue
        for run in _runs(rec):
            kind = run.get("run_type")
            if kind != "llm":
                passed[kind] = passed.get(kind, 0) + 1
                continue
            if run.get("error") and not run.get("outputs"):
                src.skip(lineno, f"llm run {run.get('id')} ended in an error: not a model call")
                continue
            try:
                calls = _calls_of_run(run, [])
            except ValueError as exc:
                src.skip(lineno, str(exc))
                continue
            meta = ((run.get("extra") or {}).get("metadata") or {}) if isinstance(run.get("extra"), dict) else {}
            sid = src.session_of(run) if src.session_key else \
                next((meta[k] for k in _THREAD_KEYS if isinstance(meta, dict) and meta.get(k)), None) \
                or run.get("trace_id")
            for call in calls:
                call["source"] = src.where(lineno)
                if sid:
                    call["session"] = str(sid)
                elif call["messages"] is not None:
                    call["session"] = chain.session_of_messages(call["messages"])
                yield call
    if passed:
        src.facts.append("runs passed over (not model calls): "
                         + ", ".join(f"{n} {k}" for k, n in sorted(passed.items(), key=str)))

"""Scripted clients for `sessions.record`: an agent with tools, a thinking-budget chat, a llama.cpp-web-UI chat.

A tiny random model writes noise, so the script plays the agent: it decides each tool call and its result
and puts them into the history as an agent framework would (the assistant message carries the model's reply
text plus the tool call; a tool message follows). Every request carries the whole history, as real clients
do, so the server re-renders and re-encodes the model's earlier replies: where the model wrote pieces BPE
would merge, the ids part from what the engine holds.

* agent: tools (read_file, run, search), Turkish file names and regexes in the tool results;
* thinking: enable_thinking with a thinking_budget, so STOP arrives while the model is thinking (drained ids);
* webui: before each real request, `n_predict: 0` requests warm the cache with the user's message as typed
  so far (llama.cpp web UI style), then the request itself with the finished message.

>>> ScriptConfig(turns=0)
Traceback (most recent call last):
...
ValueError: turns must be a positive int, got 0
"""
from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["SCENARIOS", "ScriptConfig", "run_script", "TOOLS"]

SCENARIOS = ("agent", "thinking", "webui")


@dataclass(frozen=True)
class ScriptConfig:
    turns: int = 4            # model replies in the session (agent: tool rounds; others: user turns)
    max_tokens: int = 24      # per request
    seed: int = 0             # sampling seed of the first request (each request adds its index)
    temperature: float = 1.0
    thinking_budget: int = 12

    def __post_init__(self):
        for name in ("turns", "max_tokens", "thinking_budget"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature!r}")


def _fn(name, description, **props):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
        "required": list(props)}}}


TOOLS = [_fn("read_file", "Read a file of the repository", path="path relative to the repository root"),
         _fn("run", "Run a shell command in the repository", cmd="the command line"),
         _fn("search", "Search the repository", query="words or a regex")]

# (tool, arguments, result): what the scripted agent does, in order
_ACTIONS = [
    ("read_file", {"path": "src/öğrenci_listesi.py"},
     "import re\n\nAD = re.compile(r\"[a-zçğıöşü]+\")\n\n\ndef normalize(ad: str) -> str:\n"
     "    return ad.strip().lower()  # İ -> i̇ breaks the match\n"),
    ("run", {"cmd": "pytest -q tests/test_öğrenci.py"},
     "F.F..\nFAILED tests/test_öğrenci.py::test_buyuk_harf - assert 'i̇stanbul' == 'istanbul'\n"
     "FAILED tests/test_öğrenci.py::test_bosluk - AssertionError\n2 failed, 3 passed in 0.04s\n"),
    ("search", {"query": "casefold|lower\\(\\)"},
     "src/öğrenci_listesi.py:7:    return ad.strip().lower()\nsrc/rapor.py:19:    başlık = başlık.lower()\n"),
    ("read_file", {"path": "tests/test_öğrenci.py"},
     "from src.öğrenci_listesi import normalize\n\n\ndef test_buyuk_harf():\n"
     "    assert normalize('İstanbul') == 'istanbul'\n"),
    ("run", {"cmd": "python -c \"print('İ'.lower(), len('İ'.lower()))\""}, "i̇ 2\n"),
    ("run", {"cmd": "pytest -q"}, ".....\n5 passed in 0.03s\n"),
]
_TASK = ("Öğrenci listesindeki isimler [a-zçğıöşü]+ ile eşleşmiyor; testler kırmızı. Düzelt ve testleri "
         "çalıştır.")
_QUESTIONS = ["How many r's are in 'strawberry'? Answer briefly.",
              "Şimdi 'öğrenciler' kelimesindeki ğ harflerini say.",
              "Write a regex matching Turkish lowercase words.",
              "Summarize our conversation in one sentence.",
              "What is 17 * 23?"]
_WEBUI = ["Explain what a KV cache is", "Now explain why hybrid models cannot roll back their state",
          "How does checkpointing help", "Give a short example with numbers", "Thanks, one last summary"]


def _client(base_url: str):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="strata-lab", max_retries=0, timeout=120)


class _Chat:
    def __init__(self, base_url: str, cfg: ScriptConfig, on_request=None):
        self.client, self.cfg, self.requests = _client(base_url), cfg, 0
        self.on_request = on_request

    def send(self, messages, **kw):
        extra = kw.pop("extra_body", {})
        resp = self.client.chat.completions.create(
            model="strata-lab", messages=messages, temperature=self.cfg.temperature,
            seed=self.cfg.seed + self.requests, extra_body=extra, **kw)
        self.requests += 1
        if self.on_request is not None:
            self.on_request()
        return resp.choices[0].message


def _agent(chat: _Chat) -> None:
    cfg = chat.cfg
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools; keep replies short."},
                {"role": "user", "content": _TASK}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    for turn in range(cfg.turns):
        msg = chat.send(messages, tools=TOOLS, max_tokens=cfg.max_tokens, extra_body=off)
        reply = {"role": "assistant", "content": msg.content or ""}
        if turn == cfg.turns - 1:
            messages.append(reply)
            messages.append({"role": "user", "content": "Teşekkürler. Kısaca özetle."})
            chat.send(messages, tools=TOOLS, max_tokens=cfg.max_tokens, extra_body=off)
            return
        name, args, result = _ACTIONS[turn % len(_ACTIONS)]
        call_id = f"call_{turn}"
        reply["tool_calls"] = [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}]
        messages += [reply, {"role": "tool", "tool_call_id": call_id, "content": result}]


def _thinking(chat: _Chat) -> None:
    cfg = chat.cfg
    messages = [{"role": "system", "content": "Think step by step, then answer."}]
    on = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget": cfg.thinking_budget}
    for turn in range(cfg.turns):
        messages.append({"role": "user", "content": _QUESTIONS[turn % len(_QUESTIONS)]})
        msg = chat.send(messages, max_tokens=cfg.thinking_budget + cfg.max_tokens, extra_body=on)
        reply = {"role": "assistant", "content": msg.content or ""}
        reasoning = (msg.model_extra or {}).get("reasoning_content")
        if reasoning:
            reply["reasoning_content"] = reasoning  # sent back, as clients do; the template drops old ones
        messages.append(reply)


def _webui(chat: _Chat) -> None:
    cfg = chat.cfg
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(cfg.turns):
        text = _WEBUI[turn % len(_WEBUI)]
        words = text.split(" ")
        for cut in sorted({max(1, len(words) // 2), len(words)}):  # typed so far, then the whole message
            chat.send(messages + [{"role": "user", "content": " ".join(words[:cut])}],
                      extra_body={"n_predict": 0, "chat_template_kwargs": {"enable_thinking": False}})
        messages.append({"role": "user", "content": text})
        msg = chat.send(messages, max_tokens=cfg.max_tokens,
                        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "cache_prompt": True})
        messages.append({"role": "assistant", "content": msg.content or ""})


_SCRIPTS = {"agent": _agent, "thinking": _thinking, "webui": _webui}


def run_script(scenario: str, base_url: str, cfg: ScriptConfig = ScriptConfig(), on_request=None) -> int:
    """Drive one scripted session against the server at `base_url` (…/v1); returns the requests sent.
    `on_request`: called with no argument after each answered request (a progress bar's step)."""
    if scenario not in _SCRIPTS:
        raise ValueError(f"scenario must be one of {sorted(_SCRIPTS)}, got {scenario!r}")
    chat = _Chat(base_url, cfg, on_request)
    _SCRIPTS[scenario](chat)
    return chat.requests

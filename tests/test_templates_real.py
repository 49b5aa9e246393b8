"""Conformance with transformers on real chat templates: every template llama.cpp keeps in `models/templates/`
(tests/fixtures/templates/llama.cpp/, vendored unmodified) renders agent conversations -- a system prompt,
tools, reasoning, tool calls with mapping or JSON-string arguments, tool results -- to exactly the text
transformers' own renderer gives, or fails the way transformers fails (the template's `raise_exception`, or a
template that cannot take that input), or is in REFUSED below with the reason.

Only rendering: transformers' `render_jinja_template` is called as `apply_chat_template` calls it (None-valued
message keys dropped, the special tokens passed as variables, `add_generation_prompt=True`), without a
tokenizer. `strftime_now` is pinned to one date in both. Counted with transformers 5.25: all 70 templates render
what transformers renders on every conversation here (553 of the 630 template x conversation pairs render text,
77 fail alike), none refused.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
from functools import lru_cache
from pathlib import Path

import pytest

chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
if not hasattr(chat_template_utils, "_alias_reasoning_fields"):  # transformers 5.x: what we render as
    pytest.skip("needs a transformers that drops None keys and aliases reasoning fields (5.x)",
                allow_module_level=True)

import strata_lab.text.jinja as strata_jinja  # noqa: E402
from strata_lab.text.template import ChatTemplate, TemplateRenderError  # noqa: E402

TEMPLATES_DIR = Path(__file__).parent / "fixtures" / "templates" / "llama.cpp"
TEMPLATE_FILES = sorted(TEMPLATES_DIR.glob("*.jinja"))

# Templates our renderer refuses (a ValueError naming the template feature we lack), with the reason. A template
# that starts rendering, or one not listed that is refused, fails the test: update this list and the docs
# (docs/ARCHITECTURE.md, chat templates) together.
REFUSED: dict[str, str] = {}

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2025, 3, 14, 9, 26, 53, tzinfo=tz)


@pytest.fixture(autouse=True)
def _pinned_date(monkeypatch):
    # both renderers' strftime_now read the module-level `datetime` when called
    monkeypatch.setattr(chat_template_utils, "datetime", _FixedDatetime)
    monkeypatch.setattr(strata_jinja, "datetime", _FixedDatetime)


# ---------------------------------------------------------------------------------------------------------
# The conversations. Tool-call ids are nine letters and digits (Mistral's templates insist on that shape).

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "description": "Temperature unit", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the work folder.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command line"}},
                       "required": ["command"]}}},
]


def _call(call_id: str, name: str, arguments: dict, as_json: bool) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments) if as_json else arguments}}


def agent_conversation(*, json_arguments: bool = False, system: bool = True, parallel: bool = False,
                       null_content: bool = False) -> list[dict]:
    """A coding agent's turns: reasoning, a tool call, its result, a second call (or two in parallel) with text,
    their results, a final answer, and a new user turn. `null_content`: the tool-call turns have content None
    (as OpenAI's API sends them), else "" and text."""
    shell = [_call("Rt4Xv8Bn1", "run_shell", {"command": "ls"}, json_arguments)]
    results = [{"role": "tool", "tool_call_id": "Rt4Xv8Bn1", "content": "README.md\nsetup.py"}]
    if parallel:
        shell.append(_call("Zc6Hj3Ds5", "run_shell", {"command": "pwd"}, json_arguments))
        results.append({"role": "tool", "tool_call_id": "Zc6Hj3Ds5", "content": "/srv/agent"})
    messages = [{"role": "system", "content": "You are a careful coding agent."}] if system else []
    messages += [
        {"role": "user", "content": "What is the weather in Paris? Then list the files."},
        {"role": "assistant", "content": None if null_content else "",
         "reasoning_content": "I need the weather tool first.",
         "tool_calls": [_call("Wq7Kp2Lm9", "get_weather", {"city": "Paris", "unit": "celsius"}, json_arguments)]},
        {"role": "tool", "tool_call_id": "Wq7Kp2Lm9", "content": '{"temp": 18, "sky": "clear"}'},
        {"role": "assistant", "content": None if null_content else "It is 18 degrees. Listing the files now.",
         "reasoning_content": "Now the shell.", "tool_calls": shell},
        *results,
        {"role": "assistant", "content": "Paris is clear at 18 degrees; the folder holds README.md and setup.py.",
         "reasoning_content": "Both results are in."},
        {"role": "user", "content": "Thanks. Summarise that in one line."},
    ]
    return messages


def _renamed(messages: list[dict], old: str, new: str) -> list[dict]:
    return [{(new if k == old else k): v for k, v in m.items()} for m in messages]


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7", "reasoning_content": "Seven has no divisors but 1 and 7."},
    {"role": "user", "content": "Another one?"},
]

CASES = {
    "agent": (agent_conversation(), TOOLS),
    "agent_json_arguments": (agent_conversation(json_arguments=True), TOOLS),
    "agent_no_system": (agent_conversation(system=False), TOOLS),
    "agent_parallel_null_content": (agent_conversation(parallel=True, null_content=True), TOOLS),
    # the prompt an agent loop sends after a tool result: the reasoning since the last user turn is rendered
    "agent_after_tool_result": (agent_conversation()[:4], TOOLS),
    # vLLM's name for the field: `reasoning`
    "agent_after_tool_result_reasoning": (_renamed(agent_conversation()[:4], "reasoning_content", "reasoning"), TOOLS),
    # the thinking switch most reasoning templates read (Qwen3, SmolLM3, GLM, ...), off
    "agent_after_tool_result_thinking_off": (agent_conversation()[:4], TOOLS, {"enable_thinking": False}),
    "chat_no_tools": (CHAT, None),
    "chat_no_system": (CHAT[1:], None),
}

# Variables a template reads besides messages/tools (apply_chat_template's extra keyword arguments), given to
# both renderers: firefunction-v2 takes its function list as a JSON string and today's date from the caller.
TEMPLATE_KWARGS = {
    "fireworks-ai-llama-3-firefunction-v2": {
        "functions": json.dumps([tool["function"] for tool in TOOLS], indent=2), "datetime": "2025-03-14"},
}


# ---------------------------------------------------------------------------------------------------------

def transformers_render(source: str, messages: list[dict], tools: list | None, **kwargs) -> str:
    """What `tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)`
    returns for a tokenizer whose special tokens are SPECIAL_TOKENS: None-valued keys dropped, then
    transformers' renderer."""
    messages = chat_template_utils._normalize_chat_messages(copy.deepcopy(messages))
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=copy.deepcopy(tools), chat_template=source, add_generation_prompt=True,
        **SPECIAL_TOKENS, **kwargs)
    return rendered[0]


def _case(name: str, case: str) -> tuple[list[dict], list | None, dict]:
    messages, tools, *kwargs = CASES[case]
    return messages, tools, {**(kwargs[0] if kwargs else {}), **TEMPLATE_KWARGS.get(name, {})}


@lru_cache(maxsize=None)
def _source(name: str) -> str:
    return (TEMPLATES_DIR / f"{name}.jinja").read_text("utf-8")


@lru_cache(maxsize=None)
def _ours(name: str) -> ChatTemplate:
    return ChatTemplate(_source(name), name=name, special_tokens=SPECIAL_TOKENS)


@lru_cache(maxsize=None)
def _theirs(name: str, case: str):
    messages, tools, kwargs = _case(name, case)
    return _outcome(lambda: transformers_render(_source(name), messages, tools, **kwargs))


def _outcome(render):
    try:
        return "text", render()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception itself
        return "error", exc


def test_all_llama_cpp_templates_are_here():
    assert len(TEMPLATE_FILES) == 70
    assert set(REFUSED) <= {p.stem for p in TEMPLATE_FILES}
    readme = (TEMPLATES_DIR / "README.md").read_text("utf-8")
    assert "llama-cpp-python 0.3.36" in readme and "MIT" in readme
    assert (TEMPLATES_DIR / "LICENSE").read_text("utf-8").startswith("MIT License")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", [p.stem for p in TEMPLATE_FILES])
def test_renders_as_transformers(name, case):
    messages, tools, kwargs = _case(name, case)
    if name in REFUSED:
        with pytest.raises(ValueError) as info:
            _ours(name).render(copy.deepcopy(messages), tools=copy.deepcopy(tools), **kwargs)
        message = str(info.value)
        assert "\n" not in message and REFUSED[name] in message
        return
    theirs = _theirs(name, case)
    ours = _outcome(lambda: _ours(name).render(copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                               add_generation_prompt=True, **kwargs))
    if theirs[0] == "text":
        assert ours[0] == "text", f"transformers renders {name} ({case}); we raise: {ours[1]}"
        assert ours[1] == theirs[1]
    else:
        # the template refuses this conversation (its raise_exception, or input it cannot take): the same
        # error, in ours one ValueError naming the template and line
        assert ours[0] == "error", f"transformers raises on {name} ({case}): {theirs[1]}; we render"
        assert isinstance(ours[1], TemplateRenderError), repr(ours[1])
        assert str(ours[1]).endswith(f": {theirs[1]}")


# Templates that render no conversation with tools, in transformers either (both raise the same error): the
# tool-call parts of these are checked only for failing alike.
NO_TOOL_CONVERSATION_RENDERS = {
    "google-gemma-2-2b-it": "no system role, and roles must alternate user/assistant (no tool turns)",
    "Kimi-K2-Instruct": "builds its tool-call list with list.append, which the immutable sandbox refuses",
    "Kimi-K2-Thinking": "builds its tool-call list with list.append, which the immutable sandbox refuses",
    "llama-cpp-deepseek-r1": "llama.cpp's own template: applies tojson to a map() generator",
}


def test_which_templates_render_what():
    """Every template renders some conversation in both renderers (the chats without tools at least), and all
    but NO_TOOL_CONVERSATION_RENDERS render one with tools: the comparison above is not only of failures."""
    renders, renders_tools = set(), set()
    for path in TEMPLATE_FILES:
        for case in CASES:
            if path.stem not in REFUSED and _theirs(path.stem, case)[0] == "text":
                renders.add(path.stem)
                if CASES[case][1]:
                    renders_tools.add(path.stem)
    names = {p.stem for p in TEMPLATE_FILES}
    assert renders == names - set(REFUSED)
    assert names - set(REFUSED) - renders_tools == set(NO_TOOL_CONVERSATION_RENDERS)

"""Chat templates: Hugging Face-compatible Jinja rendering, our Qwen3-style template, assistant prefill,
and a lint that finds where a template is not append-only.

One internal message shape (OpenAI's): ``{"role", "content", "tool_calls", "tool_call_id",
"reasoning_content"}``. The server converts every API dialect into it before calling `render`.

>>> tmpl = ChatTemplate.from_name("qwen3")
>>> tmpl.render([{"role": "user", "content": "Hi"}])
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
>>> tmpl.render([{"role": "user", "content": "Hi"}], assistant_prefix="Hello")
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\nHello'

Why one module: loading (files, configs, GGUF, the checks that a file is a chat template), rendering with
prefill and the append-only lint all work on one `ChatTemplate`; split, each part would reach into the others.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from strata_lab.text.jinja import (RenderLimitError, TemplateRenderError, _environment, _template_line,
                                   compile_guarded, render_budget)
from strata_lab.text.messages import (TemplateInputError, content_text, structured_output_instruction, validate_messages,
                       validate_tools, with_instruction)

__all__ = ["ChatTemplate", "AppendOnlyFinding", "TemplateInputError", "TemplateRenderError",
           "structured_output_instruction", "TEMPLATE_PRESETS"]

# preset name -> (file under strata_lab/templates, special tokens the template's model uses)
TEMPLATE_PRESETS = {
    "qwen3": ("qwen3.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
}
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")
# Stands in for the assistant content while we locate where the template puts it (see _render_prefill).
_SENTINEL = "STRATA_PREFILL_SENTINEL_5f0c"


@dataclass(frozen=True)
class AppendOnlyFinding:
    """One place where a template rewrote text an earlier prompt (plus its reply) already held.

    `turn` counts assistant replies from 0; `message_index` is that reply's index in the conversation;
    `offset` is the character offset of the first difference; `expected`/`actual` show the context around
    it as ``before||after`` (expected = turn N's prompt + reply, actual = turn N+1's prompt).
    """

    turn: int
    message_index: int
    offset: int
    expected: str
    actual: str
    kind: str = "rewrite"  # "rewrite" or "generation_prompt" (the reply does not extend its own prompt)

    def __str__(self) -> str:
        return (f"turn {self.turn} (messages[{self.message_index}]) offset {self.offset} [{self.kind}]\n"
                f"  held  : {self.expected!r}\n  prompt: {self.actual!r}")


def _context(text: str, offset: int, width: int) -> str:
    start = max(0, offset - width)
    return ("..." if start else "") + text[start:offset] + "||" + text[offset:offset + width] + (
        "..." if offset + width < len(text) else "")


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


class ChatTemplate:
    """A Jinja chat template rendered the way Hugging Face transformers renders it.

    >>> tmpl = ChatTemplate.from_name("qwen3")
    >>> tmpl.name, tmpl.special_tokens["eos_token"]
    ('qwen3', '<|im_end|>')
    """

    def __init__(self, source: str, *, name: str = "custom", special_tokens: Mapping[str, str] | None = None):
        if not isinstance(source, str) or not source:
            raise ValueError("source: must be a non-empty Jinja template string")
        if not isinstance(name, str) or not name:
            raise ValueError("name: must be a non-empty string")
        self.source = source
        self.name = name
        self.special_tokens = dict(special_tokens or {})
        self.tool_use: ChatTemplate | None = None  # a named "tool_use" variant, used when tools are given
        self._filename = f"<chat template {name}>"
        env = _environment()
        try:
            code = compile_guarded(env, source, name=name, filename=self._filename)
        except Exception as exc:  # jinja2.TemplateSyntaxError carries the line
            raise TemplateRenderError(name, getattr(exc, "lineno", None), str(exc)) from exc
        self._template = env.template_class.from_code(env, code, env.make_globals(None))

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def from_name(cls, name: str) -> "ChatTemplate":
        """One of our shipped templates (`TEMPLATE_PRESETS`).

        >>> ChatTemplate.from_name("qwen3").name
        'qwen3'
        """
        if name not in TEMPLATE_PRESETS:
            raise ValueError(f"name: unknown chat template {name!r}; known: {', '.join(sorted(TEMPLATE_PRESETS))}")
        filename, special = TEMPLATE_PRESETS[name]
        source = resources.files("strata_lab.text").joinpath("templates").joinpath(filename).read_text("utf-8")
        return cls(source, name=name, special_tokens=special)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, variant: str | None = None) -> "ChatTemplate":
        """Load a chat template from a ``.jinja`` file, an HF ``tokenizer_config.json`` / ``chat_template.json``,
        a GGUF file (its ``tokenizer.chat_template``), or a model folder holding any of these.

        In a tokenizer config, ``chat_template`` is a string or a list of ``{"name", "template"}``; `variant`
        picks one by name (default: "default"). The special-token strings (bos_token, eos_token, ...) come from
        the same place: the folder's ``tokenizer_config.json`` (else ``special_tokens_map.json``), or the GGUF's
        ``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` looked up in its token list.

        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "echo.jinja"
        >>> _ = p.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
        >>> ChatTemplate.from_file(p).render([{"role": "user", "content": "hi"}])
        'hi'
        """
        return cls._from_file(Path(path), variant)

    def _check_is_chat_template(self, path) -> None:
        """A plain text file given as a chat template must be one: it reads `messages` and renders their text (any text file
        compiles as Jinja; `--chat-template /etc/passwd` must not become a prompt served to every client)."""
        from jinja2 import nodes

        env = _environment()
        names = {n.name for n in env.parse(self.source).find_all(nodes.Name)}
        if "messages" not in names:
            raise ValueError(f"path: {path} is not a chat template (it never reads `messages`)")
        probe = "STRATA_TEMPLATE_PROBE_81d2"
        try:
            text = self.render([{"role": "user", "content": probe}], add_generation_prompt=True)
        except (TemplateRenderError, TemplateInputError):
            return  # a template may insist on more (a system message, ...): real requests will tell
        if probe not in text:
            raise ValueError(f"path: {path} is not a chat template (a user message's text does not appear in "
                             "what it renders)")

    @classmethod
    def _from_file(cls, path: Path, variant: str | None) -> "ChatTemplate":
        if path.is_dir():
            special = _folder_special_tokens(path)
            for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
                f = path / name
                if not f.is_file():
                    continue
                if name == "chat_template.jinja":
                    tmpl = cls(_read_text(f), name=path.name, special_tokens=special)
                    tmpl._check_is_chat_template(f)
                    return tmpl
                data = _read_json(f)
                if "chat_template" in data:
                    tmpl = cls._from_config(data, f, variant)
                    return tmpl._with_special(special)
            ggufs = sorted(path.glob("*.gguf"))
            if ggufs:
                return cls._from_file(ggufs[0], variant)
            raise FileNotFoundError(f"path: {path} holds no chat_template.jinja, chat_template.json, "
                                    "tokenizer_config.json with a chat_template, or .gguf file")
        if not path.is_file():
            if path.exists():
                raise ValueError(f"path: {path} is not a regular file")
            raise FileNotFoundError(f"path: no such file {path}")
        if path.suffix == ".gguf":
            return cls._from_gguf(path)
        if path.suffix != ".json":
            tmpl = cls(_read_text(path), name=path.stem)
            tmpl._check_is_chat_template(path)  # a plain text file: it must be a chat template
            return tmpl
        data = _read_json(path)
        if "chat_template" not in data:
            raise ValueError(f"path: {path} has no 'chat_template'")
        tmpl = cls._from_config(data, path, variant)
        if path.name == "chat_template.json":  # its special tokens live beside it
            tmpl = tmpl._with_special(_folder_special_tokens(path.parent))
        return tmpl

    def with_special_tokens_from(self, folder: str | os.PathLike) -> "ChatTemplate":
        """Fill in the special-token strings (bos_token, eos_token, ...) this template lacks from a model
        folder's ``tokenizer_config.json`` (else ``special_tokens_map.json``): a bare ``.jinja`` given beside
        ``--tokenizer FOLDER`` renders ``{{ bos_token }}`` as that model's. What the template has wins.

        >>> import json, tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
        >>> t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
        >>> t.with_special_tokens_from(d).render([{"role": "user", "content": "hi"}])
        '<s>hi'
        """
        return self._with_special(_folder_special_tokens(Path(folder)))

    def _with_special(self, defaults: Mapping[str, str]) -> "ChatTemplate":
        # fill in special-token strings found beside the template (its own config wins)
        self.special_tokens = {**defaults, **self.special_tokens}
        if self.tool_use is not None:
            self.tool_use.special_tokens = {**defaults, **self.tool_use.special_tokens}
        return self

    @classmethod
    def _from_config(cls, data: Mapping, path: Path, variant: str | None) -> "ChatTemplate":
        source = data["chat_template"]
        name = path.parent.name if path.name in ("tokenizer_config.json", "chat_template.json") else path.stem
        name = name or path.stem
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
            want = variant or "default"
            if want not in named:
                raise ValueError(f"variant: {path} has no chat template named {want!r}; "
                                 f"it has {', '.join(map(str, named))}")
            source, name = named[want], f"{name}:{want}"
            if variant is None and isinstance(named.get("tool_use"), str):
                # as transformers' apply_chat_template: a request with tools takes the "tool_use" template
                tool_use = cls(named["tool_use"], name=f"{name.rsplit(':', 1)[0]}:tool_use",
                               special_tokens=_special_tokens(data))
                tmpl = cls(source, name=name, special_tokens=_special_tokens(data))
                tmpl.tool_use = tool_use
                return tmpl
        elif variant not in (None, "default"):
            raise ValueError(f"variant: {path} has a single chat template, not named variants")
        if not isinstance(source, str):
            raise ValueError(f"path: {path} chat_template must be a string or a list of {{name, template}}")
        return cls(source, name=name, special_tokens=_special_tokens(data))

    @classmethod
    def _from_gguf(cls, path: Path) -> "ChatTemplate":
        try:
            from gguf import GGUFReader
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ImportError("reading a GGUF's chat template needs the 'gguf' package") from exc
        try:
            reader = GGUFReader(str(path), "r")
        except Exception as exc:
            raise ValueError(f"path: {path} is not a readable GGUF file ({exc})") from exc
        field = reader.get_field("tokenizer.chat_template")
        if field is None:
            raise ValueError(f"path: {path} has no tokenizer.chat_template")
        source = field.contents()
        special = {}
        tokens = reader.get_field("tokenizer.ggml.tokens")
        for key in ("bos", "eos", "unk", "pad", "sep"):
            f = reader.get_field(f"tokenizer.ggml.{key}_token_id")
            if f is not None and tokens is not None:
                i = int(f.contents())
                if 0 <= i < len(tokens.data):
                    special[f"{key}_token"] = tokens.contents(i)
        return cls(source, name=path.stem, special_tokens=special)

    def to_tokenizer_config(self, **overrides: Any) -> dict:
        """A Hugging Face ``tokenizer_config.json`` dict carrying this template (pair it with tokenizer.json).

        >>> cfg = ChatTemplate.from_name("qwen3").to_tokenizer_config()
        >>> cfg["eos_token"], cfg["pad_token"], cfg["chat_template"].startswith("{#")
        ('<|im_end|>', '<|endoftext|>', True)
        """
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",  # loads tokenizer.json as-is
            "chat_template": self.source,
            "bos_token": None,
            "eos_token": None,
            "pad_token": None,
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "errors": "replace",
            "model_max_length": 131072,
        }
        config.update(self.special_tokens)
        config.update(overrides)
        return config

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"

    # -- rendering -----------------------------------------------------------------------------------------

    def render(self, messages: Sequence[Mapping], *, tools: list | None = None, add_generation_prompt: bool = True,
               assistant_prefix: str | None = None, enable_thinking: bool | None = None,
               response_format: Mapping | None = None, continue_final_message: bool = False,
               **template_kwargs: Any) -> str:
        """Render a conversation to prompt text.

        `assistant_prefix` (non-empty) starts the final assistant turn with text the model continues: the
        template renders an empty assistant turn, its terminator is removed, and the prefix is appended
        verbatim (never passed through the template). `continue_final_message=True` continues the last
        (assistant) message the same way. `response_format` adds a structured-output instruction to the system
        message. Extra keyword arguments reach the template, as in HF's ``apply_chat_template``.

        >>> tmpl = ChatTemplate.from_name("qwen3")
        >>> tmpl.render([{"role": "user", "content": "2+2?"}], enable_thinking=False)
        '<|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
        """
        if tools and self.tool_use is not None:
            return self.tool_use.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        assistant_prefix=assistant_prefix, enable_thinking=enable_thinking,
                                        response_format=response_format,
                                        continue_final_message=continue_final_message, **template_kwargs)
        if assistant_prefix is not None and not isinstance(assistant_prefix, str):
            raise TemplateInputError("assistant_prefix", f"must be a string, got {type(assistant_prefix).__name__}")
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise TemplateInputError("enable_thinking", "must be true, false or null")
        if not isinstance(add_generation_prompt, bool):
            raise TemplateInputError("add_generation_prompt", "must be a boolean")
        msgs = validate_messages(messages)
        tools = validate_tools(tools)
        instruction = structured_output_instruction(response_format)
        if instruction is not None:
            msgs = with_instruction(msgs, instruction)
        if enable_thinking is not None:
            template_kwargs["enable_thinking"] = enable_thinking

        carried: dict = {}  # fields of a continued final message that the synthetic turn keeps (reasoning)
        if continue_final_message:
            if assistant_prefix:
                raise TemplateInputError("assistant_prefix", "cannot be combined with continue_final_message")
            last = msgs[-1]
            if last["role"] != "assistant":
                raise TemplateInputError("role", "continue_final_message needs a final assistant message",
                                         len(msgs) - 1)
            if "tool_calls" in last:
                raise TemplateInputError("tool_calls", "a message with tool calls cannot be continued",
                                         len(msgs) - 1)
            msgs = msgs[:-1]
            assistant_prefix = content_text(last.get("content"))
            carried = {k: v for k, v in last.items() if k not in ("role", "content")}
            if not msgs and not assistant_prefix and not carried:
                raise TemplateInputError("messages", "nothing to render besides an empty assistant message")
        if assistant_prefix or carried:
            return self._render_prefill(msgs, tools, assistant_prefix or "", carried, template_kwargs)
        return self._render(msgs, tools, add_generation_prompt, template_kwargs)

    def _render(self, messages: list[dict], tools: list | None, add_generation_prompt: bool,
                template_kwargs: Mapping[str, Any]) -> str:
        # Same variables as transformers' render_jinja_template; special tokens first, as apply_chat_template.
        kwargs = {**self.special_tokens, **template_kwargs}
        messages = _alias_reasoning(messages)
        try:
            with render_budget():
                text = self._template.render(messages=messages, tools=tools, documents=None,
                                             add_generation_prompt=add_generation_prompt, **kwargs)
            from strata_lab.text.jinja import RENDER_MAX_CHARS

            if len(text) > RENDER_MAX_CHARS:
                raise RenderLimitError(f"the rendered prompt is {len(text)} characters, over the limit of "
                                       f"{RENDER_MAX_CHARS}")
            return text
        except Exception as exc:
            raise TemplateRenderError(self.name, _template_line(exc, self._filename), str(exc)) from exc

    def _render_prefill(self, messages: list[dict], tools: list | None, prefix: str, carried: dict,
                        template_kwargs: Mapping[str, Any]) -> str:
        # Render the synthetic turn twice: with a sentinel as its content (to find where content goes) and
        # empty. The empty render must be head + terminator; we keep the head and append the prefix verbatim,
        # so a prefix ending in "<|im_end|>\n" or holding "</think>" is never cut or parsed by the template.
        probe = self._render(messages + [{**carried, "role": "assistant", "content": _SENTINEL}], tools, False,
                             template_kwargs)
        if probe.count(_SENTINEL) != 1:
            raise TemplateRenderError(self.name, None, "cannot prefill: the template does not render the final "
                                      "assistant message's content exactly once")
        head, terminator = probe.split(_SENTINEL)
        empty = self._render(messages + [{**carried, "role": "assistant", "content": ""}], tools, False,
                             template_kwargs)
        if empty != head + terminator:
            raise TemplateRenderError(self.name, None, "cannot prefill: an empty final assistant turn renders "
                                      "differently from a non-empty one beyond its content")
        return head + prefix

    # -- lint ----------------------------------------------------------------------------------------------

    def check_append_only(self, conversation: Sequence[Mapping], *, tools: list | None = None,
                          context: int = 40, **render_kwargs: Any) -> list[AppendOnlyFinding]:
        """Find where the next turn's prompt does not extend this turn's prompt plus its reply.

        For each assistant message at index i: prompt_i = render(conversation[:i]) with a generation prompt,
        reply_i = what rendering conversation[:i+1] adds after it; the next prompt (at the next assistant
        message, or the whole conversation) must start with prompt_i + reply_i.

        >>> conv = [{"role": "user", "content": "a"},
        ...         {"role": "assistant", "content": "b", "reasoning_content": "r"},
        ...         {"role": "user", "content": "c"}]
        >>> [f.offset for f in ChatTemplate.from_name("qwen3").check_append_only(conv)]
        [51]
        """
        msgs = validate_messages(conversation)
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        findings = []
        for turn, i in enumerate(assistants):
            if i == 0 or i == len(msgs) - 1:
                continue  # no prompt before it, or no next turn after it
            prompt = self.render(msgs[:i], tools=tools, add_generation_prompt=True, **render_kwargs)
            with_reply = self.render(msgs[:i + 1], tools=tools, add_generation_prompt=False, **render_kwargs)
            if not with_reply.startswith(prompt):
                k = _first_difference(prompt, with_reply)
                findings.append(AppendOnlyFinding(turn, i, k, _context(prompt, k, context),
                                                  _context(with_reply, k, context), "generation_prompt"))
                continue
            later = [j for j in assistants if j > i]
            nxt = self.render(msgs[:later[0]] if later else msgs, tools=tools, add_generation_prompt=True,
                              **render_kwargs)
            if not nxt.startswith(with_reply):
                k = _first_difference(with_reply, nxt)
                findings.append(AppendOnlyFinding(turn, i, k, _context(with_reply, k, context),
                                                  _context(nxt, k, context)))
        return findings


_REASONING_NAMES = ("reasoning_content", "thinking", "reasoning")


def _alias_reasoning(messages: list[dict]) -> list[dict]:
    """A message's reasoning under both names templates read, as transformers' `render_jinja_template` passes
    it: `reasoning_content` (most templates) and `thinking` (gpt-oss), from the first of the two (or
    `reasoning`) that is set; a `thinking` the message already has is kept.

    >>> _alias_reasoning([{"role": "assistant", "content": "4", "reasoning_content": "2+2"}])
    [{'thinking': '2+2', 'role': 'assistant', 'content': '4', 'reasoning_content': '2+2'}]
    """
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_NAMES if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out


_MAX_TEMPLATE_FILE = 16 * 1024 * 1024


def _read_text(path: Path) -> str:
    """A template or config file's text: a regular file of at most 16 MiB, UTF-8 (a ValueError naming it)."""
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"path: {path} is not a regular file")
    if st.st_size > _MAX_TEMPLATE_FILE:
        raise ValueError(f"path: {path} is {st.st_size} bytes, over the {_MAX_TEMPLATE_FILE}-byte limit for a "
                         "chat template or tokenizer config")
    try:
        return path.read_bytes()[:_MAX_TEMPLATE_FILE + 1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"path: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"path: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, Mapping):
        raise ValueError(f"path: {path} must hold a JSON object")
    return data


def _folder_special_tokens(folder: Path) -> dict[str, str]:
    """bos/eos/... strings of a model folder: tokenizer_config.json, filled in from special_tokens_map.json."""
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        f = folder / name
        if f.is_file():
            out.update(_special_tokens(_read_json(f)))
    return out


def _special_tokens(config: Mapping) -> dict[str, str]:
    out = {}
    for key in _SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):  # {"content": "<|im_end|>", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out

"""Render a ChatRequest into prompt text, with what the output parser must know about the assistant turn.

>>> from strata_lab.text.template import ChatTemplate
>>> from strata_lab.server.request import parse_openai
>>> rendered = render_prompt(ChatTemplate.from_name("qwen3"),
...                  parse_openai({"messages": [{"role": "user", "content": "hi"}], "assistant_prefix": "Hello"}))
>>> rendered.prompt_text.endswith("assistant\\n<think>\\n\\n</think>\\n\\nHello"), rendered.assistant_text
(True, '<think>\\n\\n</think>\\n\\nHello')
"""
from __future__ import annotations

from strata_lab.server.errors import RequestError
from strata_lab.server.generation import RenderedPrompt
from strata_lab.server.output import OutputParser
from strata_lab.server.request import ChatRequest

__all__ = ["render_prompt", "ASSISTANT_HEADER"]

ASSISTANT_HEADER = "<|im_start|>assistant\n"


def render_prompt(template, req: ChatRequest) -> RenderedPrompt:
    """Render `req` with `template`; a template complaint becomes a 400 naming the field.

    A thinking budget means "think, up to N tokens": if the rendered turn does not already open a
    reasoning block, the prompt opens one, so the budget has something to count.
    """
    from strata_lab.text.template import TemplateInputError, TemplateRenderError

    try:
        # tool_choice "none": the model is not shown the tools, so it writes a message
        tools = None if req.features.tool_choice == "none" else req.tools
        text = template.render(req.messages, tools=tools, add_generation_prompt=True,
                               assistant_prefix=req.assistant_prefix, enable_thinking=req.enable_thinking,
                               response_format=req.response_format)
    except TemplateInputError as exc:
        field = f"messages[{exc.index}].{exc.field}" if exc.index is not None else exc.field
        raise RequestError(field, str(exc).split(": ", 1)[-1]) from None
    except TemplateRenderError as exc:
        raise RequestError("messages", str(exc)) from None
    cut = text.rfind(ASSISTANT_HEADER)
    assistant = text[cut + len(ASSISTANT_HEADER):] if cut >= 0 else ""
    if req.thinking_budget is not None and req.assistant_prefix is None and req.enable_thinking is not False:
        probe = OutputParser()
        probe.prime(assistant)
        if probe.state == "content" and not assistant:
            text += "<think>\n"
            assistant += "<think>\n"
    return RenderedPrompt(prompt_text=text, assistant_text=assistant, prefix_text=req.assistant_prefix)

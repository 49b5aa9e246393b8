"""Every request field the server reads, per route: what it does, or why it is refused. One table.

`FIELDS` lists the fields the parsers read (request.py, features.py, completions.py, responses.py) with
the routes that read them; the refusals of unsupported.py and responses.py are added from those tables
themselves. `markdown()` renders the table that docs/SERVER_BEHAVIOUR.md holds between its markers;
`python -m strata_lab.server.fields --write docs/SERVER_BEHAVIOUR.md` regenerates it, and
tests/test_server_fields.py checks that the doc is current, that every field a route's OpenAPI schema
names is here, and that each route really reads each field it lists (a wrong value is a 400 naming it).

Routes: C /v1/chat/completions (and /chat/completions, /apply-template), M /v1/messages,
O /v1/completions, L llama.cpp /completion, R /v1/responses, T /tokenize, D /detokenize.

>>> "logit_bias" in {f.name for f in FIELDS} and routes_of("logit_bias") == "CMOLR"
True
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Field", "FIELDS", "ROUTES", "routes_of", "markdown", "refusals", "BEGIN", "END"]

ROUTES = {"C": "/v1/chat/completions", "M": "/v1/messages", "O": "/v1/completions", "L": "/completion",
          "R": "/v1/responses", "T": "/tokenize", "D": "/detokenize"}
BEGIN, END = "<!-- fields:begin (generated: python -m strata_lab.server.fields --write) -->", "<!-- fields:end -->"
BAD: Any = ("__bad__",)  # the default wrong value (sent as the object {"__bad__": 1}) a test uses to see a field is read


@dataclass(frozen=True)
class Field:
    name: str
    routes: str          # letters of ROUTES
    does: str            # what it does (implemented), with the values refused if any
    bad: Any = BAD       # a value the route answers with a 400 naming this field (BAD: {"__bad__": 1})

    @property
    def bad_value(self) -> Any:
        return {"__bad__": 1} if self.bad == BAD else self.bad


_SAMPLER = "CMOLR"
FIELDS: tuple[Field, ...] = (
    # --- the prompt
    Field("messages", "CM", "the conversation, rendered by the chat template", "x"),
    Field("system", "M", "the system prompt (text or text blocks)", 5),
    Field("prompt", "OL", "text (no template) or token ids, as given; a batch of them (not streamed): O one body, "
          "choice index = prompt * n + j; L a list of results, as llama-server", 5.5),
    Field("input", "R", "text, or message / function_call / function_call_output / reasoning items", 5),
    Field("instructions", "R", "a system message for this response only (not carried by previous_response_id)",
          5),
    Field("previous_response_id", "R",
          "continue a held response's conversation (the same API key's, bounded and expiring: docs/SECURITY.md)", 5),
    Field("assistant_prefix", "CM", "text the reply starts with (prompt tokens, never echoed)", 5),
    Field("continue_final_message", "C", "continue the final assistant message instead of opening a turn", "x"),
    Field("add_generation_prompt", "C", "accepted when it agrees with continue_final_message (true without, "
          "false with); anything else refused", False),
    Field("chat_template_kwargs", "C", "enable_thinking only; other keys refused", "x"),
    Field("enable_thinking", "CR", "the template's thinking switch", "x"),
    Field("thinking", "M", "{type: enabled, budget_tokens} or {type: disabled}", "x"),
    Field("thinking_budget", "CR", "stop the thought after N ids, close it and go on", "x"),
    Field("reasoning", "R", "{effort: none} turns thinking off; effort levels are refused", "x"),
    Field("model", "CMOLR", "echoed back; one model is served", 5),
    # --- length and stopping
    Field("max_tokens", "CMOL", "output cap (M: required; O: default 16; L: synonym of n_predict)", "x"),
    Field("max_completion_tokens", "C", "output cap, before max_tokens", "x"),
    Field("max_output_tokens", "R", "output cap (>= 1)", "x"),
    Field("n_predict", "COL", "llama.cpp's output cap: 0 prompt only, -1 up to the context (C/O: after max_tokens)",
          "x"),
    Field("stop", "COLR", "stop sequences (C/O: a string or up to 4); the text ends before the first", 5),
    Field("stop_sequences", "M", "stop sequences; stop_reason stop_sequence", 5),
    # --- sampling (engine sampler: strata_lab/engine.py Sampling)
    Field("temperature", _SAMPLER, "0 greedy; C/O/L/R 0..2, M 0..1", "x"),
    Field("top_p", _SAMPLER, "nucleus filter (0, 1]; below 1e-6 keeps the top token (sampler values table)", "x"),
    Field("top_k", _SAMPLER, "keep the k most likely ids (0 off)", "x"),
    Field("min_p", _SAMPLER, "keep ids with p >= min_p * p_max", "x"),
    Field("seed", _SAMPLER, "the sampler seed; none: the server's `--seed`, else a fresh one per request, "
          "reported as `seed`", "x"),
    Field("logit_bias", _SAMPLER, "{id or text: bias} or [[id or text, bias or false]]: bias added to the raw "
          "logit (a text: each id of its encoding, llama.cpp); -100 / false bans the id", "x"),
    Field("frequency_penalty", _SAMPLER, "OpenAI: logit -= count * f over this reply's ids (-2..2)", "x"),
    Field("presence_penalty", _SAMPLER, "OpenAI: logit -= p once an id is in this reply (-2..2)", "x"),
    Field("repetition_penalty", _SAMPLER, "HF / llama.cpp: ids in the last repeat_last_n of prompt + reply: "
          "logit > 0 ? logit / r : logit * r", "x"),
    Field("repeat_penalty", _SAMPLER, "llama.cpp's name of repetition_penalty", "x"),
    Field("repeat_last_n", _SAMPLER, "the repetition window (default 64; -1 all; 0 off)", "x"),
    Field("ignore_eos", _SAMPLER, "llama.cpp: the end-of-turn ids get a -100 bias (never sampled)", "x"),
    # --- choices and log probabilities
    Field("n", "CMOL", "choices from one prefill (C streams them; O: not streamed; M and L: 1 only)", "x"),
    Field("logprobs", "CMOL", "C: true/false; O/L: number of alternatives (M refuses it)", "x"),
    Field("top_logprobs", "CMOL", "C: alternatives per id, with logprobs: true (M/O/L refuse it)", "x"),
    Field("n_probs", "CMOL", "llama.cpp: alternatives per id (M refuses it)", "x"),
    Field("prompt_logprobs", "CMOL", "C (vLLM): each prompt id's logprob, not streamed; O/L refuse it "
          "(O: echo with logprobs), M refuses it", "x"),
    Field("return_tokens", "OL", "L: false leaves out `tokens` (sent by default here); O refuses it", "x"),
    Field("return_token_ids", "COL", "C/O (vLLM): `prompt_token_ids` (C: in the body, a stream's first chunk; O: "
          "per choice) and each choice's generated `token_ids` (a stream: in its finishing chunk); L refuses it "
          "(`tokens`)", "x"),
    Field("echo", "OL", "O: the prompt (and its logprobs) before the reply; L refuses it", "x"),
    # --- tools and structured output
    Field("tools", "CMR", "function tools, in the template's tool syntax", "x"),
    Field("parallel_tool_calls", "CR", "false: the reply ends after its first tool call", "x"),
    Field("tool_choice", "CMOLR", "auto / none / required / a named tool: the grammar forces the call (after "
          "the thought when thinking is on); O/L refuse it (no tools)", "x"),
    Field("response_format", "CM", "text / json_object (an optional schema) / json_schema: grammar + check",
          "x"),
    Field("text", "R", "{format: text / json_object / json_schema}", "x"),
    Field("grammar", _SAMPLER, "a GBNF grammar (llama.cpp); one output constraint per request", 5),
    Field("json_schema", _SAMPLER, "a JSON schema the output follows (llama.cpp; SGLang: its JSON text)", 5),
    Field("guided_json", _SAMPLER, "vLLM: a JSON schema (or its text) the output follows", 5),
    Field("guided_regex", _SAMPLER, "vLLM: a regular expression the whole output matches", 5),
    Field("guided_choice", _SAMPLER, "vLLM: the output is exactly one of these strings", "x"),
    Field("guided_grammar", _SAMPLER, "vLLM: an EBNF / GBNF grammar (xgrammar's syntax)", 5),
    Field("regex", _SAMPLER, "SGLang: a regular expression the whole output matches", 5),
    Field("ebnf", _SAMPLER, "SGLang: an EBNF / GBNF grammar (xgrammar's syntax)", 5),
    Field("structured_outputs", _SAMPLER, "vLLM: one of json / regex / choice / grammar / json_object; other "
          "keys refused", "x"),
    # --- vLLM / SGLang token controls (controls.py)
    Field("stop_token_ids", _SAMPLER, "vLLM: these ids end the output too (their text left out)", "x"),
    Field("min_tokens", _SAMPLER, "vLLM: the end-of-turn ids and stop_token_ids are masked, and stop "
          "sequences not looked for, until this many ids are out", "x"),
    Field("min_new_tokens", _SAMPLER, "SGLang's name of min_tokens", "x"),
    Field("include_stop_str_in_output", _SAMPLER, "vLLM: the stop sequence (or stop id's text) that ended the "
          "output stays in it", "x"),
    Field("no_stop_trim", _SAMPLER, "SGLang's name of include_stop_str_in_output", "x"),
    Field("allowed_token_ids", _SAMPLER, "vLLM: only these ids can be sampled (the end-of-turn ids only if "
          "listed)", "x"),
    Field("bad_words", _SAMPLER, "vLLM: words never completed (a word's last id is masked where the reply "
          "ends with its other ids; with and without a leading space)", "x"),
    Field("truncate_prompt_tokens", _SAMPLER, "vLLM: keep the prompt's last k ids (-1: the last context-many)",
          "x"),
    Field("separate_reasoning", "CR", "SGLang: true (the thinking is always given apart); false refused", "x"),
    # --- transport, slots, storage
    Field("stream", "CMOLR", "server-sent events; the frames carry what the whole body does", "x"),
    Field("stream_options", "CO", "include_usage: a last chunk with the usage (L refuses it)", "x"),
    Field("id_slot", "CMOL", "run on this slot (-1: the server picks)", "x"),
    Field("cache_prompt", "CMOL", "false: read the whole prompt again", "x"),
    Field("user", "COR", "slot key: requests with one key stick to one slot", 5),
    Field("metadata", "MR", "M: user_id is the slot key; R: echoed back", "x"),
    Field("store", "R", "false: not held for previous_response_id", "x"),
    # --- utilities
    Field("content", "T", "the text to encode", 5),
    Field("add_special", "T", "llama.cpp: add the BOS id; Qwen's vocabularies have none, so nothing is added", "x"),
    Field("with_pieces", "T", "each id with its text (or its bytes when they are not whole UTF-8)", "x"),
    Field("tokens", "D", "the ids to decode", "x"),
)

# refusals that live in code paths rather than in unsupported.py / responses.py's tables
_INLINE_REFUSALS = (
    ("M", "n", "n > 1: one message per request"),
    ("M", "logprobs / top_logprobs / n_probs / prompt_logprobs", "Anthropic messages carry no log probabilities"),
    ("L", "n / echo / stream_options", "one completion per request, as llama.cpp's /completion"),
    ("OL", "tool_choice", "a raw completion takes no tools"),
    ("OL", "top_logprobs / prompt_logprobs", "chat fields: use logprobs (and echo)"),
    ("C", "prompt_logprobs with stream", "prompt logprobs are served whole only"),
    ("O", "stream with n > 1 or a batch", "served whole only"),
    ("L", "stream with a batch", "served whole only"),
    ("CR", "separate_reasoning: false", "the reply's thinking is always given apart (reasoning_content)"),
    ("CMOLR", "structured_outputs.structural_tag / whitespace_pattern / disable_*", "only their defaults"),
    ("CMOLR", "two output constraints", "one of grammar, json_schema, guided_*, regex, ebnf, structured_outputs"),
)


def routes_of(name: str) -> str:
    return "".join(f.routes for f in FIELDS if f.name == name)


def refusals() -> list[tuple[str, str, str]]:
    """(routes, field, why) of every refusal: unsupported.py's and responses.py's tables, then the inline ones."""
    from strata_lab.server.responses import RESPONSES_REFUSED
    from strata_lab.server.unsupported import UNSUPPORTED

    letters = {"openai": "CR", "anthropic": "M", "completions": "OL"}  # /v1/responses applies chat's refusals
    merged: dict[tuple[str, str], str] = {}  # (field, why) -> routes, in table order
    for d, name, _, why in UNSUPPORTED:
        merged[(name, why)] = merged.get((name, why), "") + letters[d]
    for name, _, why in RESPONSES_REFUSED:
        merged[(name, why)] = merged.get((name, why), "") + "R"
    return [(routes, name, why) for (name, why), routes in merged.items()] + list(_INLINE_REFUSALS)


def markdown() -> str:
    """The field table as it stands in docs/SERVER_BEHAVIOUR.md (between BEGIN and END)."""
    head = "| field | " + " | ".join(ROUTES) + " | what it does |"
    rule = "|---|" + "---|" * len(ROUTES) + "---|"
    lines = [BEGIN, "", "Routes: " + ", ".join(f"{k} `{v}`" for k, v in ROUTES.items()) + ". "
             "A field no route reads is not looked at; every field below is either implemented or refused "
             "with a 400 naming it (`code: unsupported_parameter`).", "", "### Implemented", "", head, rule]
    for f in sorted(FIELDS, key=lambda f: f.name):
        marks = " | ".join("x" if k in f.routes else "" for k in ROUTES)
        lines.append(f"| `{f.name}` | {marks} | {f.does} |")
    lines += ["", "### Refused", "", "| field | " + " | ".join(ROUTES) + " | why |", rule]
    for routes, name, why in refusals():
        marks = " | ".join("x" if k in routes else "" for k in ROUTES)
        lines.append(f"| `{name}` | {marks} | {why} |")
    return "\n".join(lines + ["", END])


def write(path: str | Path) -> bool:
    """Put markdown() between the markers of `path` (appended when it has none); True if it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        new = text[:text.index(BEGIN)] + markdown() + text[text.index(END) + len(END):]
    else:
        new = text.rstrip("\n") + "\n\n## Request fields, per route\n\n" + markdown() + "\n"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Regenerate the request-field table of docs/SERVER_BEHAVIOUR.md")
    ap.add_argument("--write", metavar="DOC", help="the doc to update (else print the table)")
    args = ap.parse_args()
    if args.write:
        print("updated" if write(args.write) else "up to date", args.write)
    else:
        print(markdown())

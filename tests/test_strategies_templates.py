"""The hypothesis strategies under other chat templates and tokenizers than Qwen's ChatML: agent sessions whose
prompts are the template's renders and whose replies end with its end-of-turn id, texts with the tokenizer's
own special strings, conversations whose tool-call arguments DeepSeek V3.1's shipped template can render."""
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from strata_lab import ChatTemplate, load_tokenizer
from strata_lab.text.structure import TemplateStructure
from strata_lab.text.template import TemplateRenderError
from strata_lab.testing.strategies import agent_sessions, conversations, texts

from tokenizer_families import build

# sessions render a template per turn: on a loaded machine drawing them is slow, which is no failure
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a search that stops at the first example found (shrinking sessions is slow)
FIRST = settings(max_examples=200, deadline=None, phases=(Phase.generate,), database=None,
                 suppress_health_check=[HealthCheck.too_slow])
TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
MISTRAL_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}   # Devstral's template writes {{ eos_token }}

# fixture file (tests/fixtures/templates/...), the marker it ends a reply's turn with
REAL = {
    "qwen3": ("llama.cpp/Qwen-Qwen3-0.6B.jinja", "<|im_end|>"),
    "deepseek": ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜end▁of▁sentence｜>"),     # as shipped: splices strings
    "llama": ("llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>"),
    "devstral": ("llama.cpp/unsloth-mistral-Devstral-Small-2507.jinja", "</s>"),
}


def real(name: str) -> ChatTemplate:
    t = ChatTemplate.from_file(TEMPLATES / REAL[name][0])
    return ChatTemplate(t.source, name=t.name, special_tokens=MISTRAL_SPECIAL) if name == "devstral" else t


def check_session(session, template, tokenizer, end):
    assert session
    for turn in session:
        assert template.render(turn.messages, tools=turn.tools) == turn.prompt
        assert turn.reply_ids[-len(end):] == end
        assert all(0 <= i < tokenizer.vocab_size for i in turn.reply_ids)
        assert turn.messages[-1]["role"] in ("user", "tool")
    for a, b in zip(session, session[1:]):
        assert b.messages[:len(a.messages)] == a.messages


@pytest.mark.parametrize("name", sorted(REAL))
def test_agent_sessions_render_with_the_template(qwen3, name):
    template = real(name)
    marker = REAL[name][1]
    assert TemplateStructure.of(template).turn_end == marker
    end = [qwen3.added_tokens[marker]] if marker in qwen3.added_tokens else qwen3.encode(marker)

    @FEW
    @given(agent_sessions(qwen3, max_turns=3, template=template))
    def check(session):
        check_session(session, template, qwen3, end)

    check()


def test_agent_sessions_reach_tool_calls_and_reasoning(qwen3):
    template = real("deepseek")   # splices the arguments: the reply's tool call carries a JSON string
    s = find(agent_sessions(qwen3, max_turns=2, template=template),
             lambda s: len(s) == 2 and s[1].messages[-1]["role"] == "tool",
             settings=FIRST)
    call = s[1].messages[-2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], str) and len(call["id"]) == 9
    # reasoning where the template has markers (qwen3), written before the reply's content
    s = find(agent_sessions(qwen3, max_turns=2),
             lambda s: len(s) == 2 and s[1].messages[-2].get("reasoning_content", "").strip() != "",
             settings=FIRST)
    text = qwen3.decode(s[0].reply_ids)
    assert text.index(s[1].messages[-2]["reasoning_content"].strip()) < text.index("</think>")


@pytest.mark.parametrize("family,name", [("llama3", "llama"), ("deepseek_v3", "deepseek"), ("mistral", "devstral")])
def test_agent_sessions_end_with_the_families_end_of_turn_id(tmp_path, family, name):
    # the model's own tokenizer has the marker as one added token: each reply ends with that id
    tok = load_tokenizer(build(family, tmp_path))
    template = real(name)
    end_id = tok.token_id(REAL[name][1])

    @FEW
    @given(agent_sessions(tok, max_turns=2, template=template))
    def check(session):
        check_session(session, template, tok, [end_id])

    check()


def test_agent_sessions_default_template_is_the_folders(tmp_path):
    folder = build("llama3", tmp_path)
    shutil.copy(TEMPLATES / REAL["llama"][0], folder / "chat_template.jinja")
    tok = load_tokenizer(folder)
    s = find(agent_sessions(tok), lambda s: True, settings=FIRST)
    assert s[0].prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert s[0].reply_ids[-1] == tok.token_id("<|eot_id|>")


def test_agent_sessions_refuse_a_template_without_end_of_turn(qwen3, tmp_path):
    bare = ChatTemplate.from_file(TEMPLATES / REAL["devstral"][0])   # no eos_token: the turn ends with nothing
    with pytest.raises(ValueError, match="template: 'unsloth-mistral-Devstral-Small-2507' writes no end-of-turn"):
        agent_sessions(qwen3, template=bare)
    with pytest.raises(ValueError, match="no chat template goes with tokenizer"):
        agent_sessions(load_tokenizer(build("llama3", tmp_path)))     # a folder without a template
    with pytest.raises(ValueError, match="template: must be a ChatTemplate"):
        agent_sessions(qwen3, template="qwen3")


def test_texts_mix_in_the_tokenizers_specials(qwen3, tmp_path):
    llama = load_tokenizer(build("llama3", tmp_path))
    assert find(texts(tokenizer=llama), lambda t: "<|eot_id|>" in t) == "<|eot_id|>"
    assert find(texts(tokenizer=qwen3), lambda t: "<|fim_prefix|>" in t) == "<|fim_prefix|>"  # not in FRAGMENTS
    assert find(texts(tokenizer=["[INST]", "[/INST]"]), lambda t: "[INST]" in t) == "[INST]"
    # and a half of one, where a model's text can stop inside it
    assert find(texts(tokenizer=llama), lambda t: "<|eot" in t and "<|eot_id|>" not in t) == "<|eot"

    @FEW
    @given(texts(tokenizer=llama))
    def check(t):
        assert "<|im_start|>" not in t and "<think>" not in t   # Qwen's strings are not mixed in

    check()
    with pytest.raises(ValueError, match="tokenizer: must be a Tokenizer"):
        texts(tokenizer=3)
    with pytest.raises(ValueError, match="pass a tokenizer as tokenizer="):
        texts(llama)


def test_conversations_render_under_deepseek_v31_as_shipped():
    shipped = real("deepseek")

    def has_calls(c):
        return any("tool_calls" in m for m in c["messages"])

    # mapping arguments (vLLM's parsed form): the shipped template cannot render them
    c = find(conversations(), has_calls, settings=FIRST)
    with pytest.raises(TemplateRenderError, match="concatenate"):
        shipped.render(c["messages"], tools=c["tools"] or None)
    c = find(conversations(template=shipped), has_calls, settings=FIRST)
    assert all(isinstance(call["function"]["arguments"], str)
               for m in c["messages"] for call in m.get("tool_calls", []))

    @settings(max_examples=30, deadline=None)
    @given(conversations(template=shipped))
    def check(c):
        assert shipped.render(c["messages"], tools=c["tools"] or None).endswith("<｜Assistant｜></think>")

    check()


def test_conversations_arguments_option():
    def arguments(c):
        return [call["function"]["arguments"] for m in c["messages"] for call in m.get("tool_calls", [])]

    c = find(conversations(arguments="string"), lambda c: arguments(c), settings=FIRST)
    assert all(isinstance(a, str) and isinstance(json.loads(a), dict) for a in arguments(c))
    c = find(conversations(arguments="either"), lambda c: {type(a) for a in arguments(c)} == {str, dict},
             settings=FIRST)
    # a template that serialises the arguments itself takes the mappings
    c = find(conversations(template=ChatTemplate.from_name("qwen3")), lambda c: arguments(c), settings=FIRST)
    assert all(isinstance(a, dict) for a in arguments(c))
    with pytest.raises(ValueError, match="arguments: must be one of"):
        conversations(arguments="json")
    with pytest.raises(ValueError, match="not both"):
        conversations(arguments="string", template=ChatTemplate.from_name("qwen3"))

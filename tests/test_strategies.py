"""Public hypothesis strategies: values are valid, hazards appear, failures shrink small."""
import unicodedata

from hypothesis import find, given, settings
from hypothesis import strategies as st

from strata_lab.testing.strategies import FRAGMENTS, agent_sessions, alternative_tokenizations, conversations, texts

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(texts())
def test_texts_are_str(t):
    assert isinstance(t, str)


def test_texts_shrink_to_one_fragment():
    assert find(texts(), lambda t: "<|im_end|>" in t) == "<|im_end|>"
    # shrinking ends on a single fragment (which one depends on the search, e.g. 'ğ' or 'çğıöşü')
    found = find(texts(), lambda t: "ğ" in t)
    assert found in FRAGMENTS and "ğ" in found


@SETTINGS
@given(st.data(), texts(8))
def test_alternative_tokenizations_spell_the_text(qwen3, data, t):
    ids = data.draw(alternative_tokenizations(qwen3, t))
    canonical = qwen3.encode(t)
    assert qwen3.ids_bytes(ids) == t.encode("utf-8")   # the text given, not its NFC form
    # added tokens stay whole
    added = set(qwen3.added_tokens.values())
    assert [i for i in ids if i in added] == [i for i in canonical if i in added]


def test_alternative_tokenizations_find_non_canonical_pieces(qwen3):
    ids = find(alternative_tokenizations(qwen3, " öğrenci"), lambda ids: len(ids) == 2)
    assert qwen3.ids_bytes(ids) == " öğrenci".encode()  # two vocabulary pieces, e.g. ' öğren' + 'ci'
    ids = find(alternative_tokenizations(qwen3, " öğrenci"), lambda ids: ids != [135992])
    assert qwen3.ids_bytes(ids) == " öğrenci".encode() and len(ids) >= 2
    split = find(alternative_tokenizations(qwen3, "ğ"), lambda ids: len(ids) == 2)
    assert split == [128, 253]  # two byte ids: half a character each
    assert find(alternative_tokenizations(qwen3, " hello"), lambda ids: True) == [23811]  # shrinks to canonical


@SETTINGS
@given(conversations())
def test_conversations_are_well_formed(c):
    messages = c["messages"]
    assert messages[-1]["role"] in ("user", "tool")
    for i, m in enumerate(messages):
        assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)
        for call in m.get("tool_calls", []):
            assert call["function"]["name"] in {t["function"]["name"] for t in c["tools"]} or not c["tools"]


def test_conversations_reach_tools_and_reasoning():
    c = find(conversations(), lambda c: any("tool_calls" in m and "reasoning_content" in m for m in c["messages"]))
    assert any(m["role"] == "tool" for m in c["messages"])


@SETTINGS
@given(st.data())
def test_agent_sessions_render_the_replies(qwen3, data):
    session = data.draw(agent_sessions(qwen3, max_turns=3))
    for turn in session:
        assert turn.prompt.endswith("<|im_start|>assistant\n")
        assert turn.reply_ids[-1] == qwen3.im_end_id
    # the history only grows; the prompts are the qwen3 template's renders of it, which is not append-only
    # (a reply after a tool output keeps its <think> block until the next user turn drops it)
    assert session[-1].prompt.startswith(session[0].prompt)
    for a, b in zip(session, session[1:]):
        assert b.messages[:len(a.messages)] == a.messages


def test_agent_sessions_reach_reply_divergence(qwen3):
    # some session renders a reply whose ids are not what BPE makes of its text
    s = find(agent_sessions(qwen3, max_turns=2),
             lambda s: len(s) == 2 and qwen3.encode(qwen3.decode(s[0].reply_ids)) != s[0].reply_ids,
             settings=settings(max_examples=300, deadline=None))
    assert s[1].prompt.startswith(s[0].prompt)


def test_fragments_cover_the_hazards():
    assert any(unicodedata.combining(ch) for f in FRAGMENTS for ch in f)
    assert {"<|im_", "</thi", "<|im_end|>", "\n\n", "123"} <= set(FRAGMENTS)


# The contracts over thousands of examples, every fragment pool and arbitrary characters included.
MANY = settings(max_examples=2000, deadline=None, derandomize=False)


@MANY
@given(st.data(), texts(10))
def test_alternative_tokenizations_spell_exactly_the_text_many(qwen3, data, t):
    ids = data.draw(alternative_tokenizations(qwen3, t))
    assert qwen3.ids_bytes(ids) == t.encode("utf-8")
    assert all(0 <= i < qwen3.vocab_size for i in ids)


def test_alternative_tokenizations_keep_unnormalized_text(qwen3):
    # the tokenizer's NFC would spell the composed character; the strategy spells what it was given
    for t in ("a\u0308\u0304", "e\u0301", "x \u1100\u1161<|im_end|>a\u0308"):
        assert qwen3.ids_bytes(qwen3.encode(t)) != t.encode() or t == "x"
        ids = find(alternative_tokenizations(qwen3, t), lambda ids: True)
        assert qwen3.ids_bytes(ids) == t.encode()


def test_conversations_render_many():
    from strata_lab import ChatTemplate

    template = ChatTemplate.from_name("qwen3")

    @settings(max_examples=1500, deadline=None)
    @given(conversations(max_turns=4))
    def check(c):
        text = template.render(c["messages"], tools=c["tools"] or None)
        assert text.endswith("<|im_start|>assistant\n")

    check()


def test_conversations_reach_tool_messages_with_ids():
    c = find(conversations(), lambda c: sum(m["role"] == "tool" for m in c["messages"]) >= 2)
    ids = [call["id"] for m in c["messages"] for call in m.get("tool_calls", [])]
    assert [m["tool_call_id"] for m in c["messages"] if m["role"] == "tool"] == ids

"""The OpenAI reader's message conversion in C (strata_lab._replay.convert_messages) gives what the Python
conversion gives: the same dicts (key order and value types included), the same count of plain messages and
the same notes, on every wire shape a log may hold (content null or parts, reasoning in either field, tool calls
with object, null, number or missing arguments, ids of every type, names, unknown keys, non-objects)."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab.traces import openai

_TEXT = st.sampled_from(["", "hi", "é", "x y"])
_ARGS = st.one_of(st.none(), st.just(""), st.just('{"a": 1}'), st.just({"a": 1}), st.just({"a": "b"}), st.just(3),
                  st.just([1]), st.just({}))
_FUNCTION = st.one_of(st.builds(lambda n, a: {k: v for k, v in (("name", n), ("arguments", a)) if v != "-"},
                                st.sampled_from(["read", "", None, 5, "-"]), st.one_of(_ARGS, st.just("-"))),
                      st.none(), st.just({}), st.just("f"))
_CALL = st.one_of(st.builds(lambda i, t, f: {k: v for k, v in (("id", i), ("type", t), ("function", f)) if v != "-"},
                            st.sampled_from(["c1", "", None, 7, "-"]), st.sampled_from(["function", None, "-"]),
                            st.one_of(_FUNCTION, st.just("-"))),
                  st.just("not a call"))
_CONTENT = st.one_of(_TEXT, st.none(), st.just([{"type": "text", "text": "p"}, {"type": "image_url"}]),
                     st.just([{"type": "text", "text": "p"}]), st.just(7), st.just({"type": "text", "text": "d"}))


@st.composite
def wire_message(draw):
    m = {}
    for key, values in (("role", st.sampled_from(["user", "system", "assistant", "tool", "developer", "function",
                                                    None, 3])),
                        ("content", _CONTENT),
                        ("tool_calls", st.one_of(st.none(), st.lists(_CALL, max_size=2), st.just("x"))),
                        ("tool_call_id", st.sampled_from(["c1", "", None, 1, 1.0])),
                        ("reasoning_content", st.one_of(_TEXT, st.none(), st.just(0))),
                        ("reasoning", st.one_of(_TEXT, st.none())),
                        ("name", st.sampled_from(["bob", 3, None])),
                        ("refusal", st.none()), ("n", st.sampled_from([1, 1.0, True]))):
        if draw(st.integers(0, 3)) == 0 or (key in ("role", "content") and draw(st.booleans())):
            m[key] = draw(values)
    return m


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(wire_message(), st.just("not an object"), st.just({"role": "user", "content": "u"}),
                          st.just({"role": "tool", "content": "r", "tool_call_id": "c1"})), max_size=5),
       st.integers(0, 5))
def test_native_conversion_is_the_python_conversion(messages, start):
    native = openai.native_fn("convert_messages")
    assert native is not None, "the compiled extension is built in every install"
    start = min(start, len(messages))
    notes_a, notes_b = ["kept"], ["kept"]
    try:
        got_b = openai._convert_py(messages[start:], notes_b)
    except (ValueError, TypeError, AttributeError) as exc:  # (a function that is a string: both raise the same)
        with pytest.raises(type(exc)):
            native(messages, start, notes_a, openai._convert_one)
        return
    got_a = native(messages, start, notes_a, openai._convert_one)
    assert got_a == got_b and notes_a == notes_b
    # the same types all the way down (1 == 1.0 == True, but a template writes them apart)
    assert repr(got_a) == repr(got_b)
    assert [list(m) for m in got_a[0]] == [list(m) for m in got_b[0]]


def test_the_common_shapes_convert_in_c():
    """What agent logs resend with every call converts without the Python function (it is not called)."""
    common = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "r"},
              {"role": "assistant", "content": "a", "reasoning_content": "why", "refusal": None}]

    def refuse(m, notes):
        raise AssertionError(f"left to Python: {m}")

    got = openai.native_fn("convert_messages")(common, 0, [], refuse)
    assert got == openai._convert_py(common, []) and got[1] == len(common)


_RESPONSE_VALUES = st.one_of(st.none(), st.just(""), st.just("txt"), st.just(0), st.just(12), st.just([]),
                             st.just({}), st.just({"cached_tokens": 3}), st.just([1, 2]))


@st.composite
def response(draw):
    """chat.completion bodies as servers and SDKs write them, and odd ones."""
    message = {}
    for key, values in (("content", st.one_of(_TEXT, st.none(), st.just(5))),
                        ("reasoning_content", st.one_of(_TEXT, st.none(), st.just(0))),
                        ("reasoning", st.one_of(_TEXT, st.none())),
                        ("tool_calls", st.one_of(st.none(), st.lists(_CALL, max_size=2), st.just("x"), st.just({})))):
        if draw(st.booleans()):
            message[key] = draw(values)
    choice = {"message": message} if draw(st.integers(0, 5)) else {"message": draw(st.sampled_from([None, "m"]))}
    if draw(st.booleans()):
        choice["finish_reason"] = draw(st.sampled_from(["stop", "length", None]))
    body = {"choices": [choice] if draw(st.integers(0, 6)) else draw(st.sampled_from([[], None, ["x"]]))}
    for key, values in (("model", st.sampled_from(["m", "", None])), ("id", st.sampled_from(["r1", "", None, 4])),
                        ("usage", st.one_of(st.builds(lambda p, c, d: {"prompt_tokens": p, "completion_tokens": c,
                                                                        "prompt_tokens_details": d},
                                                      st.sampled_from([9, None]), st.sampled_from([2, None]),
                                                      _RESPONSE_VALUES), _RESPONSE_VALUES)),
                        ("prompt_token_ids", st.sampled_from([[1, 2], None])),
                        ("timings", st.sampled_from([{"cache_n": 4}, None]))):
        if draw(st.integers(0, 2)) == 0:
            body[key] = draw(values)
    return body


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(response(), st.sampled_from([None, "before"]))
def test_native_reply_and_usage_are_the_python_ones(body, before):
    """strata_lab._replay.apply_response writes the fields `_apply_response_py` writes (the same values and
    types), or leaves the call untouched and says so, on chat.completion bodies of every shape."""
    from strata_lab.traces.log_calls import new_call

    native = openai.native_fn("apply_response")
    assert native is not None, "the compiled extension is built in every install"
    a, b = new_call(model=before, request_id=before), new_call(model=before, request_id=before)
    untouched = dict(a)
    try:
        openai._apply_response_py(b, body)
    except (AttributeError, TypeError, KeyError):
        assert native(a, body) is False and a == untouched
        return
    if native(a, body):
        assert repr(a) == repr(b)
    else:
        assert a == untouched


def test_the_common_reply_is_read_in_c():
    from strata_lab.traces.log_calls import new_call

    call = new_call(model="m")
    body = {"id": "r1", "choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                                   "prompt_tokens_details": {"cached_tokens": 4}}}
    assert openai.native_fn("apply_response")(call, body) is True
    assert call["response_tool_calls"][0]["function"]["name"] == "read" and call["cached_tokens"] == 4

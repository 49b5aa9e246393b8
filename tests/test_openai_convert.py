"""The OpenAI reader's conversion of wire messages (`openai._convert`) writes the common shapes directly; what
it gives is what the general `_message` gives: the same dicts (key order and value types included), the same
count of plain messages and the same notes, on every wire shape a log may hold (content null or parts,
reasoning in either field, tool calls with object, null, number or missing arguments, ids of every type,
names, unknown keys, non-objects), from any start."""
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


def _general(messages: list, notes: list) -> tuple[list[dict], int]:
    """`_convert` by `_message` alone, message by message."""
    out, plain = [], 0
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError(f"message must be an object, got {type(m).__name__}")
        mine: list = []
        out.append(openai._message(m, mine))
        if plain == len(out) - 1 and not mine and openai._no_numbers(m):
            plain += 1
        notes.extend(n for n in mine if n not in notes)
    return out, plain


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(wire_message(), st.just("not an object"), st.just({"role": "user", "content": "u"}),
                          st.just({"role": "system", "content": "s"}),
                          st.just({"role": "tool", "content": "r", "tool_call_id": "c1"})), max_size=5),
       st.integers(0, 5))
def test_the_common_shapes_convert_as_the_general_conversion(messages, start):
    start = min(start, len(messages))
    notes_a, notes_b = ["kept"], ["kept"]
    try:
        got_b = _general(messages[start:], notes_b)
    except (ValueError, TypeError, AttributeError) as exc:  # (a function that is a string: both raise the same)
        with pytest.raises(type(exc)):
            openai._convert(messages, notes_a, start)
        return
    got_a = openai._convert(messages, notes_a, start)
    assert got_a == got_b and notes_a == notes_b
    # the same types all the way down (1 == 1.0 == True, but a template writes them apart)
    assert repr(got_a) == repr(got_b)
    assert [list(m) for m in got_a[0]] == [list(m) for m in got_b[0]]

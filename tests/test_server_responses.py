"""Server tier, issue 31: the OpenAI Responses API (`POST /v1/responses`) with the openai SDK.

Text and message input, instructions, function tools and their outputs, previous_response_id chaining,
streaming events (`responses.stream`), usage with cached tokens, refused fields.
"""
import httpx
import openai
import pytest

from _strata_server import ServerProcess, tiny_model

CTX = 1024
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("responses"), "--model", str(tiny_model()), "--ctx", str(CTX)).wait()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_text_input_with_instructions_is_the_chat_answer(server, oa):
    r = oa.responses.create(model="m", input="Say hi", instructions="Be brief.", max_output_tokens=8, temperature=0)
    chat = oa.chat.completions.create(model="m", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 8
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == "Be brief." and r.max_output_tokens == 8
    # the same prompt as message items, content as parts
    items = oa.responses.create(model="m", instructions="Be brief.", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}])
    assert items.output_text == r.output_text


def test_previous_response_id_chains_the_conversation(server, oa):
    first = oa.responses.create(model="m", input="My name is Ada.", max_output_tokens=6, temperature=0)
    second = oa.responses.create(model="m", input="What is my name?", previous_response_id=first.id,
                                 max_output_tokens=6, temperature=0)
    assert second.previous_response_id == first.id
    chat = oa.chat.completions.create(model="m", max_tokens=6, temperature=0, messages=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert oa.responses.retrieve(second.id).output_text == second.output_text
    with pytest.raises(openai.BadRequestError) as exc:
        oa.responses.create(model="m", input="x", previous_response_id="resp_unknown", max_output_tokens=2)
    assert exc.value.body["param"] == "previous_response_id"


def test_usage_reports_cached_tokens(server, oa):
    body = dict(model="m", input="A long enough question about caching prompts.", instructions="Answer.",
                max_output_tokens=4, temperature=0)
    oa.responses.create(**body)
    before = len(server.lines())
    again = oa.responses.create(**body)
    line = server.lines()[before]
    assert again.usage.input_tokens_details.cached_tokens == line["reused"] > 0


def test_function_call_and_its_output(server, oa):
    r = oa.responses.create(model="m", input="Weather in Paris?", tools=TOOLS, tool_choice="required",
                            max_output_tokens=80, temperature=0)
    assert [o.type for o in r.output] == ["function_call"]  # no thought, no stray text
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    import json
    assert isinstance(json.loads(call.arguments)["city"], str)
    follow = oa.responses.create(model="m", previous_response_id=r.id, max_output_tokens=5, temperature=0, tools=TOOLS,
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    # the same conversation sent whole, as items
    whole = oa.responses.create(model="m", max_output_tokens=5, temperature=0, tools=TOOLS, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.usage.input_tokens == whole.usage.input_tokens and follow.output_text == whole.output_text
    named = oa.responses.create(model="m", input="x", tools=TOOLS, max_output_tokens=80, temperature=0,
                                tool_choice={"type": "function", "name": "get_weather"})
    assert [o.name for o in named.output] == ["get_weather"]


def test_stream_events_and_final_response_match_the_whole(server, oa):
    body = dict(model="m", input="Say hi", instructions="Be brief.", max_output_tokens=8, temperature=0)
    oa.responses.create(**body)  # the slot then holds the same ids before each of the next two
    whole = oa.responses.create(**body)
    with oa.responses.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.completed" and "response.output_text.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert final.usage.model_dump() == whole.usage.model_dump()
    assert final.status == whole.status
    # tool calls stream as items with their arguments
    with oa.responses.stream(model="m", input="Weather?", tools=TOOLS, tool_choice="required",
                             max_output_tokens=80, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and final.output[0].arguments == done[0].arguments
    assert final.output[0].id == done[0].item_id


@pytest.mark.parametrize("extra, field", [
    ({"background": True}, "background"), ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"effort": "high"}}, "reasoning"), ({"max_output_tokens": "8"}, "max_output_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"), ({"input": None}, "input")])
def test_refused_and_bad_fields_are_a_400_naming_them(server, extra, field):
    before = len(server.lines())
    r = httpx.post(server.url + "/v1/responses", json={"input": "x", **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert len(server.lines()) == before


def test_store_false_is_not_chained(server, oa):
    r = oa.responses.create(model="m", input="x", store=False, max_output_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError):
        oa.responses.create(model="m", input="y", previous_response_id=r.id, max_output_tokens=2)


def test_the_store_is_bounded():
    from strata_lab.server.responses import ResponseStore

    store = ResponseStore(max_entries=3)
    for i in range(5):
        store.put(f"r{i}", [], {"id": f"r{i}"})
    assert len(store) == 3 and store.get("r0") is None and store.get("r4")[1]["id"] == "r4"

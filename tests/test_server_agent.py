"""Server tier: a multi-turn agent session with tools, reply-id reuse on vs off; API keys; OpenAPI fuzz."""
import anthropic
import httpx
import openai
import pytest

from _strata_server import ServerProcess, tiny_model

TOOLS = [{"type": "function", "function": {"name": "run", "description": "run a shell command",
                                            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
TASKS = ["List the files, then count lines in [a-zçğıöşü] regex matches.", "Now sum 12345 + 67890.",
         "Explain the result in Turkish: öğrenci ünlü.", "Write a Python one-liner for it.", "Done? Summarise."]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    model = str(tiny_model())
    procs = {"on": ServerProcess(tmp, "--model", model, "--ctx", "2048", name="on"),
             "off": ServerProcess(tmp, "--model", model, "--ctx", "2048", "--no-reply-reuse", name="off"),
             # a request that names no output cap gets 8 tokens, not the context: the fuzz sends many
             "key": ServerProcess(tmp, "--model", model, "--ctx", "512", "--api-key", "s3cret",
                                  "--max-tokens-default", "8", name="key")}
    for p in procs.values():
        p.wait()
    yield procs
    for p in procs.values():
        p.stop()


def agent_session(srv):
    """Five turns: each reply goes back into the history as returned, with a tool result after it."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for k, task in enumerate(TASKS):
        messages.append({"role": "user", "content": task})
        r = client.chat.completions.create(model="x", messages=messages, tools=TOOLS, max_tokens=24, temperature=1.0,
                                           seed=k)
        msg = r.choices[0].message
        reply = {"role": "assistant", "content": msg.content or ""}
        call_id = f"call_{k}"
        reply["tool_calls"] = [{"id": call_id, "type": "function",
                                "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]
        messages += [reply, {"role": "tool", "tool_call_id": call_id, "content": f"output {k}: ok"}]
    return srv.lines()


def rereads(lines):
    """Per turn: ids the session held from the previous turn (prompt + reply) that were read again."""
    out = []
    for prev, cur in zip(lines, lines[1:]):
        held = prev["prompt_ids"] + prev["gen_ids"] + prev["drained_ids"]
        common = 0
        for a, b in zip(held, cur["prompt_ids"]):
            if a != b:
                break
            common += 1
        out.append((cur["reused"], len(prev["prompt_ids"]), common))
    return out


def test_agent_session_reply_reuse_on_and_off(servers, qwen3):
    on, off = agent_session(servers["on"]), agent_session(servers["off"])
    assert len(on) == len(off) == len(TASKS)
    reused_on = [line["reused"] for line in on]
    assert reused_on == sorted(reused_on) and len(set(reused_on)) == len(reused_on)  # grows every turn
    for reused, prev_prompt, common in rereads(on):
        assert reused >= prev_prompt  # at least the previous prompt, plus the reply's own ids
    assert any(line.get("encoder", {}).get("entry_kind") == "reply" for line in on[1:])
    # with reuse on, the previous reply's own ids are kept; with it off they are re-encoded (BPE) and re-read
    kept_on = sum(r - p for r, p, _ in rereads(on))
    kept_off = sum(r - p for r, p, _ in rereads(off))
    gen_on = sum(len(line["gen_ids"]) for line in on[:-1])
    assert kept_on > kept_off
    assert kept_on >= gen_on // 2


def test_api_key(servers):
    srv = servers["key"]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(srv.url + "/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(srv.url + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
    assert ok.chat.completions.create(model="x", messages=body["messages"], max_tokens=1).choices
    m = anthropic.Anthropic(base_url=srv.url, api_key="s3cret", max_retries=0).messages.create(
        model="x", max_tokens=1, messages=body["messages"])
    assert m.type == "message"


# every field that caps a request's output; other values, and invalid ones (a string, -5), reach the server as drawn
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")


def test_openapi_fuzz_has_no_server_errors(servers):
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    srv = servers["key"]
    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json", headers={"x-api-key": "s3cret"})
    failures = []
    count = 0
    for op_result in schema.get_all_operations():
        op = op_result.ok()

        @settings(max_examples=13, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def check(case):
            nonlocal count
            count += 1
            case.headers = {**(case.headers or {}), "x-api-key": "s3cret"}
            if isinstance(case.body, dict):  # a valid output cap stays short (-1: "up to the context")
                for cap in OUTPUT_CAPS:
                    value = case.body.get(cap)
                    if isinstance(value, int) and not isinstance(value, bool) and (value >= 8 or value == -1):
                        case.body[cap] = value % 8
            response = case.call(base_url=srv.url, timeout=30)
            if response.status_code >= 500:
                failures.append((case.method, case.path, case.body, response.status_code, response.text[:300]))

        check()
    assert count >= 50
    assert failures == []

"""Server tier, issue 31: one field table (strata_lab/server/fields.py), and nothing accepted and ignored.

- docs/SERVER_BEHAVIOUR.md holds the table exactly as the code generates it;
- every field any route's OpenAPI schema names (the served /openapi.json) is in the table for that route;
- every field the table lists for a route is read by that route: a wrong value is a 400 naming it, before
  any engine work; every refused field is a 400 `unsupported_parameter` naming it.
"""
from pathlib import Path

import httpx
import pytest

from _strata_server import ServerProcess, tiny_model
from strata_lab.server.fields import FIELDS, ROUTES, markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "SERVER_BEHAVIOUR.md"
USER = [{"role": "user", "content": "hi"}]
BASE = {"C": {"messages": USER, "max_tokens": 1}, "M": {"messages": USER, "max_tokens": 1},
        "O": {"prompt": "x", "max_tokens": 1}, "L": {"prompt": "x", "n_predict": 1},
        "R": {"input": "x", "max_output_tokens": 1}, "T": {"content": "x"}, "D": {"tokens": [1]}}
# which table route each served path belongs to
PATHS = {"/v1/chat/completions": "C", "/chat/completions": "C", "/apply-template": "C", "/v1/messages": "M",
         "/v1/messages/count_tokens": "M", "/v1/completions": "O", "/completions": "O", "/completion": "L",
         "/v1/responses": "R", "/responses": "R", "/tokenize": "T", "/detokenize": "D"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("fields"), "--model", str(tiny_model()), "--ctx", "512").wait()
    yield srv
    srv.stop()


def test_the_doc_holds_the_generated_table():
    assert markdown() in DOC.read_text(encoding="utf-8"), \
        "docs/SERVER_BEHAVIOUR.md is stale: python -m strata_lab.server.fields --write docs/SERVER_BEHAVIOUR.md"


def test_every_schema_field_of_every_route_is_in_the_table(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    table = {(f.name, r) for f in FIELDS for r in f.routes}
    missing, seen = [], 0
    for path, ops in spec["paths"].items():
        for op in ops.values():
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            if not body:
                continue
            for name in body.get("properties", {}):
                seen += 1
                if (name, PATHS[path]) not in table:
                    missing.append((path, name))
    assert seen > 40 and missing == [], missing


@pytest.mark.parametrize("route, field", [(r, f) for f in FIELDS for r in f.routes], ids=lambda x: getattr(x, "name", x))
def test_each_listed_field_is_read_by_its_route(server, route, field):
    before = len(server.lines())
    body = {**BASE[route], field.name: field.bad_value}
    r = httpx.post(server.url + ROUTES[route], json=body, timeout=30)
    assert r.status_code == 400, (route, field.name, r.text)
    err = r.json()["error"]
    assert (err.get("param") or err["message"]).startswith(field.name), (route, field.name, err)
    assert len(server.lines()) == before


REFUSED = [("O", {"suffix": "x"}), ("L", {"suffix": "x"}), ("O", {"best_of": 2}), ("C", {"add_generation_prompt": False}),
           ("R", {"background": True}), ("R", {"conversation": "c"}), ("R", {"prompt": {"id": "p"}}),
           ("R", {"include": ["x"]}), ("R", {"truncation": "auto"}),
           ("R", {"max_tool_calls": 1}), ("R", {"top_logprobs": 2}), ("R", {"reasoning": {"effort": "high"}}),
           ("M", {"logprobs": True}), ("M", {"n_probs": 2}), ("L", {"n": 2}), ("L", {"echo": True}),
           ("L", {"stream": True, "stream_options": {"include_usage": True}}), ("O", {"tool_choice": "required"}),
           ("O", {"top_logprobs": 2}), ("O", {"prompt_logprobs": 1}), ("C", {"chat_template_kwargs": {"x": 1}}),
           ("C", {"mirostat": 2}), ("L", {"mirostat": 2}),
           ("O", {"dry_multiplier": 0.8}), ("L", {"timings_per_token": True}), ("L", {"samplers": ["top_k"]}),
           ("O", {"return_tokens": True}), ("L", {"n_keep": 4}), ("C", {"typical_p": 0.5}),
           ("C", {"verbose": True}), ("R", {"timings_per_token": True}), ("R", {"mirostat": 1})]


@pytest.mark.parametrize("route, extra", REFUSED, ids=lambda x: x if isinstance(x, str) else next(iter(x)))
def test_refused_fields_say_so(server, route, extra):
    """(their harmless values pass: e.g. mirostat 0, typical_p 1; see unsupported.py)"""
    before = len(server.lines())
    r = httpx.post(server.url + ROUTES[route], json={**BASE[route], **extra}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    name = [k for k in extra if k != "stream"][0]
    assert err["param"].startswith(name) and err["code"] == "unsupported_parameter", err
    assert len(server.lines()) == before


def test_harmless_values_of_refused_fields_pass(server):
    for route, extra in (("C", {"mirostat": 0, "typical_p": 1.0}),
                         ("L", {"n_keep": 0, "timings_per_token": False, "samplers": None}),
                         ("O", {"best_of": 1, "suffix": ""})):
        r = httpx.post(server.url + ROUTES[route], json={**BASE[route], **extra}, timeout=30)
        assert r.status_code == 200, (route, r.text)

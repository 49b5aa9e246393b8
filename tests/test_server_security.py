"""Server tier, hostile clients: $ref retrieval, Host/Origin/content-type policy, CORS, API key sources.

Each test here was written against a hole found by attacking the server (issue 13) and failed before the fix.
"""
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from _strata_server import ServerProcess, free_port, tiny_model

USER = [{"role": "user", "content": "hi"}]
GOOD_ORIGIN = "http://good.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("sec"), "--model", str(tiny_model()), "--ctx", "512",
                        "--cors", GOOD_ORIGIN, "--allowed-host", "strata.internal",
                        "--max-tokens-default", "4", "--body-timeout", "1",
                        "--keep-alive-timeout", "1").wait()
    yield srv
    srv.stop()


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=30, **kw)


class _Hits(http.server.BaseHTTPRequestHandler):
    hits = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        _Hits.hits.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def listener():
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Hits)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    _Hits.hits.clear()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _schema_body(schema, **extra):
    return {"messages": USER, "max_tokens": 2, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, **extra}


# --- $ref: nothing is fetched, nothing is read, an unresolvable one is a 400 before any work ----------------
@pytest.mark.parametrize("stream", [False, True])
def test_remote_ref_is_never_fetched(server, listener, stream):
    before = len(server.lines())
    r = post(server, "/v1/chat/completions", _schema_body({"$ref": listener + "/s.json"}, stream=stream))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("response_format.json_schema.schema")
    assert "$ref" in r.json()["error"]["message"]
    assert _Hits.hits == [] and len(server.lines()) == before


def test_nested_remote_ref_with_base_id_is_never_fetched(server, listener):
    schema = {"$id": listener + "/root.json", "type": "object",
              "properties": {"a": {"$ref": "other.json"}, "b": {"items": {"$ref": listener + "/x"}}}}
    r = post(server, "/v1/chat/completions", _schema_body(schema))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema.schema.properties.a"
    assert _Hits.hits == []


@pytest.mark.parametrize("exists", [True, False])
def test_file_ref_is_never_read(server, tmp_path, exists):
    target = tmp_path / "secret.json"
    if exists:
        target.write_text('{"type": "string", "maxLength": 0}')
    before = len(server.lines())
    r = post(server, "/v1/messages", {**_schema_body({"$ref": target.as_uri()}), "max_tokens": 2})
    # the same answer whether or not the file exists: no existence probe
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema.schema"
    assert str(tmp_path) not in r.text or "$ref" in r.text
    assert len(server.lines()) == before


@pytest.mark.parametrize("stream", [False, True])
def test_unresolvable_local_ref_is_400_before_work(server, stream):
    before = len(server.lines())
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}
    r = post(server, "/v1/chat/completions", _schema_body(schema, stream=stream))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema.schema.properties.x"
    assert len(server.lines()) == before


def test_local_refs_still_work(server):
    schema = {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}}
    r = post(server, "/v1/chat/completions", _schema_body(schema, max_tokens=0))
    assert r.status_code in (200, 422), r.text  # 422: the tiny model's output does not match (checked after)


def test_endless_self_reference_is_400(server):
    r = post(server, "/v1/chat/completions", _schema_body({"allOf": [{"$ref": "#"}]}))
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("response_format")


# --- Host, Origin, content type, CORS -----------------------------------------------------------------------
def test_foreign_host_header_is_refused(server):
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1}, headers={"Host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(server.url + "/health", headers={"Host": "attacker.test:80"}).status_code == 403
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "strata.internal"):
        assert httpx.get(server.url + "/health", headers={"Host": host}).status_code == 200, host


def test_plain_text_post_from_a_page_is_refused(server):
    before = len(server.lines())
    body = json.dumps({"messages": USER, "max_tokens": 1})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers, timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", ctype
    ok = httpx.post(server.url + "/tokenize", content='{"content": "a"}',
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200
    assert len(server.lines()) == before


def test_foreign_origin_is_refused_and_the_allowed_one_gets_cors(server):
    body = {"messages": USER, "max_tokens": 1}
    r = post(server, "/v1/chat/completions", body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    ok = post(server, "/v1/chat/completions", body, headers={"Origin": GOOD_ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == GOOD_ORIGIN


def test_cors_preflight(server):
    pre = {"Origin": GOOD_ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type, authorization"}
    r = httpx.options(server.url + "/v1/chat/completions", headers=pre)
    assert r.status_code in (200, 204)
    assert r.headers["access-control-allow-origin"] == GOOD_ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "content-type" in r.headers["access-control-allow-headers"].lower()
    bad = httpx.options(server.url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})
    assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers


def test_no_cors_without_the_option(tmp_path):
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", "256").wait()
    try:
        r = httpx.options(srv.url + "/v1/chat/completions",
                          headers={"Origin": GOOD_ORIGIN, "Access-Control-Request-Method": "POST"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = httpx.get(srv.url + "/v1/models", headers={"Origin": GOOD_ORIGIN})
        assert r.status_code == 403
        assert httpx.get(srv.url + "/v1/models").status_code == 200
    finally:
        srv.stop()


# --- the API key from a file or the environment ----------------------------------------------------------------
def test_api_key_from_file_and_env(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("file-key\n")
    key_file.chmod(0o600)
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", "256", "--api-key-file", str(key_file),
                        name="keyfile").wait()
    try:
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers={"x-api-key": "file-key"}).status_code == 200
        assert "file-key" not in " ".join(srv.proc.args)
    finally:
        srv.stop()
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", "256", env={"STRATA_API_KEY": "env-key"},
                        name="keyenv").wait()
    try:
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer env-key"}).status_code == 200
    finally:
        srv.stop()


def _held(srv, key: str, total: int = 200):
    """A request in flight with `key`: its headers sent, its body never (held until --body-timeout)."""
    import socket

    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"x-api-key: {key}\r\nContent-Length: {total}\r\n\r\n").encode())
    return s


def test_several_keys_each_with_its_own_concurrency_limit(tmp_path):
    """Two keys, --max-client-requests 2: alice's two requests in flight get her a 429, while bob (same
    address) is served; the keys never show in the log, their names (or a hash) do."""
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nalice sk-alice-1\nbob sk-bob-2\nsk-nameless-3\n")
    key_file.chmod(0o600)
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", "256", "--api-key-file", str(key_file),
                        "--max-client-requests", "2", "--body-timeout", "20", "--max-tokens-default", "1",
                        name="keys").wait()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        for key in ("sk-alice-1", "sk-bob-2", "sk-nameless-3"):
            assert httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": key},
                              timeout=60).status_code == 200
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": "sk-other"},
                          timeout=60).status_code == 401
        held = [_held(srv, "sk-alice-1") for _ in range(2)]
        try:
            time.sleep(0.5)
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": "sk-alice-1"},
                           timeout=60)
            assert r.status_code == 429 and "the API key 'alice' already has 2 requests" in r.text, r.text
            assert "sk-alice" not in r.text
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-bob-2"},
                           timeout=60)
            assert r.status_code == 200, r.text
            for s in held:  # not blocked by alice: her requests are still held (no 408 yet), bob was served
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(1)
        finally:
            for s in held:
                s.close()
        time.sleep(0.5)
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": "sk-alice-1"},
                          timeout=60).status_code == 200  # her slots free again
        log = srv.log_text()
        from strata_lab.server.config import key_name

        assert "3 API keys: alice, bob, " + key_name("sk-nameless-3") in log, log
        assert "sk-alice-1" not in log and "sk-bob-2" not in log and "sk-nameless-3" not in log
    finally:
        srv.stop()


@pytest.mark.parametrize("text, message", [
    ("alice k1 extra\n", r"keys:1: a line is KEY or NAME KEY \(got 3 words\)"),
    ("alice k1\nalice k2\n", r"keys:2: the name 'alice' is given twice"),
    ("alice k1\nbob k1\n", r"keys:2: the same key as an earlier line"),
    ("# only a comment\n\n", r"keys: no key in it"),
])
def test_bad_key_files_are_one_line_errors_without_the_key(tmp_path, text, message):
    from strata_lab._spawn import child_process_args

    key_file = tmp_path / "keys"
    key_file.write_text(text)
    r = subprocess.run(**child_process_args(["serve", "--api-key-file", str(key_file), "--port", "0"]),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert re.search(message, r.stderr), r.stderr
    assert "k1" not in r.stderr and "k2" not in r.stderr


def test_help_says_where_the_key_can_come_from():
    from strata_lab.cli import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "STRATA_API_KEY" in help_text and "--api-key-file" in help_text
    flat = " ".join(help_text.split())
    assert "NAME KEY" in flat and "requests one API key may have in flight" in flat


# --- stalled uploads --------------------------------------------------------------------------------------------
def test_stalled_body_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"content\"")
        data = s.recv(4096)  # --body-timeout 1: the server answers and closes; before the fix this hung
    assert data.startswith(b"HTTP/1.1 408"), data[:200]


def test_idle_keep_alive_connection_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        rest = b""
        while chunk := s.recv(4096):  # --keep-alive-timeout 1: the server closes the idle connection
            rest += chunk
    assert b"HTTP/1.1" not in rest

"""Tests for tools/mock_model.py: pure parts, the HTTP server, and the real CLI.

The end-to-end tests drive the ``claude`` CLI bundled in the claude-agent-sdk
wheel against the mock server; they are skipped when the SDK is not importable.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mock_model as mm
import pytest

import spawn

# ---------------------------------------------------------------- helpers

MOCK_PATH = Path(mm.__file__)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _find_cli() -> Path:
    try:
        return spawn.find_cli({})
    except spawn.UsageError as exc:
        pytest.skip(str(exc))


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


class Server:
    def __init__(self, tmp: Path, scenario: dict[str, Any] | None = None, flags: tuple[str, ...] = ()) -> None:
        self.log = tmp / "requests.jsonl"
        args = [
            sys.executable,
            str(MOCK_PATH),
            "--port",
            "0",
            "--log",
            str(self.log),
            "--port-file",
            str(tmp / "port"),
            *flags,
        ]
        if scenario is not None:
            path = tmp / "scenario.json"
            path.write_text(json.dumps(scenario))
            args += ["--scenario", str(path)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        prefix = "mock_model listening on http://127.0.0.1:"
        assert line.startswith(prefix), line
        self.port = int(line[len(prefix) :])
        assert int((tmp / "port").read_text()) == self.port
        self.url = f"http://127.0.0.1:{self.port}"

    def post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path)
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


# ---------------------------------------------------------------- pure core


def test_task_text_string_and_blocks() -> None:
    assert mm.task_text([{"role": "user", "content": "hello"}]) == "hello"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "image", "source": {}},
                {"type": "text", "text": "task"},
            ],
        },
        {"role": "assistant", "content": "a"},
        _user("later"),
    ]
    assert mm.task_text(messages) == "<system-reminder>x</system-reminder>\ntask"
    assert mm.task_text([]) == ""


def test_inline_script_with_nested_escaped_json() -> None:
    inner = json.dumps([{"text": "inner ]MOCK"}])
    steps = [{"bash": "echo '{\"a\": [1]}'"}, {"text": f"child MOCK[{inner[1:]}"}]
    text = "prefix MOCK" + json.dumps(steps) + 'MOCK suffix MOCK[{"text": "second"}]MOCK'
    assert mm.extract_inline_script(text) == steps
    assert mm.extract_inline_script("no marker here") is None
    with pytest.raises(mm.ScriptError):
        mm.extract_inline_script("MOCK[{broken]MOCK")
    with pytest.raises(mm.ScriptError):
        mm.extract_inline_script("MOCK[1, 2]MOCK")


def test_rule_matching_and_default() -> None:
    scenario = mm.parse_scenario(
        {
            "rules": [
                {"match": r"alpha\d", "steps": [{"text": "A"}]},
                {"match": "alpha", "steps": [{"text": "B"}]},
            ],
            "default": [{"text": "D"}],
        }
    )
    assert mm.select_script("x alpha1 y", scenario) == [{"text": "A"}]
    assert mm.select_script("alpha", scenario) == [{"text": "B"}]
    assert mm.select_script("gamma", scenario) == [{"text": "D"}]
    assert mm.select_script('alpha1 MOCK[{"text": "I"}]MOCK', scenario) == [{"text": "I"}]
    assert mm.select_script("gamma", mm.Scenario()) == [{"text": "ok"}]
    with pytest.raises(mm.ScriptError):
        mm.parse_scenario({"rules": [{"match": "(", "steps": []}]})


def test_step_index_and_main_discriminator() -> None:
    messages = [
        _user("t"),
        {"role": "assistant", "content": "a"},
        _user("r"),
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "b"},
    ]
    assert mm.step_index(messages) == 2
    # Shapes observed from CLI 2.1.330: main loop, main loop under --tools "",
    # and the SDK's concurrent session-title query.
    assert mm.is_main_request({"tools": [{"name": "Bash"}], "messages": []})
    assert mm.is_main_request({"tools": [], "context_management": {}, "thinking": {}})
    title = {
        "tools": [],
        "output_config": {
            "effort": "medium",
            "format": {
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "properties": {"title": {"type": "string"}},
                    "required": ["title"],
                },
            },
        },
    }
    assert not mm.is_main_request(title)
    assert json.loads(mm.side_text(title)) == {"title": "mock"}
    assert not mm.is_main_request({"messages": []})
    assert mm.side_text({"messages": []}) == "ok"


def test_normalise_step_shorthands() -> None:
    bash = mm.normalise_step({"bash": "ls", "timeout": 5000, "sleep": 0.5})
    assert bash.tool == "Bash"
    assert bash.tool_input == {
        "command": "ls",
        "description": "scripted",
        "timeout": 5000,
    }
    assert bash.sleep == 0.5
    structured = mm.normalise_step({"structured": {"answer": 42}})
    assert (structured.tool, structured.tool_input) == (
        "StructuredOutput",
        {"answer": 42},
    )
    err = mm.normalise_step({"error": 529, "times": 2, "text": "recovered"})
    assert (err.error, err.times, err.text) == (529, 2, "recovered")
    with pytest.raises(mm.ScriptError):
        mm.normalise_step({"txet": "typo"})
    with pytest.raises(mm.ScriptError):
        mm.normalise_step({"bash": "ls", "tool": "Read"})


def test_error_body_shape() -> None:
    assert mm.error_body(529, "m") == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "m"},
    }
    assert mm.error_body(429, "m")["error"]["type"] == "rate_limit_error"
    assert mm.error_body(500, "m")["error"]["type"] == "api_error"
    assert mm.error_body(400, "m")["error"]["type"] == "invalid_request_error"


def _parse_sse(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    frames = body.decode().split("\n\n")
    assert frames[-1] == ""
    events = []
    for frame in frames[:-1]:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[len("data: ") :])
        assert data["type"] == event_line[len("event: ") :]
        events.append((data["type"], data))
    return events


def test_sse_framing_text_and_tool() -> None:
    long_cmd = "echo " + "x" * 200
    step = mm.normalise_step(
        {
            "text": "thinking aloud",
            "bash": long_cmd,
            "usage": {"input_tokens": 7, "output_tokens": 9},
        }
    )
    message = mm.build_message(step, "m-1", "msg_1", "toolu_1", 400)
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 7
    events = _parse_sse(mm.sse_body(message))
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["model"] == "m-1"
    assert "usage" in events[0][1]["message"]
    tool_deltas = [d["delta"]["partial_json"] for k, d in events if k == "content_block_delta" and d["index"] == 1]
    assert len(tool_deltas) > 1
    assert json.loads("".join(tool_deltas))["command"] == long_cmd
    text_deltas = [d["delta"]["text"] for k, d in events if k == "content_block_delta" and d["index"] == 0]
    assert "".join(text_deltas) == "thinking aloud"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] == 9

    plain = mm.build_message(mm.Step(), "m", "msg_2", "toolu_2", 4)
    assert plain["content"] == [{"type": "text", "text": "done"}]
    assert plain["stop_reason"] == "end_turn"
    assert plain["usage"]["output_tokens"] >= 1


# ---------------------------------------------------------------- server


def test_import_has_no_side_effects() -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import runpy; runpy.run_path({str(MOCK_PATH)!r})"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_server_protocol(server: Server, tmp_path: Path) -> None:
    script = 'MOCK[{"text": "one"}, {"error": 529, "times": 1, "text": "two"}]MOCK'
    base = {"model": "m-x", "max_tokens": 10, "tools": [{"name": "Bash"}]}
    status, body = server.post("/v1/messages?beta=true", {**base, "messages": [_user(script)]})
    assert status == 200
    reply = json.loads(body)
    assert reply["model"] == "m-x" and reply["content"][0]["text"] == "one"
    later = [_user(script), {"role": "assistant", "content": "one"}, _user("go")]
    status, body = server.post("/v1/messages", {**base, "messages": later})
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    status, body = server.post("/v1/messages", {**base, "messages": later, "stream": True})
    assert status == 200
    assert [k for k, _ in _parse_sse(body)][-1] == "message_stop"
    # Side requests (no tools key) never consume the script.
    status, body = server.post("/v1/messages", {"model": "m", "messages": [_user(script)]})
    assert status == 200 and json.loads(body)["content"][0]["text"] == "ok"
    status, body = server.post("/v1/messages/count_tokens", {"messages": [_user("abcd" * 10)]})
    assert status == 200 and json.loads(body)["input_tokens"] >= 10
    status, _ = server.post("/nope", {})
    assert status == 404
    assert server.stop() == 0
    log = _read_log(server.log)
    assert [(r["kind"], r["step_index"], r["status"], r["first"]) for r in log[:4]] == [
        ("main", 0, 200, True),
        ("main", 1, 529, False),
        ("main", 1, 200, False),
        ("side", None, 200, False),
    ]
    assert log[0]["tools"] == ["Bash"] and log[0]["task_digest"] == log[1]["task_digest"]


def test_sleep_does_not_block_other_requests(server: Server) -> None:
    import threading

    import psutil

    done: list[str] = []
    main = {"tools": [{"name": "Bash"}]}

    def slow() -> None:
        server.post("/v1/messages", {**main, "messages": [_user('MOCK[{"sleep": 8}]MOCK')]})
        done.append("slow")

    thread = threading.Thread(target=slow)
    thread.start()
    # Once the slow request's connection is up, a one-at-a-time server would take it first.
    limit = time.monotonic() + 30
    while not [c for c in psutil.Process(server.proc.pid).net_connections() if c.status == psutil.CONN_ESTABLISHED]:
        assert time.monotonic() < limit, "the slow request never connected"
        time.sleep(0.05)
    status, _ = server.post("/v1/messages", {**main, "messages": [_user("fast")]})
    assert status == 200 and done == [], "the fast request waited for the sleeping one"
    thread.join()
    assert done == ["slow"]


def test_sleep_stops_when_client_disconnects(server: Server) -> None:
    import socket

    body = json.dumps({"tools": [{"name": "Bash"}], "messages": [_user('MOCK[{"sleep": 30}]MOCK')]}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(r["reply"] == "client_gone" for r in _read_log(server.log)):
            break
        time.sleep(0.05)
    else:
        pytest.fail("server kept sleeping after the client disconnected")


def test_bad_scenario_reports_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = subprocess.run(
        [sys.executable, str(MOCK_PATH), "--scenario", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.startswith("mock_model: error:")


def test_serve_starts_a_scripted_model_and_stops_it(tmp_path: Path) -> None:
    scenario = {"rules": [{"match": "hello", "steps": [{"text": "scripted reply"}]}]}
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}], "tools": [{"name": "Bash"}]}
    with mm.serve(tmp_path, scenario) as served, mm.serve(tmp_path) as other:
        assert served.url != other.url  # two servers share one workdir
        request = urllib.request.Request(served.url + "/v1/messages", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert b"scripted reply" in resp.read()
        assert len(served.new_requests()) == 1
        assert served.new_requests() == []  # only what came since the last call
        assert len(served.requests()) == 1
        assert other.requests() == []
    assert served.process.poll() is not None and other.process.poll() is not None


# ---------------------------------------------------------------- real CLI


def _run_cli(server: Server, tmp: Path, prompt: str, *extra: str) -> dict[str, Any]:
    cli = _find_cli()
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "sk-mock",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    result = subprocess.run(
        [str(cli), "-p", prompt, "--output-format", "json", *extra],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_cli_runs_bash_then_text(server: Server, tmp_path: Path) -> None:
    _find_cli()
    marker = tmp_path / "bash-ran.txt"
    steps = [{"bash": f"echo hello-from-bash > {marker}"}, {"text": "finished"}]
    out = _run_cli(
        server,
        tmp_path,
        f"do it MOCK{json.dumps(steps)}MOCK",
        "--tools",
        "Bash",
        "--allowedTools",
        "Bash",
    )
    assert out["result"] == "finished" and not out["is_error"]
    assert marker.read_text().strip() == "hello-from-bash"
    main = [r for r in _read_log(server.log) if r["kind"] == "main"]
    assert [(r["step_index"], r["reply"]) for r in main] == [
        (0, "tool:Bash"),
        (1, "text"),
    ]
    assert main[0]["first"] and "Bash" in main[0]["tools"]


def test_cli_structured_output(server: Server, tmp_path: Path) -> None:
    _find_cli()
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    out = _run_cli(
        server,
        tmp_path,
        'answer MOCK[{"structured": {"answer": 42}}]MOCK',
        "--json-schema",
        json.dumps(schema),
    )
    assert out["structured_output"] == {"answer": 42}
    assert not out["is_error"]


def test_cli_retries_after_529(server: Server, tmp_path: Path) -> None:
    _find_cli()
    out = _run_cli(server, tmp_path, 'x MOCK[{"error": 529, "times": 1, "text": "recovered"}]MOCK')
    assert out["result"] == "recovered" and not out["is_error"]
    main = [r for r in _read_log(server.log) if r["kind"] == "main"]
    assert [r["status"] for r in main] == [529, 200]


def test_sdk_query_ignores_title_side_request(server: Server, tmp_path: Path) -> None:
    cli = _find_cli()
    import anyio
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

    home = tmp_path / "home"
    home.mkdir()
    options = ClaudeAgentOptions(
        cli_path=str(cli),
        cwd=str(tmp_path),
        allowed_tools=["Bash"],
        env={
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "sk-mock",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )
    prompt = 'sdk MOCK[{"text": "looking", "bash": "echo sdk"}, {"text": "sdk-finished"}]MOCK'
    results: list[str] = []

    async def run() -> None:
        async for message in query(prompt=prompt, options=options):
            if isinstance(message, ResultMessage):
                results.append(str(message.result))

    anyio.run(run)
    assert results == ["sdk-finished"]
    log = _read_log(server.log)
    main = [r for r in log if r["kind"] == "main"]
    assert [(r["step_index"], r["reply"]) for r in main] == [
        (0, "tool:Bash"),
        (1, "text"),
    ]
    assert sum(r["first"] for r in log) == 1


# ---------------------------------------------------------------- prompt cache

CACHED = {"type": "ephemeral"}


def _cached_request(system: str = "You are a cached system prompt. " * 20, task: str = "task", **extra: Any) -> dict[str, Any]:
    """A main-loop request shaped as the CLI sends it: tools, then system blocks with a breakpoint."""
    return {
        "model": "m-cache",
        "max_tokens": 10,
        "tools": [{"name": "Bash", "description": "run a command " * 30, "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "header"}, {"type": "text", "text": system, "cache_control": CACHED}],
        "messages": [_user(task)],
        **extra,
    }


def _usage(server: Server, payload: dict[str, Any]) -> dict[str, Any]:
    status, body = server.post("/v1/messages", payload)
    assert status == 200, body
    usage: dict[str, Any] = json.loads(body)["usage"]
    return usage


def _advance(server: Server, seconds: float) -> int:
    status, _ = server.post(mm.CLOCK_ROUTE, {"advance": seconds})
    return status


def test_cache_writes_then_reads_the_prefix_up_to_each_breakpoint(server: Server) -> None:
    first = _usage(server, _cached_request(task="one"))
    # The prompt is its blocks (tools, system, messages), not the request's envelope.
    size = mm.prefix_blocks(_cached_request(task="one"))[-1].end
    assert size < len(json.dumps(_cached_request(task="one")).encode())
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 100
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": first["cache_creation_input_tokens"], "ephemeral_1h_input_tokens": 0}
    # The three add up to the prompt's bytes / 4 (each rounded down).
    total = first["input_tokens"] + first["cache_creation_input_tokens"] + first["cache_read_input_tokens"]
    assert size // 4 - 2 <= total <= size // 4
    # Another task after the same tools and system reads what the first wrote.
    second = _usage(server, _cached_request(task="two, a longer task"))
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == 0 and second["input_tokens"] > first["input_tokens"]
    # A breakpoint on the last message: reads the system prefix, writes the rest up to it.
    turn = _cached_request(task="two, a longer task")
    turn["messages"] = [
        _user("two, a longer task"),
        {"role": "assistant", "content": [{"type": "text", "text": "ok", "cache_control": CACHED}]},
    ]
    third = _usage(server, turn)
    assert third["cache_read_input_tokens"] == first["cache_creation_input_tokens"] and third["cache_creation_input_tokens"] > 0
    # A byte changed in the system prompt, or another model: nothing to read.
    assert _usage(server, _cached_request(system="You are another system prompt. " * 20))["cache_read_input_tokens"] == 0
    assert _usage(server, {**_cached_request(), "model": "m-other"})["cache_read_input_tokens"] == 0
    # No breakpoint, no caching: all of it is input.
    plain = _cached_request()
    plain["system"] = [{"type": "text", "text": "header"}, {"type": "text", "text": "You are a cached system prompt. " * 20}]
    bare = _usage(server, plain)
    assert (bare["cache_read_input_tokens"], bare["cache_creation_input_tokens"]) == (0, 0)
    assert bare["input_tokens"] == mm.prefix_blocks(plain)[-1].end // 4
    # A step that scripts its input count gets exactly that, cache or not.
    scripted = _cached_request(task='MOCK[{"text": "x", "usage": {"input_tokens": 7}}]MOCK')
    usage = _usage(server, scripted)
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (7, 0, 0)


def test_cache_looks_back_from_a_later_breakpoint_and_honours_a_top_level_one(server: Server) -> None:
    prefix = _usage(server, _cached_request(task="first"))["cache_creation_input_tokens"]
    # The breakpoint moved to the message: the system prefix 1 block before it is found and read.
    moved = _cached_request(task="first")
    moved["system"][1].pop("cache_control")
    moved["cache_control"] = CACHED  # automatic: the last block is the breakpoint
    usage = _usage(server, moved)
    assert usage["cache_read_input_tokens"] == prefix and usage["cache_creation_input_tokens"] > 0
    again = _usage(server, moved)
    assert again["cache_read_input_tokens"] == prefix + usage["cache_creation_input_tokens"]
    assert again["cache_creation_input_tokens"] == 0


def test_cache_streams_usage_in_message_start_and_message_delta(server: Server) -> None:
    _usage(server, _cached_request())
    status, body = server.post("/v1/messages", {**_cached_request(), "stream": True})
    assert status == 200
    events = dict(_parse_sse(body))
    start, delta = events["message_start"]["message"]["usage"], events["message_delta"]["usage"]
    assert start["cache_read_input_tokens"] > 0 and start["output_tokens"] == 1
    # message_delta's counts are cumulative, as the API's are: the same input side again.
    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        assert delta[key] == start[key]
    assert delta["output_tokens"] >= 1
    log = _read_log(server.log)
    assert log[-1]["usage"]["cache_read_input_tokens"] == start["cache_read_input_tokens"]
    assert log[-1]["head_tokens"] == start["cache_read_input_tokens"]  # the breakpoint ends the system prompt
    assert log[-1]["system_digest"] == log[0]["system_digest"] and log[-1]["tools_digest"] == log[0]["tools_digest"]


def test_cache_ttl_expires_on_the_controlled_clock_and_reads_refresh_it(server: Server) -> None:
    _usage(server, _cached_request())
    assert _advance(server, 290) == 200
    assert _usage(server, _cached_request())["cache_read_input_tokens"] > 0  # and refreshed for 5 minutes more
    assert _advance(server, 290) == 200
    assert _usage(server, _cached_request())["cache_read_input_tokens"] > 0
    assert _advance(server, 301) == 200
    expired = _usage(server, _cached_request())
    assert expired["cache_read_input_tokens"] == 0 and expired["cache_creation_input_tokens"] > 0
    # A 1-hour breakpoint outlives the 5-minute one and is priced as such.
    hour = _cached_request(system="A prompt kept for an hour. " * 20)
    hour["system"][1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    written = _usage(server, hour)
    assert written["cache_creation"]["ephemeral_1h_input_tokens"] == written["cache_creation_input_tokens"] > 0
    assert _advance(server, 3000) == 200
    assert _usage(server, hour)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]
    assert _advance(server, 3601) == 200
    assert _usage(server, hour)["cache_read_input_tokens"] == 0
    assert _advance(server, -1) == 400  # the clock only moves forward


def test_cache_burst_of_identical_requests_all_miss(server: Server) -> None:
    """A prefix is readable once the request that wrote it starts answering: requests sent meanwhile miss."""
    import threading

    slow = _cached_request(task='burst MOCK[{"sleep": 2, "text": "late"}]MOCK')
    answers: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: answers.append(_usage(server, slow))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 3
    assert [a["cache_read_input_tokens"] for a in answers] == [0, 0, 0]
    assert len({a["cache_creation_input_tokens"] for a in answers}) == 1
    # Once one has answered, the next reads it.
    assert _usage(server, _cached_request(task="after"))["cache_read_input_tokens"] > 0


def test_cache_refuses_a_fifth_breakpoint_and_a_bad_ttl(server: Server) -> None:
    many = _cached_request()
    many["messages"] = [{"role": "user", "content": [{"type": "text", "text": str(i), "cache_control": CACHED} for i in range(4)]}]
    status, body = server.post("/v1/messages", many)
    assert status == 400 and "A maximum of 4 blocks with cache_control" in json.loads(body)["error"]["message"]
    bad = _cached_request()
    bad["system"][1]["cache_control"] = {"type": "ephemeral", "ttl": "2h"}
    status, body = server.post("/v1/messages", bad)
    assert status == 400 and "ttl" in json.loads(body)["error"]["message"]


def test_cache_min_tokens_models_the_minimum_cacheable_length(tmp_path: Path) -> None:
    server = Server(tmp_path, flags=("--cache-min-tokens", "100000"))
    try:
        usage = _usage(server, _cached_request())
        assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 0)
    finally:
        server.stop()


def test_cache_off_reports_the_old_shape(tmp_path: Path) -> None:
    server = Server(tmp_path, flags=("--no-cache",))
    try:
        for _ in range(2):
            usage = _usage(server, _cached_request())
            assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 0)
            assert usage["input_tokens"] == len(json.dumps(_cached_request()).encode()) // 4
        assert _advance(server, 10) == 409
    finally:
        server.stop()


def test_serve_passes_flags_and_moves_the_clock(tmp_path: Path) -> None:
    with mm.serve(tmp_path) as served:
        assert served.advance_clock(30) == 30.0
        assert served.advance_clock(30) == 60.0
    with mm.serve(tmp_path, flags=["--no-cache"]) as served, pytest.raises(urllib.error.HTTPError):
        served.advance_clock(1)


def test_scripted_attempts_count_per_task_whatever_facts_follow_it(server: Server) -> None:
    """A task started again (a dag retry) carries a new id and deadline after it: its "times" count on."""
    task = 'flaky MOCK[{"error": 500, "times": 1, "text": "recovered"}]MOCK'
    facts = f"\n\n{mm.AGENT_FACTS_HEADER}\nYou are agent a1-{{}} at depth 1.\nDeadline: in {{}} s."
    base = {"model": "m", "max_tokens": 10, "tools": [{"name": "Bash"}]}
    status, _ = server.post("/v1/messages", {**base, "messages": [_user(task + facts.format("aaaa", 60))]})
    assert status == 500
    status, body = server.post("/v1/messages", {**base, "messages": [_user(task + facts.format("bbbb", 58))]})
    assert status == 200 and json.loads(body)["content"][0]["text"] == "recovered"
    assert mm.script_key(task + facts) == mm.script_key(task) != mm.script_key("other " + task)
    # Without an inline script, the key ends at the facts' header.
    assert mm.script_key("plain task" + facts.format("a", 1)) == mm.script_key("plain task") != mm.script_key("plain")
    log = _read_log(server.log)
    assert log[0]["task_digest"] != log[1]["task_digest"]  # still one digest per agent


# ---------------------------------------------------------------- streaming over time, credentials


def _stream_request(script: str, **extra: Any) -> bytes:
    body = json.dumps({"tools": [{"name": "Bash"}], "stream": True, "max_tokens": 32000, "messages": [_user(script)], **extra}).encode()
    return (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: KEY-ONE-1234"
        b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def test_stream_s_spreads_the_events_over_time(server: Server) -> None:
    """A client reads the first event well before the last: a gateway that buffers would show here."""
    import socket

    script = 'MOCK[{"text": "heavy", "filler": 2000, "stream_s": 2}]MOCK'
    arrivals: list[tuple[float, int]] = []
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        start = time.monotonic()
        sock.sendall(_stream_request(script))
        received = b""
        while b"message_stop" not in received:
            chunk = sock.recv(1 << 16)
            assert chunk, "the stream ended early"
            received += chunk
            arrivals.append((time.monotonic() - start, received.count(b"event: ")))
    first = next(t for t, events in arrivals if events >= 1)
    assert first < 1.0 and arrivals[-1][0] >= 1.8, arrivals[:3]
    assert len(arrivals) > 10  # many reads, each of a few events
    events = _parse_sse(received.split(b"\r\n\r\n", 1)[1])
    text = "".join(d["delta"]["text"] for k, d in events if k == "content_block_delta")
    assert len(text.encode()) == len("heavy\n") + 2000 * mm.BYTES_PER_TOKEN
    assert events[-2][1]["usage"]["output_tokens"] == len(text.encode()) // mm.BYTES_PER_TOKEN
    (record,) = _read_log(server.log)
    assert record["credential"] == hashlib.sha256(b"KEY-ONE-1234").hexdigest()[:12]
    assert "KEY-ONE-1234" not in server.log.read_text()


def test_a_stream_its_client_leaves_logs_what_was_served(server: Server) -> None:
    import socket

    script = 'MOCK[{"filler": 4000, "stream_s": 4}]MOCK'
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_stream_request(script))
        received = b""
        while received.count(b"event: content_block_delta") < 10:
            received += sock.recv(1 << 16)
    deadline = time.monotonic() + 5
    while not any(r["reply"] == "stream_cut" for r in _read_log(server.log)):
        assert time.monotonic() < deadline, "no stream_cut record"
        time.sleep(0.05)
    answered, cut = _read_log(server.log)
    assert answered["message_id"] == cut["message_id"] and cut["status"] == 499
    assert answered["usage"]["output_tokens"] == 4000
    # The input side was served with message_start; the output, as the deltas sent (a few were in flight).
    assert cut["usage"]["input_tokens"] == answered["usage"]["input_tokens"]
    assert 10 * mm.TEXT_CHUNK // 4 <= cut["usage"]["output_tokens"] < 4000 // 2


def test_an_answer_is_cut_at_max_tokens_and_bearer_tokens_are_hashed(server: Server) -> None:
    request = urllib.request.Request(
        server.url + "/v1/messages",
        data=json.dumps(
            {"tools": [{"name": "Bash"}], "max_tokens": 50, "messages": [_user('MOCK[{"bash": "ls", "filler": 500}]MOCK')]}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer TOKEN-TWO-5678"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        reply = json.loads(resp.read())
    assert reply["stop_reason"] == "max_tokens" and reply["usage"]["output_tokens"] == 50
    assert [b["type"] for b in reply["content"]] == ["text"] and len(reply["content"][0]["text"]) == 200
    (record,) = _read_log(server.log)
    assert record["credential"] == hashlib.sha256(b"TOKEN-TWO-5678").hexdigest()[:12] and record["reply"] == "max_tokens"


def test_a_bad_stream_modifier_is_a_script_error() -> None:
    with pytest.raises(mm.ScriptError, match="stream_s"):
        mm.normalise_step({"text": "x", "stream_s": -1})
    assert mm.normalise_step({"text": "x", "stream_s": 1.5, "filler": 3}).filler == 3

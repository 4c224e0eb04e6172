"""A user's first week (issue 46): resume, in-process agents, routing and the flaky paths it found."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import mock_model as mock_model_module
from conftest import (
    FAKE_API_KEY,
    ROOT,
    MockModel,
    agent_dirs,
    listen_unix,
    load,
    metas,
    mock_task,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_until,
    write_agent,
)

import spawn

# ------------------------------------------------------------------ resume --


def finished_depth_two_tree(env: dict[str, str], session_root: Path) -> dict[str, Any]:
    """A root, its child and a grandchild that all ended done; the grandchild's meta."""
    grandchild = mock_task("grandchild", [{"text": "first answer"}, {"text": "second answer"}])
    child = mock_task("child", [{"bash": spawn_in_bash("--task", grandchild)}, {"text": "child done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "root done"}])
    ran = run_spawn(["--task", root, "--tools", "Bash"], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr
    found = metas(session_root)
    deep = [m for m in found.values() if m["depth"] == 2]
    assert len(deep) == 1, f"no grandchild was registered; agents: {[(m['id'], m['depth']) for m in found.values()]}\n{ran.stderr[-3000:]}"
    (deepest,) = deep
    assert load(Path(deepest["session"]) / "agents" / deepest["id"] / "outcome.json")["status"] == "done"
    return deepest


def test_a_depth_two_agent_resumed_from_the_shell_runs_to_done_as_a_root_of_its_session(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    original = finished_depth_two_tree(env, session_root)
    resumed = run_spawn(["--resume", original["id"], "--task", "and now?"], env)
    out = stdout_json(resumed)
    assert resumed.returncode == spawn.ExitCode.OK, resumed.stderr
    assert out["status"] == "done", resumed.stderr
    assert out["output"] == "second answer"  # the original's conversation, continued

    # Where docs/cli.md says: a root of the original's session, with the room below it the original had.
    meta = metas(session_root)[out["id"]]
    assert meta["session"] == original["session"]
    assert "parent_id" not in meta
    assert meta["depth"] == 0
    assert meta["max_depth"] == original["max_depth"] - original["depth"]
    assert meta["resumed_from"] == original["id"]
    validate_records(session_root)


def test_an_agent_resumes_a_finished_depth_two_agent_from_its_bash_as_its_own_child(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    original = finished_depth_two_tree(env, session_root)
    caller_task = mock_task("caller", [{"bash": spawn_in_bash("--resume", original["id"], "--task", "and now?")}, {"text": "caller done"}])
    ran = run_spawn(["--task", caller_task, "--tools", "Bash"], env)
    caller = stdout_json(ran)
    assert caller["status"] == "done", ran.stderr
    (resumed,) = [m for m in metas(session_root).values() if m.get("resumed_from") == original["id"]]
    assert resumed["parent_id"] == caller["id"]
    assert resumed["depth"] == 1
    assert load(Path(resumed["session"]) / "agents" / resumed["id"] / "outcome.json")["status"] == "done"
    validate_records(session_root)


def test_a_sandboxed_agent_resumes_its_finished_grandchild_through_its_runner(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    # The second child (depth 1, Bash: sandboxed under --sandbox auto) resumes the first child's
    # child, whose parent has ended; its --resume goes through its runner (the broker), and the
    # `--print id` of docs/cli.md's parallel example passes there too.
    grandchild = mock_task("grandchild", [{"text": "first answer"}, {"text": "second answer"}])
    first = mock_task("first child", [{"bash": spawn_in_bash("--task", grandchild, "--print", "id")}, {"text": "first done"}])
    resume = spawn_in_bash("--resume", "GC", "--task", "and now?", "--print", "output").replace(
        "GC", '"$(ls "$SPAWN_SESSION/agents" | grep ^a2-)"'
    )
    second = mock_task("second child", [{"bash": resume}, {"text": "second done"}])
    both = f"{spawn_in_bash('--task', first, '--tools', 'Bash')} >/dev/null; {spawn_in_bash('--task', second, '--tools', 'Bash')}"
    ran = run_spawn(["--task", mock_task("root", [{"bash": both}, {"text": "root done"}]), "--tools", "Bash"], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr

    tree = metas(session_root)
    (original,) = [m for m in tree.values() if m["depth"] == 2 and "resumed_from" not in m]
    (resumed,) = [m for m in tree.values() if m.get("resumed_from") == original["id"]]
    caller = tree[resumed["parent_id"]]
    assert caller["task"].startswith("second child") and caller["sandbox"] == "on"
    assert resumed["depth"] == 2
    outcome = load(Path(resumed["session"]) / "agents" / resumed["id"] / "outcome.json")
    assert outcome["status"] == "done" and outcome["output"] == "second answer"
    validate_records(session_root)


# ------------------------------------------------------------- in-process --

INPROCESS = ["--placement", "inprocess"]
TURN = {"input_tokens": 10_000, "output_tokens": 1}  # about $0.03 a turn at the default model's price


def agent_call(prompt: str, subagent_type: str = "general-purpose") -> dict[str, Any]:
    call = {"description": "delegates", "prompt": prompt, "subagent_type": subagent_type, "run_in_background": False}
    return {"tool": "Agent", "input": call}


def decisions(agent_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (agent_dir / "transcript.jsonl").read_text().splitlines()]
    return [line["message"] for line in lines if line["type"] == "PermissionDecision"]


def by_task(session_root: Path) -> dict[str, Path]:
    return {load(d / "meta.json")["task"].split(" MOCK")[0]: d for d in agent_dirs(session_root) if (d / "meta.json").exists()}


def test_send_to_a_running_in_process_child_is_refused_at_once_with_what_works(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    read = {"tool": "Read", "input": {"file_path": str(tmp_path / "a.txt")}, "sleep": 0.5}
    child = mock_task("long child", [read] * 40 + [{"text": "child-result"}])
    runner = start_spawn(
        ["--task", mock_task("root", [agent_call(child), {"text": "root-result"}]), "--tools", "Agent,Read", *INPROCESS], env
    )
    try:
        assert wait_until(lambda: "long child" in by_task(session_root), 60), "the child never started"
        tasks = by_task(session_root)
        child_dir, root_dir = tasks["long child"], tasks["root"]
        sent = run_spawn(["send", child_dir.name, "stop and answer", "--session", str(child_dir.parent.parent)], env)
        # Refused while the child still runs: not after waiting for its end.
        assert not (child_dir / "outcome.json").exists()
        assert sent.returncode == spawn.ExitCode.USAGE, sent.stderr
        assert sent.stderr.startswith("spawn: error:") and "in-process" in sent.stderr and "was not sent" in sent.stderr
        assert f"spawn.py send {root_dir.name} TEXT" in sent.stderr and f"spawn.py kill {child_dir.name}" in sent.stderr
        assert "--resume" not in sent.stderr  # an in-process agent has no SDK session to resume
        assert run_spawn(["kill", child_dir.name, "--session", str(child_dir.parent.parent)], env).returncode == spawn.ExitCode.OK
        _, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == spawn.ExitCode.OK, err
    # The finished child: still refused, and without a --resume that could not work.
    again = run_spawn(["send", child_dir.name, "more", "--session", str(child_dir.parent.parent)], env)
    assert again.returncode == spawn.ExitCode.AGENT_FAILED and "--resume" not in again.stderr, again.stderr


def test_an_invalid_schema_in_one_definition_refuses_only_the_agent_call_that_uses_it(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    write_agent(tmp_path, "broken", "description: its schema is no schema\nschema: '{\"type\": 12}'\ntools: Read")
    write_agent(tmp_path, "plain", "description: a plain helper\ntools: Read")
    plain = mock_task("plain child", [{"text": "plain-result"}])
    broken = mock_task("broken child", [{"text": "never"}])
    root = mock_task("root", [agent_call(plain, "plain"), agent_call(broken, "broken"), {"text": "root-result"}])
    ran = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--cwd", str(tmp_path)], env)
    out = stdout_json(ran)
    assert ran.returncode == spawn.ExitCode.OK and out["status"] == "done" and out["output"] == "root-result", ran.stderr
    assert "definition broken" in ran.stderr  # said before anything started
    tasks = by_task(session_root)
    assert sorted(tasks) == ["plain child", "root"]  # the broken one never started
    assert load(tasks["plain child"] / "outcome.json")["status"] == "done"
    agent_calls = [d for d in decisions(tasks["root"]) if d["tool"] == "Agent"]
    assert [(d["verdict"], d["by"]) for d in agent_calls] == [("allow", "rules"), ("deny", "placement")]
    assert "definition broken's schema" in agent_calls[1]["rule"]
    validate_records(session_root)


def test_an_agent_call_auto_refuses_is_audited_as_denied(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    write_agent(tmp_path, "timed", "description: has a deadline\ntimeout: 30\ntools: Read")
    root = mock_task("root", [agent_call(mock_task("timed child", [{"text": "never"}]), "timed"), {"text": "root-result"}])
    ran = run_spawn(["--task", root, "--tools", "Agent,Read", "--placement", "auto", "--cwd", str(tmp_path)], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr
    (root_dir,) = agent_dirs(session_root)
    (call,) = [d for d in decisions(root_dir) if d["tool"] == "Agent"]  # one line per call, not allow then deny
    assert call["verdict"] == "deny" and call["by"] == "placement" and "needs a process (a hard deadline)" in call["rule"]
    validate_records(session_root)


def test_an_agent_call_past_max_depth_is_a_recorded_refusal(env: dict[str, str], session_root: Path) -> None:
    leaf = mock_task("leaf", [{"text": "leaf-result"}])
    middle = mock_task("middle", [agent_call(leaf), {"text": "middle-result"}])
    root = mock_task("root", [agent_call(middle), {"text": "root-result"}])
    ran = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--max-depth", "1"], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr
    tasks = by_task(session_root)
    assert sorted(tasks) == ["leaf", "middle", "root"]
    refused = load(tasks["leaf"] / "outcome.json")
    assert refused["status"] == "refused" and refused["exit_code"] == spawn.ExitCode.REFUSED
    assert "depth limit" in refused["reason"] and "max depth is 1" in refused["reason"]
    leaf_meta = load(tasks["leaf"] / "meta.json")
    assert leaf_meta["depth"] == 2 and leaf_meta["parent_id"] == tasks["middle"].name
    assert load(tasks["middle"] / "outcome.json")["status"] == "done"

    # At --max-depth 0 the host itself has no Agent tool: its call is a refused child of it.
    again = run_spawn(
        [
            "--task",
            mock_task("lone root", [agent_call(leaf), {"text": "root-result"}]),
            "--tools",
            "Agent,Read",
            *INPROCESS,
            "--max-depth",
            "0",
        ],
        env,
    )
    assert stdout_json(again)["status"] == "done", again.stderr
    lone = [m for m in metas(session_root).values() if m["session"] == stdout_json(again)["agent_dir"].rsplit("/agents/", 1)[0]]
    (child,) = [m for m in lone if m["depth"] == 1]
    assert load(Path(child["session"]) / "agents" / child["id"] / "outcome.json")["status"] == "refused"
    validate_records(session_root)


def test_a_paused_host_shows_its_spending_in_process_child_paused_too(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    read = {"tool": "Read", "input": {"file_path": str(tmp_path / "a.txt")}, "usage": TURN}
    child = mock_task("spending child", [read, read, read, {"text": "child-result", "usage": TURN}])
    args = ["--task", mock_task("root", [agent_call(child), {"text": "root-result"}]), "--tools", "Agent,Read", *INPROCESS]
    # The runner's own pause, which holds the host's whole CLI (a tree without a gateway): the scripted
    # usage is not what the model sent. tests/test_gateway.py has the gateway's pause of an in-process agent.
    env = {**env, "SPAWN_GATEWAY": "0"}
    runner = start_spawn([*args, "--max-budget-usd", "0.05", "--on-budget", "pause"], env)
    try:
        assert wait_until(lambda: any(d.joinpath("paused.json").exists() for d in agent_dirs(session_root)), 90), "it never paused"
        tasks = by_task(session_root)
        assert wait_until((tasks["spending child"] / "paused.json").exists, 10)
        rows = {r["id"]: r for r in stdout_json(run_spawn(["status", "--json"], env))["agents"]}
        assert rows[tasks["root"].name]["state"] == "paused"
        assert rows[tasks["spending child"].name]["state"] == "paused", rows
        raised = run_spawn(["budget", tasks["root"].parent.parent.name, "--raise", "1"], env)
        assert raised.returncode == spawn.ExitCode.OK, raised.stderr
        _, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == spawn.ExitCode.OK, err
    assert not [d for d in agent_dirs(session_root) if (d / "paused.json").exists()]
    assert load(tasks["spending child"] / "outcome.json")["status"] == "done"
    validate_records(session_root)


# ----------------------------------------------------------------- routing --

PUBLIC = ROOT / "tests" / "fixtures" / "agents-public"
FLAKY = "Find why the checkout test fails intermittently with a null pointer"


def one(name: str, description: str) -> spawn.AgentDefinition:
    return spawn.AgentDefinition(name=name, path=f"{name}.md", source="project", description=description, prompt="")


def test_the_lexical_router_reads_use_when_clauses_and_do_not_use_clauses() -> None:
    definitions = {
        "silent-failure-hunter": one(
            "silent-failure-hunter",
            "Reviews code for silent failures: swallowed errors, empty catch blocks, null checks that hide a failed call, "
            "fallbacks that mask a failing test. Use this agent when reviewing a diff that handles errors. "
            "Do not use it to find why a test fails intermittently; that is debugging.",
        ),
        "debugger": one("debugger", "Debugging specialist for crashes and errors. Use proactively when a test fails or a run crashes."),
        "test-automator": one("test-automator", "Writes unit tests with pytest. Use when you need new tests or more coverage."),
    }
    assert spawn.use_when_terms(definitions["silent-failure-hunter"].description)[1] >= {"find", "intermittent"}
    flaky = spawn.route(FLAKY, definitions)
    assert flaky["chosen"] == "debugger", flaky
    assert not [c for c in flaky["candidates"] if c["name"] == "silent-failure-hunter" and "intermittent" in c["matched"]]
    assert spawn.route("Review this diff's error handling for swallowed exceptions", definitions)["chosen"] == "silent-failure-hunter"
    assert spawn.route("Write pytest unit tests for the date parsing helpers", definitions)["chosen"] == "test-automator"


def routed_by_model(base_env: dict[str, str], tmp_path: Path, answer: str, task: str = FLAKY) -> tuple[Any, list[dict[str, Any]]]:
    """A dry run of --agent auto --route model among the public definitions, the scripted model answering the router."""
    scenario = {"rules": [{"match": "^Agents:", "steps": [{"text": answer}]}]}
    with mock_model_module.serve(tmp_path, scenario) as served:
        env = {**base_env, "ANTHROPIC_BASE_URL": served.url, "ANTHROPIC_API_KEY": FAKE_API_KEY}
        ran = run_spawn(["--dry-run", "--agent", "auto", "--route", "model", "--task", task], env, cwd=PUBLIC)
        return ran, served.requests()


def test_route_model_asks_the_low_tier_model_once_and_logs_its_reason(base_env: dict[str, str], tmp_path: Path) -> None:
    ran, requests = routed_by_model(base_env, tmp_path, '{"agent": "debugger", "reason": "a flaky failure needs its root cause"}')
    assert ran.returncode == spawn.ExitCode.OK, ran.stderr
    plan = json.loads(ran.stdout)
    assert plan["agent"] == "debugger"
    routing = plan["routing"]
    assert routing["by"] == "model" and routing["model"] == "haiku" and routing["reason"] == "a flaky failure needs its root cause"
    assert routing["candidates"] and "fallback" not in routing  # the lexical scores are kept beside it
    assert "routed to debugger by the model (haiku): a flaky failure needs its root cause" in ran.stderr
    (request,) = requests  # one call, to the cheap tier
    assert "haiku" in request["model"]


def test_route_model_falls_back_to_the_lexical_router_and_says_why(base_env: dict[str, str], tmp_path: Path) -> None:
    lexical = spawn.route(FLAKY, {n: d for n, d in spawn.load_definitions(PUBLIC, base_env)[0].items()})
    ran, _ = routed_by_model(base_env, tmp_path, "I would pick the debugger.")
    assert ran.returncode == spawn.ExitCode.OK, ran.stderr
    routing = json.loads(ran.stdout)["routing"]
    assert routing["by"] == "lexical" and "not JSON" in routing["fallback"] and routing["chosen"] == lexical["chosen"]
    assert "the model router failed" in ran.stderr
    invented, _ = routed_by_model(base_env, tmp_path, '{"agent": "bug-whisperer", "reason": "sounds right"}')
    assert "names no definition" in json.loads(invented.stdout)["routing"]["fallback"]

    # Offline: nothing listens at the model's address.
    offline_env = {**base_env, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": FAKE_API_KEY}
    offline = run_spawn(["agents", "route", FLAKY, "--route", "model", "--json"], offline_env, cwd=PUBLIC)
    assert offline.returncode == spawn.ExitCode.OK, offline.stderr
    decision = stdout_json(offline)
    assert decision["by"] == "lexical" and decision["chosen"] == lexical["chosen"] and "the model router failed" in decision["fallback"]


# ------------------------------------------------------------- fork server --


def test_a_whole_request_the_fork_server_was_slow_to_look_at_is_served_not_dropped(tmp_path: Path) -> None:
    """Its read deadline is for a client that trickles: a request whose bytes all came while the
    server was busy or starved (a loaded machine) is answered, and only a cut-off one is dropped."""
    import psutil

    listener = listen_unix(tmp_path / "forkserver.sock")
    listener.setblocking(False)
    me = psutil.Process()
    meta = spawn.AgentMeta(
        id="a0-abcdef", parent_id=None, depth=0, max_depth=2, pid=me.pid, create_time=me.create_time(), pgid=os.getpgid(0),
        trace_id="0" * 32, span_id="1" * 16, traceparent="", task="t", tools=["Bash"], disallowed_tools=[], model="m",
        cwd=str(tmp_path), started_at="", session=str(tmp_path), system_prompt="", deadline=None,
    )  # fmt: skip
    loop = spawn.ForkServerLoop(meta, None, listener)  # type: ignore[arg-type]  # no fork is served here
    good = json.dumps({"argv": ["--task", "x"], "env": {}, "cwd": "/", "prefix": sys.prefix, "script": ["", 0, 0]}).encode()
    replies = []
    for payload in (len(good).to_bytes(4, "big") + good, len(good).to_bytes(4, "big") + good[:10]):
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(10)
            # Through the folder's descriptor, as it was bound: CI's tmp paths outgrow sun_path.
            address, dir_fd = spawn.unix_address(str(tmp_path / "forkserver.sock"))
            try:
                client.connect(address)
            finally:
                if dir_fd is not None:
                    os.close(dir_fd)
            socket.send_fds(client, [payload], [0, 1, 2])
            loop.admit()
            (pending,) = loop.pending.values()
            pending.deadline = time.monotonic() - 1  # the server looks only now, past the deadline
            loop.expire(pending)
            replies.append(client.recv(1000))
    assert b"refused" in replies[0], replies  # answered: the whole request was there
    assert replies[1] == b""  # cut off: closed unanswered
    assert not loop.pending
    listener.close()

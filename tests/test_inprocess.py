"""In-process children: Claude Code's own subagents (the Agent tool) as governed agents of the session.

Every test runs the real bundled CLI through spawn.py against the scripted model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    agent_dirs,
    load,
    metas,
    mock_task,
    run_python,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_ask,
    wait_until,
    write_agent,
)

import spawn

INPROCESS = ["--placement", "inprocess"]
# The environment a child's spawn.py gets from its parent's Bash (enough for a dry run).
AS_CHILD = {"SPAWN_DEPTH": "0", "SPAWN_AGENT_ID": "a0-000000", "SPAWN_SESSION": "/nonexistent/session"}


def delegate(name: str, child: str, answer: str, subagent_type: str = "general-purpose", before: Sequence[Mapping[str, Any]] = ()) -> str:
    """A task whose agent starts one subagent in the foreground, then answers."""
    call = {"description": f"{name} delegates", "prompt": child, "subagent_type": subagent_type, "run_in_background": False}
    return mock_task(name, [*before, {"tool": "Agent", "input": call}, {"text": answer}])


def by_depth(session_root: Path) -> dict[int, tuple[Path, dict[str, Any]]]:
    found = {}
    for d in agent_dirs(session_root):
        meta = load(d / "meta.json")
        assert meta["depth"] not in found, "one agent per depth in a chain"
        found[meta["depth"]] = (d, meta)
    return found


def cli_messages(agent_dir: Path) -> list[dict[str, Any]]:
    """The user and assistant lines of the CLI's transcript of an in-process agent."""
    lines = [json.loads(line) for line in (agent_dir / "subagent.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("type") in ("user", "assistant")]


def outcome(agent_dir: Path) -> dict[str, Any]:
    return load(agent_dir / "outcome.json")


def requests_by_agent(mock_log: Path) -> list[list[dict[str, Any]]]:
    """The model requests of each agent (by its first message), in the order the agents first asked.

    A subagent's first message is its prompt with the CLI's reminders around
    it, so it is told apart by its digest, not matched to the prompt's text.
    """
    agents: dict[str, list[dict[str, Any]]] = {}
    for request in map(json.loads, mock_log.read_text().splitlines()):
        if request.get("kind") == "main":
            agents.setdefault(request["task_digest"], []).append(request)
    return list(agents.values())


def test_a_depth_3_chain_of_subagents_is_recorded_as_three_agents(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    leaf = mock_task("leaf looks", [{"tool": "Read", "input": {"file_path": str(tmp_path / "notes.txt")}}, {"text": "leaf-result"}])
    (tmp_path / "notes.txt").write_text("some notes\n")
    root = delegate("root", delegate("middle", leaf, "middle-result"), "root-result")
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--max-depth", "3", "--max-budget-usd", "5"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root-result"
    chain = by_depth(session_root)
    assert sorted(chain) == [0, 1, 2]
    (root_dir, root_meta), (mid_dir, mid_meta), (leaf_dir, leaf_meta) = chain[0], chain[1], chain[2]
    assert root_meta["placement"]["backend"] == "local" and root_meta["placement"]["policy"] == "inprocess"
    for meta, parent in ((mid_meta, root_meta), (leaf_meta, mid_meta)):
        assert meta["placement"]["backend"] == "inprocess" and meta["placement"]["policy"] == "inprocess"
        assert meta["parent_id"] == parent["id"] and meta["trace_id"] == root_meta["trace_id"]
        assert meta["parent_span_id"] == parent["span_id"] and meta["model"] == root_meta["model"]
        assert meta["tools"] == ["Agent", "Read"] and meta["max_depth"] == 3
    assert mid_meta["task"].startswith("middle") and leaf_meta["task"].startswith("leaf looks")
    assert [outcome(d)["status"] for d in (root_dir, mid_dir, leaf_dir)] == ["done"] * 3
    assert outcome(mid_dir)["output"] == "middle-result" and outcome(leaf_dir)["output"] == "leaf-result"
    # Its own transcript, copied from the CLI's, and its own usage from it.
    assert "some notes" in (leaf_dir / "subagent.jsonl").read_text()
    assert outcome(leaf_dir)["usage"]["input_tokens"] > 0 and outcome(leaf_dir)["turns"] == 2
    allowed = [json.loads(line)["message"] for line in (leaf_dir / "transcript.jsonl").read_text().splitlines()]
    assert [(d["tool"], d["verdict"]) for d in allowed] == [("Read", "allow")]
    validate_records(session_root)

    status = run_spawn(["status", "--json", str(root_dir.parent.parent)], env)
    assert status.returncode == spawn.ExitCode.OK, status.stderr
    rows = {row["id"]: row for row in json.loads(status.stdout)["agents"]}
    assert {rows[m["id"]]["state"] for m in (root_meta, mid_meta, leaf_meta)} == {"done"}
    # Each agent's own cost, each counted once: the host's is its CLI's total less its subagents'
    # (priced from spawn.py's table, which may price the scripted model's model above the CLI: then 0).
    costs = [outcome(d)["cost_usd"] for d in (root_dir, mid_dir, leaf_dir)]
    assert costs[0] >= 0 and costs[1] > 0 and costs[2] > 0, costs
    assert rows[root_meta["id"]]["subtree_cost_usd"] == pytest.approx(sum(costs), abs=1e-6)
    ledger = [json.loads(line) for line in (root_dir.parent.parent / "ledger.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["id"]) for line in ledger if line["kind"] == "reserve"] == [("reserve", root_meta["id"])]
    assert sorted(line["id"] for line in ledger if line["kind"] == "charge") == sorted(m["id"] for m in (root_meta, mid_meta, leaf_meta))
    assert rows[leaf_meta["id"]]["parent_id"] == mid_meta["id"] and rows[leaf_meta["id"]]["depth"] == 2
    waited = run_spawn(["wait", mid_meta["id"], leaf_meta["id"], "--session", str(root_dir.parent.parent)], env)
    assert waited.returncode == spawn.ExitCode.OK, waited.stderr
    page = tmp_path / "timeline.svg"
    made = run_python([str(ROOT / "tools" / "view.py"), str(root_dir.parent.parent), "--svg", "-o", str(page)], env)
    assert made.returncode == 0, made.stderr
    assert page.read_text().count('class="bar"') == 3 and f'data-id="{leaf_meta["id"]}"' in page.read_text()


def test_a_deny_rule_holds_at_depth_2(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TOP-SECRET-VALUE\n")
    # The leaf's own rule (its definition's), which neither its parents nor the CLI hold.
    write_agent(tmp_path, "careful", "description: careful reader\ntools: Read\npermissions:\n  deny: ['Read(./secret.txt)']")
    leaf = mock_task("leaf reads", [{"tool": "Read", "input": {"file_path": str(tmp_path / "secret.txt")}}, {"text": "leaf-result"}])
    root = delegate("root", delegate("middle", leaf, "middle-result", subagent_type="careful"), "root-result")
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    chain = by_depth(session_root)
    (leaf_dir, leaf_meta), middle_meta = chain[2], chain[1][1]
    assert leaf_meta["agent"] == "careful" and leaf_meta["tools"] == ["Read"]
    assert "Read(./secret.txt)" in leaf_meta["permissions"]["deny"] and "Read(./secret.txt)" not in middle_meta["permissions"]["deny"]
    decisions = [json.loads(line)["message"] for line in (leaf_dir / "transcript.jsonl").read_text().splitlines()]
    assert [(d["tool"], d["verdict"], d["rule"]) for d in decisions] == [("Read", "deny", "Read(./secret.txt)")]
    # What the model was given instead of the file: the denial, never the content.
    cli_transcript = (leaf_dir / "subagent.jsonl").read_text()
    assert "denied by spawn.py (rules): Read(./secret.txt)" in cli_transcript and "TOP-SECRET-VALUE" not in cli_transcript
    assert not [p for p in session_root.rglob("*") if p.is_file() and "TOP-SECRET-VALUE" in p.read_text(errors="replace")]


def test_a_tree_wide_deny_holds_at_depth_2_through_the_cli_too(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TOP-SECRET-VALUE\n")
    leaf = mock_task("leaf reads", [{"tool": "Read", "input": {"file_path": str(tmp_path / "secret.txt")}}, {"text": "leaf-result"}])
    root = delegate("root", delegate("middle", leaf, "middle-result"), "root-result")
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--deny", "Read(./secret.txt)", "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    leaf_dir, leaf_meta = by_depth(session_root)[2]
    assert "Read(./secret.txt)" in leaf_meta["permissions"]["deny"]
    # The CLI holds the tree's rules itself (its --disallowedTools): the call is refused before any hook.
    cli_transcript = (leaf_dir / "subagent.jsonl").read_text()
    assert "denied by your permission settings" in cli_transcript and "TOP-SECRET-VALUE" not in cli_transcript


def test_max_depth_2_withholds_the_agent_tool_at_depth_2(env: dict[str, str], session_root: Path, mock_model: Any) -> None:
    leaf = mock_task("leaf at two", [{"text": "leaf-result"}])
    middle = delegate("middle", leaf, "middle-result")
    root = delegate("root", middle, "root-result")
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--max-depth", "2"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    chain = by_depth(session_root)
    assert chain[1][1]["tools"] == ["Agent", "Read"] and chain[2][1]["tools"] == ["Read"]
    root_asked, middle_asked, leaf_asked = requests_by_agent(mock_model.log)
    assert [len(root_asked), len(middle_asked), len(leaf_asked)] == [2, 2, 1]
    assert all("Agent" in r["tools"] for r in [*root_asked, *middle_asked])
    assert all("Agent" not in r["tools"] for r in leaf_asked)

    # At the limit the root itself gets no Agent tool, and no subagent starts.
    mock_model.log.write_text("")
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--max-depth", "0"], env)
    (alone,) = requests_by_agent(mock_model.log)
    assert all("Agent" not in r["tools"] for r in alone)
    # Its call anyway starts nothing: it is recorded as a refused child, as a process child's spawn would be.
    assert len(agent_dirs(session_root)) == 5
    assert sorted(load(d / "outcome.json")["status"] for d in agent_dirs(session_root))[-1] == "refused"


def test_a_childs_deadline_and_budget_stop_it_at_the_next_boundary(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    write_agent(tmp_path, "hasty", "description: short deadline\ntimeout: 1\ntools: Read")
    write_agent(tmp_path, "thrifty", "description: small budget\nmax_budget_usd: 0.01\ntools: Read")
    read = {"tool": "Read", "input": {"file_path": str(tmp_path / ".claude" / "agents" / "hasty.md")}}
    slow = mock_task("slow one", [{**read, "sleep": 2.5}, {**read}, {"text": "slow-result"}])
    costly = mock_task(
        "costly one", [{**read, "usage": {"input_tokens": 100_000, "output_tokens": 10}}, {**read}, {"text": "costly-result"}]
    )
    root = mock_task(
        "root",
        [
            {"tool": "Agent", "input": {"description": "slow", "prompt": slow, "subagent_type": "hasty", "run_in_background": False}},
            {"tool": "Agent", "input": {"description": "costly", "prompt": costly, "subagent_type": "thrifty", "run_in_background": False}},
            {"text": "root-result"},
        ],
    )
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    children = {m["agent"]: d for d in agent_dirs(session_root) if (m := load(d / "meta.json"))["depth"] == 1}
    hasty, thrifty = outcome(children["hasty"]), outcome(children["thrifty"])
    assert hasty["status"] == "timeout" and "deadline" in hasty["reason"], hasty
    assert thrifty["status"] == "failed" and "budget" in thrifty["reason"], thrifty
    # Stopped at the boundary: the call after the slow turn never ran, nor the answer after it.
    assert [json.loads(line)["message"]["verdict"] for line in (children["hasty"] / "transcript.jsonl").read_text().splitlines()] == [
        "deny"
    ]
    assert [m["type"] for m in cli_messages(children["hasty"])] == ["user", "assistant", "user"]
    assert load(children["hasty"] / "meta.json")["deadline"] is not None
    validate_records(session_root)


def test_a_schema_is_retried_then_failed(env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: Any) -> None:
    schema = '{"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}'
    write_agent(tmp_path, "strict", f"description: answers in JSON\nschema: '{schema}'\ntools: Read")
    child = mock_task("strict child", [{"text": "not json"}, {"text": '{"wrong": 1}'}, {"text": "still not"}])
    good = mock_task("strict good", [{"text": "prose"}, {"text": '{"answer": "yes"}'}])
    root = mock_task(
        "root",
        [
            {"tool": "Agent", "input": {"description": "bad", "prompt": child, "subagent_type": "strict", "run_in_background": False}},
            {"tool": "Agent", "input": {"description": "good", "prompt": good, "subagent_type": "strict", "run_in_background": False}},
            {"text": "root-result"},
        ],
    )
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = {load(d / "meta.json")["task"].split(" MOCK")[0]: outcome(d) for d in agent_dirs(session_root)}
    bad = rows["strict child"]
    assert bad["status"] == "failed" and "schema" in bad["reason"] and bad["validation_errors"], bad
    _, bad_asked, good_asked = requests_by_agent(mock_model.log)
    assert len(bad_asked) == 3 and len(good_asked) == 2  # answers, then retries the schema refused
    assert rows["strict good"]["status"] == "done" and rows["strict good"]["output"] == {"answer": "yes"}
    validate_records(session_root)


def test_kill_of_an_in_process_child_ends_it_and_spares_its_parent(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    read = {"tool": "Read", "input": {"file_path": str(tmp_path / "a.txt")}, "sleep": 0.5}
    (tmp_path / "a.txt").write_text("a\n")
    child = mock_task("long child", [read] * 40 + [{"text": "child-result"}])
    root = delegate("root", child, "root-result")
    runner = start_spawn(["--task", root, "--tools", "Agent,Read", *INPROCESS, "--timeout", "120"], env)
    try:
        assert wait_until(
            lambda: any(load(d / "meta.json")["depth"] == 1 for d in agent_dirs(session_root) if (d / "meta.json").exists()), 60
        )
        child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
        killed = run_spawn(["kill", child_dir.name, "--session", str(child_dir.parent.parent)], env)
        assert killed.returncode == spawn.ExitCode.OK, killed.stderr
        assert runner.poll() is None, "kill of an in-process child must not end its parent's runner"
        out, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == spawn.ExitCode.OK, err
    assert json.loads(out.splitlines()[-1])["output"] == "root-result"
    assert outcome(child_dir)["status"] == "killed"
    # Its turn ended at the next boundary: far fewer than the 40 scripted calls ran.
    ran = [line for line in (child_dir / "subagent.jsonl").read_text().splitlines() if '"tool_result"' in line]
    assert len(ran) < 20
    validate_records(session_root)


def test_kill_of_the_parent_ends_its_in_process_children(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    child = mock_task("long child", [{"tool": "Read", "input": {"file_path": str(tmp_path / "a.txt")}, "sleep": 0.5}] * 40)
    runner = start_spawn(["--task", delegate("root", child, "root-result"), "--tools", "Agent,Read", *INPROCESS], env)
    try:
        assert wait_until(
            lambda: len(agent_dirs(session_root)) == 2 and all((d / "meta.json").exists() for d in agent_dirs(session_root)), 60
        )
        root_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 0)
        assert run_spawn(["kill", root_dir.name, "--session", str(root_dir.parent.parent)], env).returncode == spawn.ExitCode.OK
        runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert {outcome(d)["status"] for d in agent_dirs(session_root)} == {"killed"}
    validate_records(session_root)


def test_auto_gives_a_child_with_its_own_sandbox_a_process(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    child_args = ["--task", "child", "--tools", "Read", "--sandbox", "on"]
    planned = run_spawn(["--dry-run", *child_args], {**env, **AS_CHILD, "SPAWN_PLACEMENT": "auto"})
    assert planned.returncode == spawn.ExitCode.OK, planned.stderr
    placement = stdout_json(planned)["placement"]
    assert placement["backend"] == "local" and "its own sandbox" in placement["reason"] and placement["policy"] == "auto"
    plain = stdout_json(run_spawn(["--dry-run", "--task", "child", "--tools", "Read", "--placement", "auto"], env))["placement"]
    assert plain == {"backend": "local", "reason": "a root runs as the process it was started as", "policy": "auto"}
    if shutil.which("bwrap") is None or shutil.which("socat") is None:
        pytest.skip(f"the real run needs Claude Code's sandbox: {spawn.SANDBOX_INSTALL}")
    write_agent(tmp_path, "timed", "description: has a deadline\ntimeout: 30\ntools: Read")
    sandboxed = mock_task("sandboxed child", [{"text": "child-result"}])
    native = mock_task("plain child", [{"text": "plain-result"}])
    call = {"description": "plain", "prompt": native, "subagent_type": "general-purpose", "run_in_background": False}
    steps: list[dict[str, Any]] = [
        {"bash": spawn_in_bash("--task", sandboxed, "--tools", "Read", "--sandbox", "on")},
        {"tool": "Agent", "input": call},
        {"tool": "Agent", "input": {**call, "subagent_type": "timed"}},
        {"text": "root-result"},
    ]
    proc = run_spawn(["--task", mock_task("root", steps), "--tools", "Agent,Bash,Read", "--placement", "auto", "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    children = {m["task"].split(" MOCK")[0]: m for m in metas(session_root).values() if m["depth"] == 1}
    assert sorted(children) == ["plain child", "sandboxed child"]  # the timed one was never started
    process, inside = children["sandboxed child"], children["plain child"]
    assert process["placement"]["backend"] == "local" and "its own sandbox" in process["placement"]["reason"]
    assert process["sandbox"] == "on" and process["pid"] != inside["pid"]
    assert inside["placement"]["backend"] == "inprocess" and "nothing it needs requires a process" in inside["placement"]["reason"]
    root_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 0)
    refused = [json.loads(line) for line in (root_dir / "transcript.jsonl").read_text().splitlines()]
    assert any("needs a process (a hard deadline)" in json.dumps(line) for line in refused)


def test_placement_flags_refused_with_what_to_do(env: dict[str, str], session_root: Path) -> None:
    bad = run_spawn(["--task", "x", "--placement", "cloud"], env)
    assert bad.returncode == spawn.ExitCode.USAGE and bad.stderr.startswith("spawn: error: --placement 'cloud' is not a placement")
    # Without the Ray sibling (spawn.py copied alone), a ray placement says what to copy.
    ray = run_spawn(["--task", "x", "--placement", "ray:127.0.0.1:6379"], {**env, "SPAWN_RAY_SIBLING": "/nonexistent/ray_place.py"})
    assert ray.returncode == spawn.ExitCode.USAGE and "ray_place.py is not there" in ray.stderr
    assert not session_root.exists() or not agent_dirs(session_root)
    moved = run_spawn(["--task", "x", "--placement", "ray:b:1", "--dry-run"], {**env, **AS_CHILD, "SPAWN_PLACEMENT": "ray:a:1"})
    assert moved.returncode == spawn.ExitCode.USAGE and "never move to another" in moved.stderr
    from_bash = run_spawn(["--task", "x", "--dry-run"], {**env, **AS_CHILD, "SPAWN_PLACEMENT": "inprocess"})
    assert from_bash.returncode == spawn.ExitCode.USAGE and "Agent tool" in from_bash.stderr
    widened = stdout_json(run_spawn(["--task", "x", "--dry-run", "--placement", "local"], {**env, **AS_CHILD, "SPAWN_PLACEMENT": "auto"}))
    assert widened["placement"]["policy"] == "auto" and any("lowered" in w for w in widened["warnings"])


def test_an_in_process_childs_ask_is_its_own_and_answered_up_the_tree(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("PLAIN-CONTENT\n")
    write_agent(tmp_path, "asker", "description: asks first\ntools: Read\npermissions:\n  ask: ['Read(./a.txt)']")
    read = {"tool": "Read", "input": {"file_path": str(tmp_path / "a.txt")}}
    child = mock_task("asking child", [read, read, {"text": "child-result"}])
    runner = start_spawn(["--task", delegate("root", child, "root-result", subagent_type="asker"), "--tools", "Agent,Read", *INPROCESS,
                          "--cwd", str(tmp_path)], env)  # fmt: skip
    try:
        first = wait_for_ask(session_root)
        child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
        assert first["agent_id"] == child_dir.name and first["rule"] == "Read(./a.txt)"
        assert run_spawn(["approve", first["id"]], env).returncode == spawn.ExitCode.OK

        def asks() -> list[dict[str, Any]]:
            return [load(p) for p in session_root.glob("*/asks/q-*.json") if not p.name.endswith(".answer.json")]

        assert wait_until(lambda: len(asks()) == 2, 60)
        (second,) = [a for a in asks() if a["id"] != first["id"]]
        assert run_spawn(["deny", second["id"]], env).returncode == spawn.ExitCode.OK
        _, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == spawn.ExitCode.OK, err
    decisions = [json.loads(line)["message"] for line in (child_dir / "transcript.jsonl").read_text().splitlines()]
    assert [(d["verdict"], d["by"]) for d in decisions] == [("allow", "approve"), ("deny", "deny")]
    results = [m for m in cli_messages(child_dir) if m["type"] == "user"][1:]
    assert "PLAIN-CONTENT" in json.dumps(results[0]) and "denied by spawn.py (deny)" in json.dumps(results[1])

"""The broker: a sandboxed agent spawns through its runner, outside the sandbox.

End to end: the real bundled claude CLI through spawn.py against the scripted
model, with Claude Code's sandbox (bubblewrap and socat, which `.ci/run`
installs). A sandboxed spawner's Bash sees the session read-only; its spawns
and kills go to its request box, and its runner runs them as its own.
"""

from __future__ import annotations

import json
import os
import py_compile
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import ROOT, SPAWN, agent_dirs, load, metas, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records

import spawn

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("socat") is None, reason=f"Claude Code's sandbox needs them: {spawn.SANDBOX_INSTALL}"
)


def transcript_text(agent_dir: Path) -> str:
    return (agent_dir / "transcript.jsonl").read_text()


def by_task(session_root: Path) -> dict[str, Path]:
    return {load(d / "meta.json")["task"].split(" ")[0]: d for d in agent_dirs(session_root)}


def plant_request(name: str, text: str) -> str:
    """Bash that puts a request file straight into the agent's box (as a hostile agent would), then prints its reply."""
    return (
        'BOX="$SPAWN_SESSION/requests/$SPAWN_AGENT_ID"; '
        f"cat > \"$BOX/.{name}\" <<'REQUEST_END'\n{text}\nREQUEST_END\n"
        f'mv "$BOX/.{name}" "$BOX/{name}.json"; '
        f'for i in $(seq 300); do [ -f "$BOX/{name}.reply.json" ] && break; sleep 0.1; done; '
        f'echo "reply {name}:"; cat "$BOX/{name}.reply.json"; echo'
    )


def test_a_sandboxed_spawner_spawns_through_its_runner_and_can_not_write_a_record(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # The session lies inside the spawner's writable cwd, as sessions/ beside spawn.py in a project does.
    forge = (
        'A="$SPAWN_SESSION/agents"; '
        """echo FORGED > "$A/$SPAWN_AGENT_ID/meta.json"; echo "own meta rc=$?"; """
        """for d in "$A"/*; do echo '{"status": "done", "output": "FORGED"}' > "$d/outcome.json"; touch "$d/.done"; done; """
        """echo '{"FORGED": 1}' >> "$SPAWN_SESSION/ledger.jsonl"; echo "ledger rc=$?"; """
        'mkdir "$A/a2-abcdef"; echo "mkdir rc=$?"; echo ok > ok.txt'
    )
    child = mock_task("child", [{"text": "child done"}])
    spawner = mock_task(
        "spawner",
        [
            {"bash": forge},
            {"bash": spawn_in_bash("--task", child, "--tools", "Bash,Read", "--max-depth", "5")},
            {"text": "spawner done"},
        ],
    )
    sibling = mock_task("sibling", [{"text": "sibling done"}])
    steps = [{"bash": spawn_in_bash("--task", t, "--tools", "Bash,Read", "--sandbox", "on")} for t in (sibling, spawner)]
    root = mock_task("root", [*steps, {"text": "root done"}])
    args = ["--task", root, "--tools", "Bash,Read", "--max-depth", "2", "--sandbox", "off", "--cwd", str(tmp_path)]
    proc = run_spawn([*args, "--max-budget-usd", "5"], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root done"
    dirs = by_task(session_root)
    assert sorted(dirs) == ["child", "root", "sibling", "spawner"]  # no a2-abcdef
    spawner_dir, child_dir = dirs["spawner"], dirs["child"]
    spawner_meta, child_meta = load(spawner_dir / "meta.json"), load(child_dir / "meta.json")
    assert spawner_meta["sandbox"] == "on" and spawner_meta["depth"] == 1 and spawner_meta["max_depth"] == 2
    # The child is the spawner's, registered by its runner, its limits narrowed from the spawner's.
    assert (child_meta["parent_id"], child_meta["depth"], child_meta["max_depth"]) == (spawner_dir.name, 2, 2)
    assert child_meta["max_budget_usd"] is not None and child_meta["max_budget_usd"] <= spawner_meta["max_budget_usd"]
    assert child_meta["sandbox"] == "on"  # a leaf with Bash, under auto
    assert any("--max-depth 5 lowered" in w for w in child_meta["warnings"]), child_meta["warnings"]
    assert load(child_dir / "outcome.json")["output"] == "child done"
    # The spawner got the child's JSON on its stdout, as from any spawn.
    text = transcript_text(spawner_dir)
    assert '\\"output\\": \\"child done\\"' in text or '"output": "child done"' in text, text[-3000:]
    # Its Bash wrote none of the records: its own meta, its siblings', the ledger, a .done, an agent directory.
    for name in ("own meta rc=1", "ledger rc=1", "mkdir rc=1"):
        assert name in text, text[-3000:]
    assert text.count("Read-only file system") >= 5
    for task, output in (("root", "root done"), ("sibling", "sibling done"), ("spawner", "spawner done"), ("child", "child done")):
        outcome = load(dirs[task] / "outcome.json")
        assert (outcome["output"], outcome["committed_by"]) == (output, "self")
    assert "FORGED" not in (spawner_dir.parent.parent / "ledger.jsonl").read_text()
    assert (tmp_path / "ok.txt").read_text() == "ok\n"  # the rest of its cwd stays writable
    validate_records(session_root)


def test_forged_and_hostile_requests_are_narrowed_or_refused_and_the_runner_goes_on(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    wide = mock_task("wide", [{"text": "wide done"}])
    later = mock_task("later", [{"text": "later done"}])
    cwd = str(tmp_path)
    forged = {
        "argv": [
            *("--task", wide, "--max-depth", "9", "--max-budget-usd", "1000"),
            *("--tools", "Bash,Read,Write,WebFetch", "--timeout", "999999", "--sandbox", "off"),
        ],
        "cwd": cwd,
    }
    hostile = {
        "1111111111111111": json.dumps(forged),
        "2222222222222222": "not json {{{",
        "4444444444444444": json.dumps({"argv": ["--task", "x", "--output", str(tmp_path / "escaped.txt")], "cwd": cwd}),
        "5555555555555555": json.dumps({"argv": ["--task", "x", "--agent", "command:touch /tmp/pwned"], "cwd": cwd}),
        "6666666666666666": json.dumps({"argv": ["--task", "x"], "cwd": "/"}),
        "7777777777777777": json.dumps({"argv": ["kill", "a0-000000"], "cwd": cwd}),
    }
    steps = [{"bash": plant_request(name, text)} for name, text in hostile.items()]
    deep = 'BOX="$SPAWN_SESSION/requests/$SPAWN_AGENT_ID"; python3 -c "print(\'[\' * 100000 + \']\' * 100000)" > "$BOX/.d"; '
    deep += 'mv "$BOX/.d" "$BOX/3333333333333333.json"; '
    deep += 'for i in $(seq 300); do [ -f "$BOX/3333333333333333.reply.json" ] && break; sleep 0.1; done; '
    deep += 'echo "reply 3333333333333333:"; cat "$BOX/3333333333333333.reply.json"; echo'
    steps.append({"bash": deep})
    # Written whole under a client's temp name, then renamed in: read half-written, it would be "not JSON".
    huge = 'BOX="$SPAWN_SESSION/requests/$SPAWN_AGENT_ID"; head -c 400000 /dev/zero | tr "\\0" x > "$BOX/.8888888888888888.tmp"; '
    huge += 'mv "$BOX/.8888888888888888.tmp" "$BOX/8888888888888888.json"; '
    huge += 'for i in $(seq 300); do [ -f "$BOX/8888888888888888.reply.json" ] && break; sleep 0.1; done; '
    huge += 'echo "reply 8888888888888888:"; cat "$BOX/8888888888888888.reply.json"; echo'
    steps.append({"bash": huge})
    # A directory, with something in it, where a request belongs: answered once, and the runner goes on.
    stuck = 'BOX="$SPAWN_SESSION/requests/$SPAWN_AGENT_ID"; mkdir "$BOX/9999999999999999.json"; touch "$BOX/9999999999999999.json/x"; '
    stuck += 'for i in $(seq 300); do [ -f "$BOX/9999999999999999.reply.json" ] && break; sleep 0.1; done; '
    stuck += 'echo "reply 9999999999999999:"; cat "$BOX/9999999999999999.reply.json"; echo'
    steps.append({"bash": stuck})
    steps.append({"bash": spawn_in_bash("--task", later, "--tools", "Read")})
    spawner = mock_task("spawner", [*steps, {"text": "spawner done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", spawner, "--tools", "Bash,Read", "--sandbox", "on")}, {"text": "root done"}])
    args = ["--task", root, "--tools", "Bash,Read", "--max-depth", "2", "--sandbox", "off", "--cwd", cwd, "--max-budget-usd", "5"]
    proc = run_spawn([*args, "--timeout", "600"], env, timeout=300)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = by_task(session_root)
    assert sorted(dirs) == ["later", "root", "spawner", "wide"]  # nothing else ran
    spawner_meta, wide_meta = load(dirs["spawner"] / "meta.json"), load(dirs["wide"] / "meta.json")
    # The forged request ran, as a spawn of the spawner's, every limit narrowed to the spawner's.
    assert (wide_meta["parent_id"], wide_meta["depth"], wide_meta["max_depth"]) == (dirs["spawner"].name, 2, 2)
    assert wide_meta["max_budget_usd"] <= spawner_meta["max_budget_usd"] <= 5
    assert set(wide_meta["tools"]) <= {"Bash", "Read"}
    assert wide_meta["deadline"] <= spawner_meta["deadline"]
    assert wide_meta["sandbox"] == "on"
    assert any("lowered" in w for w in wide_meta["warnings"]) and any("dropped" in w for w in wide_meta["warnings"])
    text = transcript_text(dirs["spawner"])
    for name, why in (
        ("2222222222222222", "not JSON"),
        ("3333333333333333", "not JSON"),
        ("4444444444444444", "--output"),
        ("5555555555555555", "--agent takes a definition"),
        ("6666666666666666", "outside the agent"),
        ("7777777777777777", "not below"),
        ("8888888888888888", "of at most 262144 bytes"),
        ("9999999999999999", "not a readable request"),
    ):
        reply = text.split(f"reply {name}:")[-1][:1500]
        assert 'exit_code\\": 4' in reply and why in reply, (name, reply)
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/pwned").exists()
    # The runner served its agent to the end: a spawn after them all ran.
    assert load(dirs["later"] / "outcome.json")["output"] == "later done"
    assert load(dirs["root"] / "outcome.json")["output"] == "root done"
    validate_records(session_root)


def test_kill_through_the_broker_ends_only_the_agents_own_subtree(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    sleeper = mock_task("sleeper", [{"bash": "echo busy; sleep 60"}, {"text": "sleeper done"}])
    sibling = mock_task("sibling", [{"bash": "sleep 8"}, {"text": "sibling done"}])
    launch = spawn_in_bash("--task", sleeper, "--tools", "Bash", "--background")
    kill = (
        f'ID=$({launch} | python3 -c "import json,sys; print(json.load(sys.stdin)[\'id\'])"); echo "child $ID"; '
        'for other in $(ls "$SPAWN_SESSION/agents" | grep -v "$SPAWN_AGENT_ID" | grep -v "$ID"); do '
        '"$SPAWN_PYTHON" "$SPAWN_PY" kill "$other"; echo "kill $other rc=$?"; done; '
        '"$SPAWN_PYTHON" "$SPAWN_PY" kill "$ID"; echo "kill child rc=$?"; '
        # status and wait read the session, which is readable in the sandbox.
        '"$SPAWN_PYTHON" "$SPAWN_PY" status --json > /dev/null; echo "status rc=$?"; '
        '"$SPAWN_PYTHON" "$SPAWN_PY" wait "$ID" | grep -c killed; echo "wait rc=$?"'
    )
    spawner = mock_task("spawner", [{"bash": kill}, {"text": "spawner done"}])
    root = mock_task(
        "root",
        [
            {"bash": spawn_in_bash("--task", sibling, "--tools", "Bash", "--background")},
            {"bash": spawn_in_bash("--task", spawner, "--tools", "Bash", "--sandbox", "on")},
            {"bash": '"$SPAWN_PYTHON" "$SPAWN_PY" wait $(ls "$SPAWN_SESSION/agents" | grep ^a1-)'},
            {"text": "root done"},
        ],
    )
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-depth", "2", "--sandbox", "off", "--cwd", str(tmp_path)], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = by_task(session_root)
    assert load(dirs["sleeper"] / "outcome.json")["status"] == "killed"
    assert f"agent {dirs['spawner'].name}" in load(dirs["sleeper"] / "outcome.json")["reason"]
    for task in ("sibling", "root"):
        outcome = load(dirs[task] / "outcome.json")
        assert outcome.get("output") == f"{task} done", outcome
    text = transcript_text(dirs["spawner"])
    assert "kill child rc=0" in text and "status rc=0" in text and "wait rc=0" in text, text[-3000:]
    for task in ("sibling", "root"):
        assert f"kill {dirs[task].name} rc=4" in text and f"kill: {dirs[task].name} not below {dirs['spawner'].name}" in text
    validate_records(session_root)


def test_a_chain_of_depth_three_under_auto_sandboxes_every_agent_below_the_root(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    task = mock_task("a3", [{"bash": "echo deep > deep.txt"}, {"text": "a3 done"}])
    for name in ("a2", "a1", "a0"):
        task = mock_task(name, [{"bash": spawn_in_bash("--task", task, "--tools", "Bash")}, {"text": f"{name} done"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--max-depth", "3", "--cwd", str(tmp_path)], env, timeout=300)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert sorted(by_depth) == [0, 1, 2, 3]
    assert [by_depth[d]["sandbox"] for d in range(4)] == ["off", "on", "on", "on"]
    for depth in (1, 2, 3):
        assert by_depth[depth]["parent_id"] == by_depth[depth - 1]["id"]
    dirs = by_task(session_root)
    assert load(dirs["a3"] / "outcome.json")["output"] == "a3 done"
    assert (tmp_path / "deep.txt").read_text() == "deep\n"
    assert '\\"output\\": \\"a2 done\\"' in transcript_text(dirs["a1"])
    # Each brokered spawn was forked by the session's server as its runner's child (the server is
    # long up by the time a sandboxed agent files one), and the runner logged where its time went.
    (session,) = {Path(m["session"]) for m in by_depth.values()}
    ran = [json.loads(line) for line in (session / spawn.BROKER_LOG).read_text().splitlines()]
    assert sorted((r["agent"], r["pid"], r["start"], r["exit_code"]) for r in ran) == sorted(
        (by_depth[d - 1]["id"], by_depth[d]["pid"], "fork", 0) for d in (2, 3)
    )
    forked = [json.loads(line) for line in (session / spawn.FORKSERVER_LOG).read_text().splitlines()]
    assert {f["pid"] for f in forked if f.get("child_of")} == {by_depth[2]["pid"], by_depth[3]["pid"]}
    validate_records(session_root)


def test_a_definition_the_agent_could_have_written_runs_no_hooks_outside_its_sandbox(tmp_path: Path) -> None:
    """Unit: below a sandboxed agent, a definition with hooks or MCP servers where it can write is refused; one that only narrows is not."""
    cwd = tmp_path / "project"
    agents = cwd / "sub" / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "escape.md").write_text(
        "---\nname: escape\ndescription: runs a hook\nhooks:\n  PreToolUse:\n    - hooks:\n"
        "        - type: command\n          command: touch /tmp/escaped\n---\nYou escape.\n"
    )
    (agents / "plain.md").write_text("---\nname: plain\ndescription: no commands of its own\n---\nYou are plain.\n")
    env = {"HOME": str(tmp_path / "home")}
    definitions, _ = spawn.load_definitions(cwd / "sub", env)
    real = os.path.realpath(cwd)
    writes = [spawn.SandboxWrites("a1-0123ab", (real,), (os.path.join(real, ".claude"),))]
    problem = spawn.definition_refusal(definitions["escape"], env, writes)
    assert problem is not None and "escape" in problem and "a1-0123ab" in problem and "outside its sandbox" in problem
    assert spawn.definition_refusal(definitions["plain"], env, writes) is None
    # The same file where no sandboxed agent above writes is the user's own: allowed.
    assert spawn.definition_refusal(definitions["escape"], env, []) is None
    elsewhere = [spawn.SandboxWrites("a1-0123ab", (str(tmp_path / "elsewhere"),), ())]
    assert spawn.definition_refusal(definitions["escape"], env, elsewhere) is None
    # The agent's own .claude/ is held read-only in its sandbox: a definition there is not the agent's.
    moved = cwd / ".claude" / "agents"
    moved.mkdir(parents=True)
    (agents / "escape.md").rename(moved / "escape.md")
    definitions, _ = spawn.load_definitions(cwd, env)
    assert spawn.definition_refusal(definitions["escape"], env, writes) is None


def test_a_brokered_wait_takes_ids_and_its_own_flags_only() -> None:
    """Unit: wait is brokered (it lends the agent's slot while it blocks); nothing but ids, --all/--any and --timeout passes."""
    asked = ["a1-0123ab", "a1-4567cd", "--any", "--timeout", "30"]
    assert spawn.checked_wait_argv(asked) == asked
    assert spawn.checked_wait_argv(["--timeout=2.5", "a2-0123ab"]) == ["--timeout", "2.5", "a2-0123ab"]
    bad_ones = (
        ["--session", "/tmp", "a1-0123ab"],
        ["a1-0123ab", "--timeout", "soon"],
        ["--all"],
        ["../a1-0123ab"],
        ["a1-0123ab", "--timeout"],
    )
    for bad in bad_ones:
        assert isinstance(spawn.checked_wait_argv(bad), str), bad


def test_a_sandboxed_spawner_steers_its_child_through_its_runner(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """send goes through the runner (a sandbox closes the inbox socket); writers and answers are refused in a line."""
    child = mock_task("child", [{"bash": "sleep 3"}, {"text": "child done"}])
    launch = spawn_in_bash("--task", child, "--tools", "Bash", "--ask", "Bash(touch:*)", "--background")
    (tmp_path / "g.yaml").write_text("tasks:\n  - id: a\n    task: anything\n")
    steer = (
        'S="$SPAWN_PYTHON $SPAWN_PY"; '
        f'ID=$({launch} | python3 -c "import json,sys; print(json.load(sys.stdin)[\'id\'])"); echo "child $ID"; '
        '$S send "$ID" "steered from above"; echo "send rc=$?"; '
        '$S send "$SPAWN_AGENT_ID" "to myself"; echo "self send rc=$?"; '
        '$S approve q-0a1b2c; echo "approve rc=$?"; '
        '$S budget --raise 100 "$SPAWN_SESSION"; echo "budget rc=$?"; '
        '$S wait "$ID" > /dev/null; echo "wait rc=$?"; '
        '$S dag run g.yaml; echo "dag rc=$?"; '
        '$S reap; echo "reap rc=$?"; '
        '$S dag validate g.yaml > /dev/null; echo "validate rc=$?"; '
        'BOX="$SPAWN_SESSION/requests/$SPAWN_AGENT_ID"; touch "$BOX/.left-behind" "$BOX/0123456789abcdef.reply.json"; ls -a "$BOX"'
    )
    spawner = mock_task("spawner", [{"bash": steer}, {"text": "spawner done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", spawner, "--tools", "Bash", "--sandbox", "on")}, {"text": "root done"}])
    args = ["--task", root, "--tools", "Bash", "--max-depth", "2", "--sandbox", "off", "--cwd", str(tmp_path)]
    proc = run_spawn([*args, "--max-budget-usd", "5"], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = by_task(session_root)
    text = transcript_text(dirs["spawner"])
    for line in (
        "send rc=0",
        "wait rc=0",
        "validate rc=0",
        "dag rc=4",
        "reap rc=4",
        "self send rc=4",
        "approve rc=4",
        "budget rc=4",
        ".left-behind",
    ):
        assert line in text, (line, text[-4000:])
    assert "spawn: error: 'spawn.py dag run' writes the session" in text and "spawn: error: 'spawn.py reap' writes the session" in text
    assert "an ask is answered by the person or by the root" in text
    assert "spawn: error: 'spawn.py budget' can't run in a sandbox" in text and "Read-only file system" not in text
    assert f"send: {dirs['spawner'].name} not below {dirs['spawner'].name}" in text
    # The child took the message from above, sent by the spawner (its runner, by the kernel's ancestry).
    child_lines = [json.loads(line) for line in (dirs["child"] / "transcript.jsonl").read_text().splitlines()]
    [sent] = [r["message"] for r in child_lines if r.get("type") == spawn.SENT_LINE]
    assert sent["text"] == "steered from above" and sent["from"] == f"agent {dirs['spawner'].name}"
    assert load(dirs["child"] / "outcome.json")["output"] == "child done"
    # The spawner's box went with it: the temp file and the unread reply it left are gone.
    assert not (dirs["spawner"].parent.parent / "requests" / dirs["spawner"].name).exists()
    validate_records(session_root)


def test_a_brokered_send_takes_an_id_its_text_and_as_only() -> None:
    """Unit: send takes an agent id and its text, and --as a plain name; nothing else passes."""
    assert spawn.checked_send_argv(["a2-0123ab", "hello", "--as", "lead"]) == ["a2-0123ab", "hello", "--as", "lead"]
    assert spawn.checked_send_argv(["--as=lead", "a2-0123ab", "hi"]) == ["a2-0123ab", "hi", "--as", "lead"]
    bad_ones = (
        ["a2-0123ab"],
        ["../a2-0123ab", "hi"],
        ["a2-0123ab", "  "],
        ["a2-0123ab", "hi", "--session", "/tmp"],
        ["a2-0123ab", "hi", "--as", "a b/c"],
        ["a2-0123ab", "hi", "more"],
    )
    for bad in bad_ones:
        assert isinstance(spawn.checked_send_argv(bad), str), bad


def test_the_sandbox_clients_names_are_spawn_pys_unit() -> None:
    """Unit: programs/sandbox_client.py runs before spawn.py's imports, with its own copies of spawn.py's names: they agree."""
    assert spawn.CLIENT_BROKERED_VERBS == spawn.BROKERED_VERBS
    # What the client inlines becomes flags the runner takes; the file flags themselves it never takes.
    assert all(spawn.BROKER_FLAGS[inline] for inline in spawn.CLIENT_INLINED_FILES.values())
    assert not set(spawn.CLIENT_INLINED_FILES) & set(spawn.BROKER_FLAGS)
    assert (spawn.CLIENT_ENV_CALL, spawn.CLIENT_META, spawn.CLIENT_OUTCOME) == (spawn.ENV_CALL, spawn.META, spawn.OUTCOME)
    assert (spawn.CLIENT_REQUESTS_DIR, spawn.CLIENT_AGENTS_DIR, spawn.CLIENT_SCRATCH_DIR) == (
        spawn.REQUESTS_DIR,
        spawn.AGENTS_DIR,
        spawn.SCRATCH_DIR,
    )
    assert (spawn.CLIENT_REPLY_SUFFIX, spawn.CLIENT_STREAMS) == (spawn.REPLY_SUFFIX, spawn.STREAMS)
    assert spawn.CLIENT_REPLY_MAX_BYTES == spawn.BROKER_STDOUT_MAX_BYTES * 8
    assert spawn.CLIENT_STDERR_MAX_BYTES == spawn.BROKER_STDERR_MAX_BYTES
    assert (spawn.CLIENT_EXIT_STATE, spawn.CLIENT_EXIT_REFUSED, spawn.CLIENT_EXIT_INTERRUPTED) == (
        spawn.ExitCode.STATE,
        spawn.ExitCode.REFUSED,
        spawn.ExitCode.INTERRUPTED,
    )
    # And the stand-in compiles the same text: no name of it comes from spawn.py's own.
    scope: dict[str, object] = {"__name__": "sandbox_client"}
    exec(spawn.SANDBOX_CLIENT, scope)
    assert callable(scope["sandbox_client"]) and scope["sandbox_client"](["--task", "x"], {}) is None  # not in a sandbox here


def test_requests_and_replies_match_their_schemas(tmp_path: Path) -> None:
    """Unit: what the spawn.py inside writes, and what the runner answers, are the records schemas/ describes."""
    import jsonschema

    schemas = ROOT / "schemas"
    task_file = tmp_path / "task.md"
    task_file.write_text("review the diff")
    request = {"argv": spawn.inlined_argv(["--task-file", str(task_file), "--tools", "Read"]), "cwd": str(tmp_path)}
    assert request["argv"] == ["--task", "review the diff", "--tools", "Read"]
    jsonschema.validate(request, json.loads((schemas / "broker-request.json").read_text()))
    broker = spawn.Broker.__new__(spawn.Broker)
    broker.box = tmp_path
    broker.reply("0123456789abcdef", spawn.ExitCode.REFUSED, b"", b"spawn: error: refused\n" * 10_000)
    reply = load(tmp_path / "0123456789abcdef.reply.json")
    jsonschema.validate(reply, json.loads((schemas / "broker-reply.json").read_text()))
    assert reply["exit_code"] == spawn.ExitCode.REFUSED and len(reply["stderr"]) == spawn.BROKER_STDERR_MAX_BYTES


def test_uv_run_spawn_py_in_a_sandboxed_spawner_runs_the_trees_spawn_py(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """uv can't open its read-only cache in a sandbox: the `uv` on a sandboxed agent's PATH runs the tree's spawn.py instead."""
    child = mock_task("child", [{"text": "child done"}])
    script = str(SPAWN.resolve())
    steps = (
        f'uv run --quiet {shlex.quote(script)} --task {shlex.quote(child)} --tools Bash; echo "uv run rc=$?"',
        'uv --version > /dev/null 2>&1; echo "uv version rc=$?"; command -v uv',
    )
    spawner = mock_task("spawner", [*({"bash": step} for step in steps), {"text": "spawner done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", spawner, "--tools", "Bash", "--sandbox", "on")}, {"text": "root done"}])
    args = ["--task", root, "--tools", "Bash", "--max-depth", "2", "--sandbox", "off", "--cwd", str(tmp_path)]
    proc = run_spawn(args, env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = by_task(session_root)
    assert sorted(dirs) == ["child", "root", "spawner"]
    assert load(dirs["child"] / "meta.json")["parent_id"] == dirs["spawner"].name
    text = transcript_text(dirs["spawner"])
    assert "uv run rc=0" in text and '\\"output\\": \\"child done\\"' in text, text[-3000:]
    # Anything but spawn.py goes on to the real uv, whatever it makes of the sandbox.
    assert "uv version rc=" in text and "uv-shim-" in text


def uv_shim() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "uv_shim"}
    exec(spawn.UV_SHIM, namespace)  # the program's text, as spawn.py writes it
    return namespace


def test_the_uv_shim_finds_spawn_py_past_uvs_own_options() -> None:
    """Unit: `uv run [options] [--] PATH/spawn.py ARGS` is a spawn.py run; anything else is uv's."""
    run = uv_shim()["spawn_run"]
    assert run(["run", "spawn.py", "--task", "x"]) == ([], "spawn.py", ["--task", "x"])
    assert run(["run", "--script", "-q", "--python", "3.12", "../tools/spawn.py", "status"]) == (
        ["--script", "-q", "--python", "3.12"], "../tools/spawn.py", ["status"],
    )  # fmt: skip
    assert run(["run", "--with=rich", "--", "/a/b/spawn.py"]) == (["--with=rich"], "/a/b/spawn.py", [])
    for other in (["run", "other.py"], ["pip", "install", "spawn.py"], ["run", "--weird-flag", "spawn.py"], ["run"], []):
        assert run(other) is None, other


def test_the_uv_shim_runs_the_trees_spawn_py_only_where_uv_would_run_the_same(tmp_path: Path) -> None:
    """Unit: outside a sandbox, the tree's interpreter takes `uv run [inert options] PATH/spawn.py` only when
    PATH holds the bytes of the tree's spawn.py (so the same PEP 723 environment); in a sandbox, always."""
    command = uv_shim()["tree_command"]
    source = b"# /// script\n# dependencies = []\n# ///\nprint('x')\n"
    script, other = tmp_path / "spawn.py", tmp_path / "other" / "spawn.py"
    other.parent.mkdir()
    script.write_bytes(source)
    other.write_bytes(source + b"# another version\n")
    copy = tmp_path / "cache" / "spawn-x.pyc"
    copy.parent.mkdir()
    py_compile.compile(str(script), cfile=str(copy), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    env = {"SPAWN_PYTHON": "/tree/python", "SPAWN_PY": str(copy)}
    assert command(["run", "-q", str(script), "--task", "t"], env, False) == ["/tree/python", str(script), "--task", "t"]
    assert command(["run", str(other), "status"], env, False) is None  # other bytes: another environment, uv's
    assert command(["run", "--with", "rich", str(script)], env, False) is None  # an option that changes what runs
    assert command(["run", "--directory", "/x", str(script)], env, False) is None
    assert command(["run", str(script)], {"SPAWN_PY": str(copy)}, False) is None  # no tree here
    assert command(["run", "--with", "rich", str(other), "status"], env, True) == ["/tree/python", str(copy), "status"]
    source_env = {"SPAWN_PYTHON": "/tree/python", "SPAWN_PY": str(script)}  # a tree that runs its source (no copy)
    assert command(["run", str(script)], source_env, False) == ["/tree/python", str(script)]
    assert command(["run", str(other)], source_env, False) is None


def test_uv_run_of_the_trees_spawn_py_takes_the_trees_interpreter_and_anything_else_goes_to_uv(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    """Outside a sandbox too, an agent's `uv run spawn.py` skips uv's resolution when the script is the
    tree's own. uv is kept from resolving anything here (offline, an empty cache), so only the shim can
    start the child; a copy with other bytes goes to uv, which can't."""
    script = str(SPAWN.resolve())
    other = tmp_path / "other" / "spawn.py"
    other.parent.mkdir()
    other.write_bytes(Path(script).read_bytes() + b"# another version\n")
    child = mock_task("child", [{"text": "child done"}])
    no_uv = 'export UV_OFFLINE=1 UV_CACHE_DIR="$(mktemp -d)"; '
    steps = (
        f'{no_uv}uv run --quiet {shlex.quote(script)} --task {shlex.quote(child)} --tools Read; echo "tree rc=$?"',
        f'{no_uv}uv run --quiet {shlex.quote(str(other))} --task {shlex.quote(child)} --tools Read; echo "other rc=$?"',
    )
    root = mock_task("root", [*({"bash": step} for step in steps), {"text": "root done"}])
    args = ["--task", root, "--tools", "Bash,Read", "--max-depth", "2", "--sandbox", "off", "--cwd", str(tmp_path)]
    proc = run_spawn(args, env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = by_task(session_root)
    assert sorted(dirs) == ["child", "root"]  # the other copy started nothing
    assert load(dirs["child"] / "outcome.json")["status"] == "done"
    text = transcript_text(dirs["root"])
    assert "tree rc=0" in text and '\\"output\\": \\"child done\\"' in text, text[-3000:]
    assert "other rc=0" not in text and "other rc=" in text, text[-3000:]


def test_the_uv_shims_sh_passes_other_commands_to_the_next_uv_without_python(tmp_path: Path) -> None:
    """The shim's sh: a command naming no spawn.py goes straight to the next uv on PATH (no interpreter),
    one naming a spawn.py to the program, which gives it to that uv too when no tree is around; no uv: 127."""
    shim = spawn.uv_shim_folder({"SPAWN_CACHE_DIR": str(tmp_path / "cache")})
    assert shim is not None
    real = tmp_path / "real"
    real.mkdir()
    (real / "uv").write_text('#!/bin/sh\necho "real uv: $*"\n')
    (real / "uv").chmod(0o755)
    env = {"PATH": f"{shim}:{real}:/usr/bin:/bin", "SPAWN_PYTHON": sys.executable}
    for argv in (["pip", "list"], ["run", "--with", "x", "other/spawn.py", "status"]):
        out = subprocess.run([str(shim / "uv"), *argv], env=env, capture_output=True, text=True, check=False)
        assert (out.returncode, out.stdout) == (0, f"real uv: {' '.join(argv)}\n"), out.stderr
    alone = {"PATH": f"{shim}:/nonexistent"}
    none = subprocess.run([str(shim / "uv"), "pip", "list"], env=alone, capture_output=True, text=True, check=False)
    assert (none.returncode, none.stderr) == (127, "uv: command not found\n")


def sandboxed_spawner(tmp_path: Path) -> spawn.AgentMeta:
    """A depth-1 agent working in tmp_path, whose session is tmp_path: what checked_request checks against."""
    return spawn.AgentMeta(
        id="a1-000001", parent_id="a0-000000", depth=1, max_depth=2, pid=1, create_time=0.0, pgid=1, trace_id="t", span_id="s",
        traceparent="p", task="x", tools=["Bash"], disallowed_tools=[], model="m", cwd=str(tmp_path), started_at="",
        session=str(tmp_path), system_prompt="",
    )  # fmt: skip


def test_a_request_with_too_many_words_or_a_non_string_is_refused_unit(tmp_path: Path) -> None:
    """Each alone is enough: an over-long argv of strings, or a short one with a number in it."""
    meta = sandboxed_spawner(tmp_path)
    too_long = spawn.checked_request({"argv": ["status"] * (spawn.BROKER_ARGV_MAX + 1), "cwd": str(tmp_path)}, meta)
    assert too_long == f"argv must be at most {spawn.BROKER_ARGV_MAX} strings"
    assert spawn.checked_request({"argv": ["status", 1], "cwd": str(tmp_path)}, meta) == too_long
    cwd = str(tmp_path.resolve())
    # Past the length check, a well-formed request passes whole, each verb's words checked past the verb.
    for argv in (
        ["kill", "a1-0123ab"],
        ["wait", "a1-0123ab", "--any", "--timeout", "5"],
        ["send", "a1-0123ab", "look again", "--as", "lead"],
    ):
        checked = spawn.checked_request({"argv": argv, "cwd": str(tmp_path)}, meta)
        assert not isinstance(checked, str), checked
        words, folder = checked
        # On Linux the folder comes held by descriptor (resolved once): the path it holds is the cwd.
        held = os.readlink(f"/proc/self/fd/{folder}") if isinstance(folder, int) else folder
        spawn.close_folder(folder)
        assert (words, held) == (argv, cwd)


def test_a_request_is_an_object_with_a_list_and_a_string_and_may_hold_exactly_the_most_words_unit(tmp_path: Path) -> None:
    """Each field's type alone refuses it, and BROKER_ARGV_MAX words pass (mutants: checked_request)."""
    meta = sandboxed_spawner(tmp_path)
    cwd = str(tmp_path)
    for request in ({"argv": "status", "cwd": cwd}, {"argv": ["status"], "cwd": 7}, ["status"]):
        assert str(spawn.checked_request(request, meta)).startswith("not a request"), request
    most = ["wait", *["a1-0123ab"] * (spawn.BROKER_ARGV_MAX - 1)]
    checked = spawn.checked_request({"argv": most, "cwd": cwd}, meta)
    assert not isinstance(checked, str), checked
    spawn.close_folder(checked[1])


def test_a_requests_output_is_printed_as_it_comes_and_the_reply_finishes_it_unit(
    tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    """Unit: the runner appends the output to the box as it comes (Relay); the spawn.py inside prints it as it grows,
    then the rest once the reply names how much each stream holds; a stream it could not make goes in the reply."""
    box, owner = tmp_path / "requests" / "a1-0123ab", tmp_path / "agents" / "a1-0123ab"
    box.mkdir(parents=True)
    owner.mkdir(parents=True)
    request_id = "0123456789abcdef"
    (box / f"{request_id}.stderr").write_bytes(b"planted")  # the agent's own file: never written through
    relay = spawn.Relay(box, request_id)
    assert sorted(relay.files) == ["stdout"]
    output = spawn.StreamedOutput(str(box), request_id)
    relay.take("stdout", b"first line\n")
    output.pump()
    got = capfdbinary.readouterr()
    # Before the child has ended. (The agent's own file at a stream's name is its own to read.)
    assert (got.out, got.err) == (b"first line\n", b"planted")
    relay.take("stdout", b'{"output": "done"}\n')
    relay.take("stderr", b"a warning\n")
    relay.close()
    broker = spawn.Broker.__new__(spawn.Broker)
    broker.box = box
    broker.reply(request_id, 3, bytes(relay.kept["stdout"]), bytes(relay.kept["stderr"]), relay)
    reply = load(box / f"{request_id}.reply.json")
    assert reply["streamed"] == {"stdout": len(b'first line\n{"output": "done"}\n')} and "cut" not in reply
    jsonschema.validate(reply, json.loads((ROOT / "schemas" / "broker-reply.json").read_text()))
    assert spawn.await_reply(str(box), request_id, str(owner), output, None) == 3
    output.close()
    got = capfdbinary.readouterr()
    assert (got.out, got.err) == (b'{"output": "done"}\n', b"a warning\n")
    assert sorted(p.name for p in box.iterdir()) == []  # the reply and the streams are gone with their reading

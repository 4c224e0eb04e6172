"""End to end: the real bundled claude CLI, through spawn.py, against tools/mock_model.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    FAKE_API_KEY,
    READ_ID,
    ROOT,
    MockModel,
    agent_dirs,
    load,
    metas,
    mock_task,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_path,
    wait_until_gone,
)

import spawn


def test_single_agent_runs_bash_and_answers(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    task = mock_task("write a file", [{"bash": f"echo from-agent > {marker}"}, {"text": "wrote it"}])
    proc = run_spawn(["--task", task, "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = stdout_json(proc)
    assert result["status"] == "done"
    assert result["output"] == "wrote it"
    assert marker.read_text() == "from-agent\n"
    (agent_dir,) = agent_dirs(session_root)
    assert (agent_dir / ".done").exists() and not (agent_dir / ".fail").exists()
    outcome = load(agent_dir / "outcome.json")
    assert outcome["turns"] >= 2 and outcome["sdk_session_id"]
    assert isinstance(outcome["cost_usd"], float)
    # Money to the micro-dollar: no float noise such as 0.018425999999999998.
    for cost in (outcome["cost_usd"], result["cost_usd"]):
        assert len(repr(cost).partition(".")[2]) <= 6, cost
    assert validate_records(session_root) > 3


def test_stdout_json_is_indented_at_a_terminal_and_one_line_when_piped(env: dict[str, str], terminal: tuple[int, int]) -> None:
    primary, secondary = terminal
    task = mock_task("pretty", [{"text": "hi"}])
    proc = subprocess.Popen([sys.executable, str(ROOT / "spawn.py"), "--task", task, "--tools", "Read"], env=env, stdout=secondary)
    os.close(secondary)  # ours: the primary side then reads EOF (EIO) once spawn.py exits
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == spawn.ExitCode.OK
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert text.startswith('{\n  "id": "a0-') and json.loads(text)["output"] == "hi"
    piped = run_spawn(["--task", mock_task("piped", [{"text": "hi"}]), "--tools", "Read"], env)
    assert stdout_json(piped)["output"] == "hi"  # one line: what a parent agent's Bash reads


def test_the_cli_names_spawn_py_as_its_app_unless_the_caller_named_one(env: dict[str, str], mock_model: MockModel) -> None:
    # spawn.py names itself to the SDK (client_app), which the CLI puts in the
    # User-Agent of its model requests; a name the caller set is kept.
    ours = mock_task("app name: ours", [{"text": "one"}])
    theirs = mock_task("app name: theirs", [{"text": "two"}])
    assert run_spawn(["--task", ours, "--tools", "Read"], env).returncode == spawn.ExitCode.OK
    named = {**env, "CLAUDE_AGENT_SDK_CLIENT_APP": "their-app/2.0"}
    assert run_spawn(["--task", theirs, "--tools", "Read"], named).returncode == spawn.ExitCode.OK
    first, second = (r["user_agent"] for r in mock_model.requests() if r["kind"] == "main")  # one turn each, in turn
    assert f"client-app/spawn.py/{spawn.__version__}" in first
    assert "client-app/their-app/2.0" in second and "spawn.py" not in second


def test_depth3_chain_each_level_spawns_through_bash(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    leaf = mock_task("leaf level", [{"text": "leaf-result"}])
    middle = mock_task("middle level", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Read")}, {"text": "middle-result"}])
    root = mock_task("root level", [{"bash": spawn_in_bash("--task", middle, "--tools", "Bash,Read")}, {"text": "root-result"}])
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "3"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root-result"

    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert sorted(by_depth) == [0, 1, 2]
    assert "parent_id" not in by_depth[0]
    assert by_depth[1]["parent_id"] == by_depth[0]["id"]
    assert by_depth[2]["parent_id"] == by_depth[1]["id"]
    assert len({m["trace_id"] for m in by_depth.values()}) == 1
    assert by_depth[2]["parent_span_id"] == by_depth[1]["span_id"]
    assert by_depth[2]["tools"] == ["Read"]
    for d in agent_dirs(session_root):
        assert load(d / "outcome.json")["status"] == "done"
    # The middle agent's Bash saw the leaf's one-line JSON result.
    middle_dir = session_root.glob(f"*/agents/{by_depth[1]['id']}").__next__()
    assert '\\"output\\": \\"leaf-result\\"' in (middle_dir / "transcript.jsonl").read_text()
    assert len({r["task_digest"] for r in mock_model.requests() if r["kind"] == "main"}) == 3
    validate_records(session_root)


def test_refusal_at_max_depth_is_recorded_and_calls_no_model(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    too_deep = mock_task("too deep", [{"text": "must never run"}])
    child = mock_task("child", [{"bash": spawn_in_bash("--task", too_deep, "--tools", "Read")}, {"text": "child-saw-refusal"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash,Read")}, {"text": "root-done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "1"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert sorted(by_depth) == [0, 1, 2]
    refused_dir = next(session_root.glob(f"*/agents/{by_depth[2]['id']}"))
    outcome = load(refused_dir / "outcome.json")
    assert outcome["status"] == "refused" and outcome["exit_code"] == 4
    assert "depth" in outcome["reason"]
    assert (refused_dir / ".fail").exists()
    # No model request ever carried the refused agent's task.
    assert not any("too deep" in json.dumps(r) for r in mock_model.requests())
    assert all(r.get("step_index", 0) < 5 for r in mock_model.requests())
    child_transcript = next(session_root.glob(f"*/agents/{by_depth[1]['id']}")).joinpath("transcript.jsonl").read_text()
    assert "spawn: error: refused: depth limit" in child_transcript
    validate_records(session_root)


def test_refusal_from_the_command_line_exits_4(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    proc = run_spawn(["--task", "anything"], {**env, "SPAWN_DEPTH": "2", "SPAWN_MAX_DEPTH": "2"})
    assert proc.returncode == spawn.ExitCode.REFUSED
    assert proc.stderr.strip().splitlines()[-1].startswith("spawn: error: refused: depth limit")
    assert stdout_json(proc)["status"] == "refused"
    assert mock_model.requests() == []
    validate_records(session_root)


def test_background_children_and_wait_all(env: dict[str, str], session_root: Path) -> None:
    ids = []
    for name in ("first", "second"):
        proc = run_spawn(["--background", "--task", mock_task(name, [{"sleep": 1, "text": f"{name}-out"}])], env)
        assert proc.returncode == spawn.ExitCode.OK, proc.stderr
        launched = stdout_json(proc)
        assert launched["status"] == "running"
        assert Path(launched["agent_dir"], "meta.json").exists()
        ids.append(launched["id"])
    proc = run_spawn(["wait", *ids, "--all"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    waited = stdout_json(proc)
    assert waited["status"] == "done"
    assert sorted(a["output"] for a in waited["agents"]) == ["first-out", "second-out"]
    validate_records(session_root)


def test_agent_fans_out_in_background_and_waits(env: dict[str, str], session_root: Path) -> None:
    kids = [mock_task(f"kid {i}", [{"text": f"kid-{i}-out"}]) for i in (1, 2)]
    launch = " ; ".join(f'ids="$ids $({spawn_in_bash("--background", "--task", k)} | {READ_ID})"' for k in kids)
    script = f'ids=""; {launch}; {spawn_in_bash("wait")} $ids --all'
    root = mock_task("fan out", [{"bash": script}, {"text": "fanned"}])
    proc = run_spawn(["--task", root, "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_id = metas(session_root)
    root_id = stdout_json(proc)["id"]
    children = [m for m in by_id.values() if m.get("parent_id") == root_id]
    assert len(children) == 2 and all(m["background"] for m in children)
    transcript = next(session_root.glob(f"*/agents/{root_id}/transcript.jsonl")).read_text()
    assert "kid-1-out" in transcript and "kid-2-out" in transcript
    validate_records(session_root)


def wait_until_blocked_in_sleep(pid: int, timeout: float = 30) -> None:
    """Wait until `pid` sleeps in the kernel (epoll/poll, or nanosleep): a `wait` verb is then in its loop."""
    wchan = Path(f"/proc/{pid}/wchan")
    limit = time.monotonic() + timeout
    while not any(word in wchan.read_text() for word in ("poll", "nanosleep")):
        assert time.monotonic() < limit, f"process {pid} never reached its polling loop"
        time.sleep(0.05)


def test_wait_reports_a_sigkilled_child_without_hanging(env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--background", "--task", mock_task("slow", [{"sleep": 60, "text": "never"}])], env)
    launched = stdout_json(proc)
    agent_dir = Path(launched["agent_dir"])
    wait_for_path(agent_dir / "heartbeat.json")
    cli_pid = load(agent_dir / "heartbeat.json")["cli_pid"]
    waiter = start_spawn(["wait", launched["id"]], env)
    # Kill only once wait is blocked on the agent, so the death happens under its eyes.
    wait_until_blocked_in_sleep(waiter.pid)
    os.kill(launched["pid"], signal.SIGKILL)
    # Only a hang fails here: the bound is the heartbeat stale limit, after which
    # wait would say "stale", not "failed". How fast wait notices is `nox -s bench`'s job.
    out, err = waiter.communicate(timeout=spawn.HEARTBEAT_S * spawn.HEARTBEAT_STALE_BEATS)
    assert waiter.returncode == spawn.ExitCode.AGENT_FAILED, err
    result = json.loads(out)
    assert result["agents"][0]["status"] == "failed"
    assert "died without writing an outcome" in result["agents"][0]["reason"]
    # The orphaned CLI was ended too.
    assert not psutil.pid_exists(cli_pid) or psutil.Process(cli_pid).status() == psutil.STATUS_ZOMBIE
    validate_records(session_root)


def test_schema_invalid_output_fails_with_validation_errors(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("answer", [{"structured": {"wrong": 1}}])
    proc = run_spawn(["--task", task, "--schema", "summary", "--tools", ""], env)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED
    result = stdout_json(proc)
    assert result["status"] == "failed"
    assert any("'summary' is a required property" in e for e in result["validation_errors"])
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "outcome.json")["validation_errors"] == result["validation_errors"]
    assert (agent_dir / ".fail").exists()
    validate_records(session_root)


def test_schema_valid_output_goes_to_output_file(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "out" / "result.json"
    task = mock_task("answer", [{"structured": {"summary": "forty-two"}}])
    proc = run_spawn(["--task", task, "--schema", "summary", "--output", str(out_file)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == {"summary": "forty-two"}
    assert json.loads(out_file.read_text()) == {"summary": "forty-two"}
    validate_records(session_root)


def test_timeout_exits_124_and_ends_the_cli(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("stall", [{"sleep": 60, "text": "too late"}])
    started = time.monotonic()
    proc = run_spawn(["--task", task, "--timeout", "4"], env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert time.monotonic() - started < 30
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "outcome.json")["status"] == "timeout"
    beat = load(agent_dir / "heartbeat.json")
    assert not psutil.pid_exists(beat["cli_pid"]) or psutil.Process(beat["cli_pid"]).create_time() != beat["cli_create_time"]
    validate_records(session_root)


def test_cli_runs_in_its_own_process_group(env: dict[str, str], session_root: Path) -> None:
    proc = start_spawn(["--task", mock_task("group", [{"sleep": 3, "text": "ok"}])], env)
    wait_for_path(session_root)
    beat_path = None
    limit = time.monotonic() + 30
    while beat_path is None:
        found = list(session_root.glob("*/agents/*/heartbeat.json"))
        beat_path = found[0] if found else None
        assert time.monotonic() < limit
        time.sleep(0.05)
    beat = load(beat_path)
    meta = load(beat_path.parent / "meta.json")
    assert beat["cli_pgid"] == beat["cli_pid"] != meta["pgid"]
    assert os.getpgid(beat["cli_pid"]) == beat["cli_pgid"]
    proc.communicate(timeout=60)
    assert proc.returncode == spawn.ExitCode.OK


def test_kill_cascades_to_descendants(env: dict[str, str], session_root: Path) -> None:
    grandchild = mock_task("grandchild", [{"sleep": 60, "text": "never"}])
    child = mock_task("child", [{"bash": spawn_in_bash("--task", grandchild)}, {"text": "never"}])
    launched = stdout_json(
        run_spawn(
            ["--background", "--tools", "Bash", "--task", mock_task("root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}])],
            env,
        )
    )
    limit = time.monotonic() + 60
    while len([m for m in metas(session_root).values() if m["depth"] == 2]) < 1:
        assert time.monotonic() < limit, "grandchild never started"
        time.sleep(0.1)
    gc_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 2)
    wait_for_path(gc_dir / "heartbeat.json")
    pids = [m["pid"] for m in metas(session_root).values()] + [load(gc_dir / "heartbeat.json")["cli_pid"]]
    proc = run_spawn(["kill", launched["id"]], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    statuses = {d.name: load(d / "outcome.json")["status"] for d in agent_dirs(session_root)}
    assert set(statuses.values()) == {"killed"}, statuses
    # An agent that committed its own outcome (on its parent's SIGTERM) may
    # still be exiting when `kill` returns; and a blind sleep then
    # psutil.Process() raced with that exit (NoSuchProcess). Wait for it.
    assert wait_until_gone(pids, timeout=10) == []
    validate_records(session_root)


def test_status_shows_the_tree(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("child", [{"text": "c"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child)}, {"text": "r"}])
    assert run_spawn(["--task", root, "--tools", "Bash"], env).returncode == spawn.ExitCode.OK
    proc = run_spawn(["status", "--json"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = stdout_json(proc)["agents"]
    assert [r["depth"] for r in rows] == [0, 1]
    assert all(r["state"] == "done" for r in rows)
    assert rows[0]["subtree_cost_usd"] >= rows[0]["cost_usd"] + rows[1]["cost_usd"] - 1e-9
    text = run_spawn(["status"], env).stdout
    assert "a0-" in text and "  a1-" in text
    assert "containment" not in text  # what holds the tree is for status --json
    assert rows[0].get("containment") is not None
    # Each committer indexed its agent's row, keyed by its records as they
    # still are: nothing rewrites a record after the commit.
    session = Path(rows[0]["agent_dir"]).parent.parent
    index = [json.loads(line) for line in (session / spawn.STATUS_INDEX).read_text().splitlines()]
    assert sorted(e["name"] for e in index) == sorted(r["id"] for r in rows)
    shown = {r["id"]: r for r in rows}
    for entry in index:
        assert entry["keys"] == spawn.record_keys(shown[entry["name"]]["agent_dir"])
        assert entry["row"] == {
            k: v for k, v in shown[entry["name"]].items() if k not in ("agent_dir", "level") and not k.startswith("subtree")
        }


def test_no_secret_is_written_to_any_record(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("leak", [{"bash": "echo key=$ANTHROPIC_API_KEY; env"}, {"text": f"my key is {FAKE_API_KEY}"}])
    proc = run_spawn(["--task", task, "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    files = [p for p in session_root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert FAKE_API_KEY not in path.read_text(errors="replace"), path
    assert FAKE_API_KEY not in proc.stdout


def test_large_output_is_truncated_on_stdout_but_whole_on_disk(env: dict[str, str], session_root: Path) -> None:
    big = "x" * 40_000
    proc = run_spawn(["--task", mock_task("big", [{"text": big}])], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = stdout_json(proc)
    assert result["output_truncated"] is True
    assert len(proc.stdout) < 20_000
    assert "full output in" in result["output"]
    assert load(Path(result["outcome"]))["output"] == big


@pytest.mark.parametrize("tamper", ["unset", "zero", "fresh-root"])
def test_depth_cannot_be_reset_from_bash(
    env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: MockModel, tamper: str
) -> None:
    prefix = {
        "unset": "unset SPAWN_DEPTH SPAWN_MAX_DEPTH SPAWN_SESSION SPAWN_AGENT_ID; ",
        "zero": "export SPAWN_DEPTH=0 SPAWN_MAX_DEPTH=9; ",
        "fresh-root": f"unset SPAWN_SESSION SPAWN_DEPTH; export SPAWN_SESSION_ROOT={tmp_path / 'elsewhere'}; ",
    }[tamper]
    too_deep = mock_task("sneaky", [{"text": "must never run"}])
    child = mock_task("child", [{"bash": prefix + spawn_in_bash("--task", too_deep, "--max-depth", "9")}, {"text": "child-done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "root-done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-depth", "1"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert not any("sneaky" in json.dumps(r) for r in mock_model.requests())
    refused = [
        load(p)
        for p in [*session_root.glob("*/agents/*/outcome.json"), *(tmp_path / "elsewhere").glob("*/agents/*/outcome.json")]
        if load(p)["status"] == "refused"
    ]
    assert len(refused) == 1


def test_task_from_stdin(env: dict[str, str], session_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "spawn.py"), "--task-file", "-"],
        input=mock_task("from stdin", [{"text": "read it"}]),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "read it"
    assert load(agent_dirs(session_root)[0] / "meta.json")["task"].startswith("from stdin")


def test_wait_any_returns_with_the_first_outcome(env: dict[str, str], session_root: Path) -> None:
    fast = stdout_json(run_spawn(["--background", "--task", mock_task("fast", [{"text": "quick"}])], env))
    slow = stdout_json(run_spawn(["--background", "--task", mock_task("slow", [{"sleep": 60, "text": "never"}])], env))
    proc = run_spawn(["wait", fast["id"], slow["id"], "--any", "--timeout", "60"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    waited = stdout_json(proc)
    assert [a["id"] for a in waited["agents"]] == [fast["id"]]
    assert waited["pending"] == [slow["id"]]
    assert run_spawn(["kill", slow["id"]], env).returncode == spawn.ExitCode.OK
    timed_out = run_spawn(["wait", slow["id"], "--timeout", "0.5"], env)
    assert timed_out.returncode == spawn.ExitCode.AGENT_FAILED  # its outcome exists, and it is not done
    assert stdout_json(timed_out)["agents"][0]["status"] == "killed"


def test_sigint_interrupts_and_records_it(env: dict[str, str], session_root: Path) -> None:
    proc = start_spawn(["--task", mock_task("long", [{"sleep": 60, "text": "never"}])], env)
    wait_for_path(session_root)
    limit = time.monotonic() + 30
    while not list(session_root.glob("*/agents/*/heartbeat.json")):
        assert time.monotonic() < limit
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == spawn.ExitCode.INTERRUPTED
    assert json.loads(out)["status"] == "interrupted"
    validate_records(session_root)


def test_wait_timeout_exits_124(env: dict[str, str], session_root: Path) -> None:
    slow = stdout_json(run_spawn(["--background", "--task", mock_task("slow", [{"sleep": 60, "text": "never"}])], env))
    proc = run_spawn(["wait", slow["id"], "--timeout", "1"], env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT
    assert stdout_json(proc)["pending"] == [slow["id"]]
    run_spawn(["kill", slow["id"]], env)

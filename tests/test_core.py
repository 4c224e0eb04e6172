"""Unit tests of spawn.py's pure core and on-disk helpers (no CLI, no model)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import spawn


def test_slugify_keeps_whole_words_within_the_limit() -> None:
    assert spawn.slugify("Research AUTH patterns, now!") == "research-auth-patterns-now"
    assert spawn.slugify("a" * 50) == "agent"
    assert spawn.slugify("one two three", max_len=7) == "one-two"
    assert spawn.slugify("!!!") == "agent"


def test_traceparent_round_trip_and_rejects_malformed() -> None:
    trace = spawn.new_trace(None)
    assert spawn.parse_traceparent(trace.traceparent) == (trace.trace_id, trace.span_id)
    child = spawn.new_trace(trace.traceparent)
    assert child.trace_id == trace.trace_id
    assert child.parent_span_id == trace.span_id
    assert child.span_id != trace.span_id
    assert spawn.parse_traceparent("00-" + "0" * 32 + "-" + "1" * 16 + "-01") is None
    assert spawn.parse_traceparent("garbage") is None
    assert spawn.new_trace("garbage").parent_span_id is None


def test_parse_tools_dedupes_and_accepts_mcp_tools() -> None:
    assert spawn.parse_tools("Read, Grep,Read,,mcp__docs__search") == ["Read", "Grep", "mcp__docs__search"]
    assert spawn.parse_tools("") == []
    with pytest.raises(spawn.UnknownToolError, match="Bsh"):
        spawn.parse_tools("Bsh")


def test_model_tiers_default_and_override() -> None:
    tiers = spawn.parse_model_tiers(None)
    assert spawn.resolve_model("high-tier", tiers) == "opus"
    assert spawn.resolve_model("claude-custom-1", tiers) == "claude-custom-1"
    tiers = spawn.parse_model_tiers("medium-tier=claude-x, low-tier=claude-y")
    assert (tiers["medium-tier"], tiers["low-tier"], tiers["high-tier"]) == ("claude-x", "claude-y", "opus")
    with pytest.raises(spawn.UsageError):
        spawn.parse_model_tiers("medium-tier")


def test_narrow_tools_keeps_only_what_the_parent_holds() -> None:
    assert spawn.narrow_tools(["Read", "Bash", "Write"], ["Read", "Bash"]) == (["Read", "Bash"], ["Write"])
    assert spawn.narrow_tools(["Write"], None) == (["Write"], [])


def test_child_deadline_is_capped_by_the_parent_minus_grace() -> None:
    assert spawn.child_deadline(None, None, 100.0) is None
    assert spawn.child_deadline(10, None, 100.0) == 110.0
    assert spawn.child_deadline(None, 200.0, 100.0) == 200.0 - spawn.PARENT_GRACE_S
    assert spawn.child_deadline(1000, 200.0, 100.0) == 200.0 - spawn.PARENT_GRACE_S
    assert spawn.child_deadline(10, 200.0, 100.0) == 110.0


def test_truncate_for_stdout_marks_and_points_to_the_full_output(tmp_path: Path) -> None:
    small = {"a": 1}
    assert spawn.truncate_for_stdout(small, tmp_path) == (small, False)
    big = "é" * spawn.STDOUT_OUTPUT_LIMIT
    out, truncated = spawn.truncate_for_stdout(big, tmp_path / "outcome.json")
    assert truncated
    assert len(out.encode()) < spawn.STDOUT_OUTPUT_LIMIT + 200
    assert str(tmp_path / "outcome.json") in out


def test_validate_output_reports_paths() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    assert spawn.validate_output(schema, {"n": 1}) == []
    assert spawn.validate_output(schema, {"n": "x"}) == ["n: 'x' is not of type 'integer'"]
    assert spawn.validate_output(schema, {}) == ["(root): 'n' is a required property"]


def test_schema_for_cli_drops_only_the_dialect_keys() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "type": "object"}
    assert spawn.schema_for_cli(schema) == {"type": "object"}


def test_every_shipped_schema_is_valid_and_loads_by_name() -> None:
    names = sorted(p.stem for p in spawn.SCHEMA_DIR.glob("*.json"))
    assert {"meta", "outcome", "findings", "summary"} <= set(names)
    for name in names:
        schema, source = spawn.load_schema(name)
        assert source.endswith(f"{name}.json")
        assert schema["$schema"].startswith("https://json-schema.org/draft/2020-12")


def test_redact_removes_secret_values_and_key_patterns() -> None:
    secrets = spawn.secret_values(
        {"ANTHROPIC_API_KEY": "abcdefgh12345", "MY_TOKEN": "tok-zzzzzzzz", "SHORT_KEY": "abc", "PATH": "/usr/bin"}
    )
    assert secrets == ["abcdefgh12345", "tok-zzzzzzzz"]
    text = "key abcdefgh12345 and tok-zzzzzzzz and sk-ant-api03-XYZXYZXYZXYZ and /usr/bin"
    assert spawn.redact(text, secrets) == "key [REDACTED] and [REDACTED] and [REDACTED] and /usr/bin"


def test_inherited_context_takes_the_deeper_of_env_and_ancestry() -> None:
    env = {"SPAWN_DEPTH": "0", "SPAWN_MAX_DEPTH": "9", "SPAWN_AGENT_ID": "a0-fake"}
    ancestry = {"depth": 2, "max_depth": 3, "parent_id": "a2-real", "session": "/s", "tools": {"Read", "Bash"}}
    inh = spawn.inherited_context(env, ancestry)
    assert (inh.depth, inh.max_depth, inh.parent_id, inh.session) == (2, 3, "a2-real", Path("/s"))
    assert inh.tools == ["Bash", "Read"]
    root = spawn.inherited_context({}, {})
    assert (root.depth, root.max_depth, root.parent_id, root.tools) == (-1, None, None, None)
    env_only = spawn.inherited_context({"SPAWN_DEPTH": "1", "SPAWN_TOOLS": "Read", "SPAWN_DEADLINE": "123.5"}, {"deadline": 100.0})
    assert (env_only.depth, env_only.tools, env_only.deadline) == (1, ["Read"], 100.0)


def _outcome(agent_id: str, status: str) -> spawn.Outcome:
    return spawn.Outcome(id=agent_id, status=status, reason="r", exit_code=0, ended_at=spawn.utc_now_iso(), duration_s=0.0)


def test_commit_outcome_first_writer_wins_and_marker_matches(tmp_path: Path) -> None:
    assert spawn.commit_outcome(tmp_path, _outcome("a0-1", "failed"), [])
    assert not spawn.commit_outcome(tmp_path, _outcome("a0-1", "done"), [])
    assert json.loads((tmp_path / "outcome.json").read_text())["status"] == "failed"
    assert (tmp_path / ".fail").exists()
    assert not (tmp_path / ".done").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_commit_outcome_under_contention_has_exactly_one_winner(tmp_path: Path) -> None:
    wins: list[bool] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        wins.append(spawn.commit_outcome(tmp_path, _outcome("a0-1", "done" if i % 2 else "killed"), []))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1
    markers = [m for m in (".done", ".fail") if (tmp_path / m).exists()]
    assert len(markers) == 1


def test_a_crash_between_outcome_and_marker_is_repaired_by_readers(tmp_path: Path) -> None:
    (tmp_path / "outcome.json").write_text(json.dumps({"status": "done"}))
    assert spawn.read_outcome(tmp_path) == {"status": "done"}
    assert (tmp_path / ".done").exists()


def test_a_late_writer_never_marks_an_outcome_it_did_not_commit(tmp_path: Path) -> None:
    """The marker follows the committed outcome: a loser arriving between the winner's
    outcome and its marker (a crash there, or a slow winner) writes the winner's marker."""
    (tmp_path / "outcome.json").write_text(json.dumps(spawn.record_to_json(_outcome("a0-1", "failed"))))
    assert not spawn.commit_outcome(tmp_path, _outcome("a0-1", "done"), [])
    assert (tmp_path / ".fail").exists()
    assert not (tmp_path / ".done").exists()


def test_the_session_lock_waits_for_another_holder(tmp_path: Path) -> None:
    """flock is per open file: another holder (here another fd, as another process's) makes it wait."""
    import fcntl

    with spawn.session_lock(tmp_path):
        pass  # creates the lock file
    holder = os.open(tmp_path / spawn.SESSION_LOCK, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    entered = threading.Event()

    def take() -> None:
        with spawn.session_lock(tmp_path):
            entered.set()

    taker = threading.Thread(target=take)
    taker.start()
    try:
        assert not entered.wait(0.5)  # held elsewhere: still waiting
    finally:
        os.close(holder)  # lets go
    assert entered.wait(10)
    taker.join()


def test_refusal_for_allows_the_max_depth_and_refuses_one_past_it() -> None:
    def refusal(depth: int, max_depth: int, deadline: float | None = None, requested: list[str] | None = None) -> str | None:
        return spawn.refusal_for(depth, max_depth, deadline, 100.0, requested_tools=requested, tools=[] if requested else ["Read"])

    assert refusal(0, 0) is None
    assert refusal(2, 2) is None
    refused = refusal(3, 2)
    assert refused is not None and refused.startswith("depth limit:") and "depth 3" in refused
    assert refusal(1, 0) is not None
    assert refusal(1, 2, deadline=100.0) == "deadline: the parent has no time left for a child"
    assert refusal(1, 2, deadline=100.5) is None
    assert refusal(1, 2, requested=["Bash"]) == "tools: none of Bash is held by the parent"


def test_record_round_trip_drops_unknowns(tmp_path: Path) -> None:
    outcome = _outcome("a0-1", "done")
    data = spawn.record_to_json(outcome)
    assert "cost_usd" not in data  # unknown cost is absent, never 0
    assert spawn.record_from_json(spawn.Outcome, {**data, "future_field": 1}) == outcome


def test_session_root_resolution_order(tmp_path: Path) -> None:
    assert spawn.resolve_session_root(str(tmp_path / "flag"), {"SPAWN_SESSION_ROOT": "/env"}) == tmp_path / "flag"
    assert spawn.resolve_session_root(None, {"SPAWN_SESSION_ROOT": str(tmp_path)}) == tmp_path
    assert spawn.resolve_session_root(None, {}) == spawn.DEFAULT_SESSION_ROOT


def test_session_dirs_never_collide(tmp_path: Path) -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 2, 3, 4)
    first = spawn.create_session_dir(tmp_path, "Same topic", now)
    second = spawn.create_session_dir(tmp_path, "Same topic", now)
    assert first.name == "20260102-0304-same-topic"
    assert second.name == "20260102-0304-same-topic-2"


def test_briefing_tells_the_spawn_command_and_limits() -> None:
    meta = spawn.AgentMeta(
        id="a1-abc", parent_id="a0-x", depth=1, max_depth=3, pid=1, create_time=0, pgid=1, trace_id="0" * 32,
        span_id="1" * 16, traceparent="", task="t", tools=["Bash", "Read"], disallowed_tools=[], model="m",
        cwd="/", started_at="", session="/s", system_prompt="", deadline=None, max_budget_usd=0.5,
    )  # fmt: skip
    text = spawn.briefing(meta, "python spawn.py")
    assert "at depth 1 (max depth 3)" in text
    assert "python spawn.py --task" in text
    assert "wait ID1 ID2 --all" in text
    meta.depth = 3
    assert "cannot start child agents" in spawn.briefing(meta, "x")


def test_agent_facts_follow_the_task_and_stay_out_of_the_shared_briefing() -> None:
    """Its id, deadline, time left and budget differ from its siblings': they go in its first message, after the task."""
    meta = spawn.AgentMeta(
        id="a1-abc", parent_id="a0-x", depth=1, max_depth=3, pid=1, create_time=0, pgid=1, trace_id="0" * 32,
        span_id="1" * 16, traceparent="", task="the task", tools=["Bash", "Read"], disallowed_tools=[], model="m",
        cwd="/", started_at="", session="/s", system_prompt="", deadline=1_000_600.0, max_budget_usd=0.5,
    )  # fmt: skip
    facts = spawn.agent_facts(meta, now=1_000_000.0)
    assert facts.splitlines() == [
        spawn.AGENT_FACTS_HEADER,
        "You are agent a1-abc.",
        "Deadline: 1970-01-12T13:56:40+00:00 (600 s from now); finish before it.",
        "Budget: $0.5000 for you and any children.",
    ]
    briefing = spawn.briefing(meta, "python spawn.py")
    assert "a1-abc" not in briefing and "Deadline" not in briefing and "$0.5000" not in briefing
    sibling = dataclasses.replace(meta, id="a1-def", deadline=1_000_500.0, max_budget_usd=0.25)
    assert spawn.briefing(sibling, "python spawn.py") == briefing
    assert spawn.first_message(meta, now=1_000_000.0) == f"the task\n\n{facts}"
    meta.initial_prompt = "Read the notes first."
    assert spawn.first_message(meta, now=1_000_000.0).startswith("Read the notes first.\n\nthe task\n\n## spawn.py")
    assert spawn.prompt_layout(meta)["first_message"] == ["initial_prompt", "task", "agent_facts"]


def test_supervised_needs_pid_and_create_time() -> None:
    import psutil

    me = psutil.Process()
    assert spawn.Supervised(os.getpid(), me.create_time()).alive()
    assert not spawn.Supervised(os.getpid(), me.create_time() - 10).alive()
    assert not spawn.Supervised(2**22 + 12345, 0.0).alive()


# ------------------------------------------------------------- wait_gone --
# The stop paths' wait. A process that ended but that nobody has reaped yet
# (a zombie) is ended: an orphan's reaper (init, or a subreaper) may take
# seconds, and the stop paths used to wait out their whole grace for it.


def _until(check: Any, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_wait_gone_counts_a_zombie_as_ended_though_nobody_reaps_it() -> None:
    # The child exits at once; its parent never waits for it, so it stays a zombie.
    script = "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        _until(lambda: child.status() == psutil.STATUS_ZOMBIE)
        assert spawn.wait_gone([child], 60.0) == []
        # Still there, unreaped: psutil.wait_procs would have waited the 60 s out.
        assert psutil.pid_exists(child.pid) and child.status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()
        parent.wait()


def test_wait_gone_reaps_a_child_of_its_own_and_returns_what_still_runs() -> None:
    done = subprocess.Popen(["true"])
    running = subprocess.Popen(["sleep", "120"])
    try:
        ended = psutil.Process(done.pid)
        _until(lambda: ended.status() == psutil.STATUS_ZOMBIE)
        left = spawn.wait_gone([ended, psutil.Process(running.pid)], 0.2)
        assert [p.pid for p in left] == [running.pid]
        assert not psutil.pid_exists(done.pid)  # ours, so reaped
    finally:
        running.kill()
        running.wait()


def test_the_sdk_import_thread_reads_sys_modules_while_another_thread_imports_unit() -> None:
    """import_sdk runs on its own thread beside the runner's imports: its look at
    sys.modules must never fail with "dictionary changed size during iteration"."""
    stop = threading.Event()

    def churn() -> None:  # what an import on another thread does to sys.modules
        while not stop.is_set():
            for i in range(50):
                sys.modules[f"_spawn_test_churn_{i}"] = sys
            for i in range(50):
                sys.modules.pop(f"_spawn_test_churn_{i}", None)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(2000):
            assert "mcp.types" not in spawn.imported_modules("_spawn_test_none")
            assert "sys" not in spawn.imported_modules("_spawn_test_churn_0")
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert spawn.imported_modules("json") == [n for n in sys.modules if n.partition(".")[0] == "json"]

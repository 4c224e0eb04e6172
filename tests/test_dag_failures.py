"""spawn.py dag: what happens to a failed task (retries, --on-fail skip|abort|ask, --fail-fast), against the scripted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SPAWN, agent_dirs, load, metas, mock_task, run_spawn, stdout_json, validate_records

import spawn

# A task that fails on its first run and succeeds on the next: the scripted
# model answers its first request with a 500, and the CLI may not retry it.
FLAKY = [{"error": 500, "times": 1, "text": "out-flaky"}]
# A task that always fails: its answer does not fit the summary schema.
BROKEN = {"schema": "summary"}
BROKEN_STEPS = [{"structured": {"wrong": 1}}]


@pytest.fixture
def no_api_retries(env: dict[str, str]) -> dict[str, str]:
    """env where the CLI gives up on the first API error, so FLAKY's first run fails."""
    return {**env, "CLAUDE_CODE_MAX_RETRIES": "0"}


def write_dag(path: Path, tasks: list[dict[str, Any]], **top: Any) -> str:
    path.write_text(json.dumps({**top, "tasks": tasks}))
    return str(path)


def journal_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(result["journal"]).read_text().splitlines()]


def task_lines(journal: list[dict[str, Any]], task: str, event: str = "task") -> list[dict[str, Any]]:
    return [r for r in journal if r["event"] == event and r.get("task") == task]


def outcomes_by_topic(session_root: Path) -> dict[str, list[str]]:
    """Each task's agents' outcome statuses, oldest first (the runner under 'dag')."""
    found: dict[str, list[tuple[float, str]]] = {}
    for d in agent_dirs(session_root):
        meta = load(d / "meta.json")
        key = "dag" if meta.get("agent") == "dag" else meta["topic"]
        found.setdefault(key, []).append((meta["create_time"], load(d / "outcome.json")["status"]))
    return {k: [s for _, s in sorted(v)] for k, v in found.items()}


# ------------------------------------------------------------- bad input --


@pytest.mark.parametrize(
    ("argv", "tasks", "message"),
    [
        (["--on-fail", "ask"], [{"id": "a", "task": "x"}], "--on-fail ask needs a terminal on stdin"),
        (["--fail-fast", "--on-fail", "skip"], [{"id": "a", "task": "x"}], "--fail-fast and --on-fail skip disagree"),
        (["--retries", "-1"], [{"id": "a", "task": "x"}], "--retries must be a whole number >= 0"),
        ([], [{"id": "a", "task": "x", "retries": "twice"}], "task 'a': 'retries:' must be a whole number >= 0"),
        ([], [{"id": "a", "task": "x", "retries": -2}], "task 'a': 'retries:' must be a whole number >= 0"),
    ],
    ids=["ask-without-terminal", "fail-fast-vs-skip", "negative-retries-flag", "retries-not-a-number", "negative-retries"],
)
def test_bad_failure_options_are_exit_2_and_start_nothing(
    argv: list[str], tasks: list[dict[str, Any]], message: str, base_env: dict[str, str], tmp_path: Path
) -> None:
    path = write_dag(tmp_path / "g.json", tasks)
    proc = subprocess.run(
        [sys.executable, str(SPAWN), "dag", "run", path, *argv],
        env=base_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("spawn: error: ") and message in proc.stderr
    assert proc.stdout == ""
    assert not Path(base_env["SPAWN_SESSION_ROOT"]).exists()


def test_retries_in_defaults_and_the_flag_reach_every_task(base_env: dict[str, str], tmp_path: Path) -> None:
    path = write_dag(tmp_path / "g.json", [{"id": "a", "task": "x"}, {"id": "b", "task": "y", "retries": 0}], defaults={"retries": 2})
    dry = stdout_json(run_spawn(["dag", "run", "--dry-run", path], base_env))
    assert {t["id"]: t["retries"] for t in dry["tasks"]} == {"a": 2, "b": 0}
    path = write_dag(tmp_path / "h.json", [{"id": "a", "task": "x"}, {"id": "b", "task": "y", "retries": 0}])
    dry = stdout_json(run_spawn(["dag", "run", "--dry-run", path, "--retries", "3"], base_env))
    assert {t["id"]: t["retries"] for t in dry["tasks"]} == {"a": 3, "b": 0}  # the file's own value wins


# ------------------------------------------------------------ end to end --


def test_retries_start_a_failed_task_again_and_the_journal_counts_attempts(
    no_api_retries: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    path = write_dag(
        tmp_path / "g.json",
        [
            {"id": "flaky", "task": mock_task("flaky", FLAKY), "retries": 2},
            {"id": "after", "task": mock_task("after", [{"text": "out-after"}]), "blockedBy": ["flaky"]},
            {"id": "broken", "task": mock_task("broken", BROKEN_STEPS), "retries": 1, **BROKEN},
            {"id": "never", "task": "never", "blockedBy": ["broken"]},
        ],
    )
    proc = run_spawn(["dag", "run", path], no_api_retries)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    result = stdout_json(proc)
    tasks = result["tasks"]
    assert {k: v["status"] for k, v in tasks.items()} == {"flaky": "done", "after": "done", "broken": "failed", "never": "skipped"}
    assert tasks["flaky"]["output"] == "out-flaky" and tasks["flaky"]["attempt"] == 2
    assert tasks["never"]["reason"] == "blocked by broken, which failed"  # retries used up: the graph's rule
    journal = journal_of(result)
    # flaky: failed once, retried once (of 2), done on its second run.
    assert [(r["status"], r["attempt"]) for r in task_lines(journal, "flaky")] == [
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("done", 2),
    ]
    assert [(r["choice"], r["by"], r["attempt"]) for r in task_lines(journal, "flaky", "decision")] == [("retry", "retries: 2", 1)]
    # broken: two runs (retries: 1), both failed, then no decision: its dependents are skipped.
    assert [(r["status"], r["attempt"]) for r in task_lines(journal, "broken")] == [
        ("started", 1), ("failed", 1), ("started", 2), ("failed", 2),
    ]  # fmt: skip
    assert [r["choice"] for r in task_lines(journal, "broken", "decision")] == ["retry"]
    ran = outcomes_by_topic(session_root)
    assert ran["flaky"] == ["failed", "done"] and ran["broken"] == ["failed", "failed"] and ran["after"] == ["done"]
    assert "never" not in ran
    validate_records(session_root)


def test_on_fail_skip_starts_dependents_and_resume_runs_the_skipped_task_again(
    no_api_retries: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    path = write_dag(
        tmp_path / "g.json",
        [
            {"id": "flaky", "task": mock_task("flaky", FLAKY)},
            {"id": "after", "task": mock_task("after", [{"text": "out-after"}]), "blockedBy": ["flaky"]},
        ],
    )
    proc = run_spawn(["dag", "run", path, "--on-fail", "skip"], no_api_retries)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr  # a task was not done
    result = stdout_json(proc)
    flaky = result["tasks"]["flaky"]
    assert flaky["status"] == "skipped" and flaky["skipped_by"] == "--on-fail skip"
    assert flaky["reason"].startswith("failed (model API internal error (500)")
    assert result["tasks"]["after"] == {**result["tasks"]["after"], "status": "done", "output": "out-after"}
    (after_meta,) = [m for m in metas(session_root).values() if m["topic"] == "after"]
    assert "## flaky\n(no output: failed (model API" in after_meta["task"]  # the dependent is told, not given null
    journal = journal_of(result)
    assert [(r["choice"], r["by"]) for r in task_lines(journal, "flaky", "decision")] == [("skip", "--on-fail skip")]
    # Resume runs what has no .done: the skipped task again (its second attempt), not its done dependent.
    (session,) = [p for p in session_root.iterdir() if p.is_dir()]
    resumed = run_spawn(["dag", "resume", str(session)], no_api_retries)
    assert resumed.returncode == spawn.ExitCode.OK, resumed.stderr
    tasks = stdout_json(resumed)["tasks"]
    assert (tasks["flaky"]["status"], tasks["flaky"]["output"], tasks["flaky"]["attempt"]) == ("done", "out-flaky", 2)
    assert tasks["after"]["status"] == "done"
    ran = outcomes_by_topic(session_root)
    assert ran["flaky"] == ["failed", "done"] and ran["after"] == ["done"]
    validate_records(session_root)


def _pids_alive(session_root: Path) -> list[int]:
    from conftest import alive

    return alive(load(d / "meta.json")["pid"] for d in agent_dirs(session_root))


def test_fail_fast_ends_running_siblings_records_them_and_exits_1(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    meet = tmp_path / "slow-started"
    wait_for_slow = f"for i in $(seq 1200); do [ -f {meet} ] && exit 0; sleep 0.1; done; exit 1"
    path = write_dag(
        tmp_path / "g.json",
        [
            {"id": "slow", "task": mock_task("slow", [{"bash": f"touch {meet}; sleep 110"}, {"text": "never"}]), "tools": ["Bash"]},
            {"id": "bad", "task": mock_task("bad", [{"bash": wait_for_slow}, *BROKEN_STEPS]), "tools": ["Bash"], **BROKEN},
            {"id": "after-bad", "task": "never", "blockedBy": ["bad"]},
            {"id": "after-slow", "task": "never", "blockedBy": ["slow"]},
        ],
    )
    proc = run_spawn(["dag", "run", path, "--fail-fast"], env, timeout=300)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr  # a failed run, not a killed one
    result = stdout_json(proc)
    tasks = result["tasks"]
    assert {k: v["status"] for k, v in tasks.items()} == {
        "slow": "killed",
        "bad": "failed",
        "after-bad": "skipped",
        "after-slow": "skipped",
    }
    aborted = "aborted by --on-fail abort: bad failed"
    assert tasks["slow"]["aborted_by"] == "bad" and tasks["slow"]["reason"] == aborted
    assert tasks["after-bad"]["reason"] == tasks["after-slow"]["reason"] == aborted
    assert result["status"] == "failed"
    journal = journal_of(result)
    assert [r["choice"] for r in task_lines(journal, "bad", "decision")] == ["abort"]
    assert [r["status"] for r in task_lines(journal, "slow")] == ["started", "killed"]
    ran = outcomes_by_topic(session_root)
    assert ran["slow"] == ["killed"] and ran["bad"] == ["failed"] and ran["dag"] == ["failed"]
    assert _pids_alive(session_root) == []  # the killed sibling's process is gone with the runner
    validate_records(session_root)


# ------------------------------------------------------- at a terminal --


def read_until(stream: Any, marker: str, seen: str = "") -> str:
    """stderr up to and including the next marker; fails if the process ends first."""
    while not seen.endswith(marker):
        char = stream.read(1)
        assert char, f"ended before {marker!r}: {seen}"
        seen += char
    return seen


def test_on_fail_ask_at_a_terminal_retries_then_aborts(
    env: dict[str, str], session_root: Path, tmp_path: Path, terminal: tuple[int, int]
) -> None:
    primary, secondary = terminal
    path = write_dag(tmp_path / "g.json", [{"id": "bad", "task": mock_task("bad", BROKEN_STEPS), **BROKEN}])
    proc = subprocess.Popen(
        [sys.executable, str(SPAWN), "dag", "run", path, "--on-fail", "ask"],
        env=env, stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = read_until(proc.stderr, "(r/s/A) ")
        assert seen.splitlines()[-1].startswith("? bad failed: ") and seen.endswith("Retry, skip or abort? (r/s/A) ")
        os.write(primary, b"r\n")
        read_until(proc.stderr, "(r/s/A) ")
        os.write(primary, b"a\n")
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED
    result = json.loads(out)
    assert result["tasks"]["bad"]["status"] == "failed" and result["tasks"]["bad"]["attempt"] == 2
    journal = journal_of(result)
    assert [(r["choice"], r["by"], r["attempt"]) for r in task_lines(journal, "bad", "decision")] == [
        ("retry", "terminal", 1), ("abort", "terminal", 2),
    ]  # fmt: skip
    assert outcomes_by_topic(session_root)["bad"] == ["failed", "failed"]
    validate_records(session_root)

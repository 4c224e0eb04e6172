"""Workflow questions: build's ask before a refactor of more than 50 lines, and run-all's
questions between phases and after a failure, at a terminal and without one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mock_model
import pytest
from conftest import FAKE_API_KEY, ROOT, agent_dirs, load, validate_records
from test_workflows import EXPLORE, PLAN, answer_asks, check_state

import spawn

OLD_BIG = "".join(f"old_{n} = {n}\n" for n in range(60))
NEW_BIG = "".join(f"new_{n} = {n}\n" for n in range(60))
OLD_SMALL = "".join(f"s_{n} = {n}\n" for n in range(10))
NEW_SMALL = "".join(f"t_{n} = {n}\n" for n in range(10))


def build_steps(proj: Path) -> list[dict[str, Any]]:
    """Build reads both files, rewrites 10 lines of one (no question) and 60 of the other (asked)."""
    big, small = str(proj / "src" / "big.py"), str(proj / "src" / "small.py")
    return [
        {"tool": "Read", "input": {"file_path": small}},
        {"tool": "Read", "input": {"file_path": big}},
        {"tool": "Edit", "input": {"file_path": small, "old_string": OLD_SMALL, "new_string": NEW_SMALL}},
        {"tool": "Edit", "input": {"file_path": big, "old_string": OLD_BIG, "new_string": NEW_BIG}},
        {"structured": {"status": "success", "summary": "refactored", "files_changed": ["src/small.py", "src/big.py"]}},
    ]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / ".claude" / "agents", proj / ".claude" / "agents")
    (proj / "src").mkdir()
    (proj / "src" / "big.py").write_text(OLD_BIG)
    (proj / "src" / "small.py").write_text(OLD_SMALL)
    return proj


def workflow_env(base_env: dict[str, str], tmp_path: Path, project: Path, plan: Any) -> Iterator[dict[str, str]]:
    scenario = {
        "rules": [
            {"match": "Explore the codebase", "steps": [{"structured": EXPLORE}]},
            {"match": "Carry out the plan", "steps": build_steps(project)},
            {"match": "implementation plan", "steps": [{"structured": plan}]},
        ]
    }
    with mock_model.serve(tmp_path, scenario) as served:
        yield {**base_env, "ANTHROPIC_BASE_URL": served.url, "ANTHROPIC_API_KEY": FAKE_API_KEY}


@pytest.fixture
def wf_env(base_env: dict[str, str], tmp_path: Path, project: Path) -> Iterator[dict[str, str]]:
    yield from workflow_env(base_env, tmp_path, project, PLAN)


@pytest.fixture
def failing_plan_env(base_env: dict[str, str], tmp_path: Path, project: Path) -> Iterator[dict[str, str]]:
    yield from workflow_env(base_env, tmp_path, project, {"goal": "no steps"})  # not a plan: the phase fails


def start(argv: list[str], env: dict[str, str], cwd: Path, stdin: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "spawn.py"), *argv],
        env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def converse(proc: subprocess.Popen[str], primary: int, script: list[tuple[str, str]]) -> tuple[list[str], str]:
    """Answer each expected question (its last line, exactly) at the terminal; the questions seen, and stdout."""
    assert proc.stderr is not None
    asked = []
    try:
        for question, reply in script:
            seen = ""
            while not seen.endswith(question[-8:]):
                char = proc.stderr.read(1)
                assert char, f"ended before {question!r}: {seen}"
                seen += char
            asked.append(seen.splitlines()[-1])
            os.write(primary, reply.encode())
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return asked, out


def topics(session_root: Path) -> list[str]:
    return sorted(load(d / "meta.json")["topic"] for d in agent_dirs(session_root))


# ------------------------------------------------------------- pure parts --


def test_changed_lines_and_the_lines_rule(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text(OLD_BIG)
    rules = spawn.RuleSet(ask=[spawn.parse_rule("Write"), spawn.parse_rule("Edit(lines>50)")])

    def verdict(tool: str, tool_input: dict[str, Any]) -> tuple[str, str | None]:
        return spawn.decide(tool, tool_input, rules, ["Edit", "Write", "MultiEdit"], cwd=str(tmp_path), home=str(tmp_path))

    big_edit = {"file_path": "f.py", "old_string": OLD_BIG, "new_string": NEW_BIG}
    assert spawn.changed_lines("Edit", big_edit, str(tmp_path)) == 60
    assert verdict("Edit", big_edit) == ("ask", "Edit(lines>50)")
    one_line = {"file_path": "f.py", "old_string": "old_3 = 3\n", "new_string": "new_3 = 3\n", "replace_all": True}
    assert verdict("Edit", one_line) == ("allow", "Edit is granted")
    # A 60-line old_string whose first 20 lines stay: 40 lines change, no question.
    partly = {
        "file_path": "f.py",
        "old_string": OLD_BIG,
        "new_string": "".join(OLD_BIG.splitlines(True)[:20] + NEW_BIG.splitlines(True)[20:]),
    }
    assert spawn.changed_lines("Edit", partly, str(tmp_path)) == 40 and verdict("Edit", partly)[0] == "allow"
    multi = {"file_path": "f.py", "edits": [{"old_string": OLD_SMALL, "new_string": NEW_SMALL}] * 6}
    assert spawn.changed_lines("MultiEdit", multi, str(tmp_path)) == 60 and verdict("MultiEdit", multi)[0] == "ask"
    # Write over an existing file counts what it changes; a new file is the plain Write question.
    assert verdict("Write", {"file_path": "f.py", "content": NEW_BIG}) == ("ask", "Edit(lines>50)")
    assert verdict("Write", {"file_path": "new.py", "content": NEW_BIG}) == ("ask", "Write")
    assert (
        spawn.ask_question("Edit", str(tmp_path / "f.py"), str(tmp_path), "Edit(lines>50)")
        == "? Refactor f.py (changes lines > 50)? (Y/n) "
    )


# ------------------------------------------------------------ end to end --


def test_refactor_over_50_lines_is_asked_and_a_deny_is_exit_4(wf_env: dict[str, str], project: Path, session_root: Path) -> None:
    state = project / ".spawn-state.json"
    spawn.update_state(state, lambda d: d.update(taskDescription="Refactor", results={"plan": spawn.plan_markdown(PLAN)}))
    proc = start(["build"], wf_env, project, subprocess.DEVNULL)
    answered = answer_asks(proc, session_root, wf_env, "deny")
    _, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.REFUSED, err
    (ask,) = [load(p) for p in session_root.glob("*/asks/q-*.json") if not p.name.endswith(".answer.json")]
    assert answered == [ask["id"]]  # one question: the 10-line edit was not asked about
    assert (ask["tool"], ask["rule"], ask["input"]) == ("Edit", "Edit(lines>50)", str(project / "src" / "big.py"))
    assert "spawn: error: declined: Edit" in err
    assert (project / "src" / "big.py").read_text() == OLD_BIG  # denied: untouched
    assert (project / "src" / "small.py").read_text() == NEW_SMALL  # 10 lines: done without asking
    assert check_state(state)["status"] == "declined"
    validate_records(session_root)


def test_run_all_at_a_terminal_asks_before_each_phase_and_before_the_refactor(
    wf_env: dict[str, str], project: Path, session_root: Path, terminal: tuple[int, int]
) -> None:
    primary, secondary = terminal
    proc = start(["run-all", "Refactor big"], wf_env, project, secondary)
    asked, out = converse(
        proc,
        primary,
        [
            ("? plan done. Go on to build? (Y/n) ", "\n"),  # Enter is yes
            ("? Refactor src/big.py (changes lines > 50)? (Y/n) ", "y\n"),
            ("? build done. Go on to explore? (Y/n) ", "yes\n"),
        ],
    )
    assert asked == [
        "? plan done. Go on to build? (Y/n) ",
        "? Refactor src/big.py (changes lines > 50)? (Y/n) ",
        "? build done. Go on to explore? (Y/n) ",
    ]
    assert proc.returncode == spawn.ExitCode.OK
    assert {k: v["status"] for k, v in json.loads(out)["tasks"].items()} == {"plan": "done", "build": "done", "explore": "done"}
    assert (project / "src" / "big.py").read_text() == NEW_BIG
    data = check_state(project / ".spawn-state.json")
    assert data["status"] == "success" and [h["phase"] for h in data["history"]] == ["plan", "build", "explore"]
    validate_records(session_root)


def test_run_all_at_a_terminal_no_to_going_on_is_exit_4_with_the_plan_saved(
    wf_env: dict[str, str], project: Path, session_root: Path, terminal: tuple[int, int]
) -> None:
    primary, secondary = terminal
    proc = start(["run-all", "Refactor big"], wf_env, project, secondary)
    asked, out = converse(proc, primary, [("? plan done. Go on to build? (Y/n) ", "n\n")])
    assert asked == ["? plan done. Go on to build? (Y/n) "]
    assert proc.returncode == spawn.ExitCode.REFUSED
    tasks = json.loads(out)["tasks"]
    assert tasks["build"] == {"status": "skipped", "reason": "declined at the terminal: not going on to build", "declined_by": "terminal"}
    assert tasks["explore"]["status"] == "skipped" and tasks["explore"]["reason"] == tasks["build"]["reason"]
    assert topics(session_root) == ["plan", "run-all"]  # build never started
    data = check_state(project / ".spawn-state.json")
    assert data["status"] == "declined" and data["results"]["plan"].startswith("# Add x")
    assert (project / "src" / "big.py").read_text() == OLD_BIG
    validate_records(session_root)


def test_run_all_without_a_terminal_asks_nothing_and_stops_at_the_first_failure(
    failing_plan_env: dict[str, str], project: Path, session_root: Path
) -> None:
    proc = start(["run-all", "Refactor big"], failing_plan_env, project, subprocess.DEVNULL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, err
    assert "? " not in err  # nobody to ask: no question, no wait
    result = json.loads(out)
    tasks = result["tasks"]
    assert tasks["plan"]["status"] == "failed"
    assert {tasks[p]["reason"] for p in ("build", "explore")} == {"aborted by --on-fail abort: plan failed"}
    graph = json.loads(Path(result["journal"]).read_text().splitlines()[0])
    assert (graph["on_fail"], graph["fail_fast"]) == ("abort", True)
    data = check_state(project / ".spawn-state.json")
    assert data["status"] == "error" and [e["phase"] for e in data["errors"]] == ["plan"]
    assert topics(session_root) == ["plan", "run-all"]
    validate_records(session_root)


def test_run_all_at_a_terminal_asks_what_to_do_with_a_failed_phase(
    failing_plan_env: dict[str, str], project: Path, session_root: Path, terminal: tuple[int, int]
) -> None:
    primary, secondary = terminal
    proc = start(["run-all", "Refactor big", "--retries", "1"], failing_plan_env, project, secondary)
    asked, out = converse(proc, primary, [("Retry, skip or abort? (r/s/A) ", "a\n")])
    assert asked[0].startswith("? plan failed: ") and asked[0].endswith("Retry, skip or abort? (r/s/A) ")
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED
    assert json.loads(out)["tasks"]["plan"]["attempt"] == 2  # --retries 1 first, then the question
    data = check_state(project / ".spawn-state.json")
    assert data["status"] == "error" and data["history"][0] == {**data["history"][0], "phase": "plan", "attempt": 2}
    assert topics(session_root) == ["plan", "plan", "run-all"]
    validate_records(session_root)


@pytest.mark.parametrize("argv", [["--on-fail", "ask"], ["--retries", "-1"]], ids=["ask-without-terminal", "negative-retries"])
def test_bad_failure_options_of_a_phase_verb_are_exit_2_and_write_nothing(
    argv: list[str], base_env: dict[str, str], project: Path, session_root: Path
) -> None:
    proc = start(["run-all", "Refactor big", *argv], base_env, project, subprocess.DEVNULL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == spawn.ExitCode.USAGE, err
    assert err.startswith("spawn: error: ") and ("--on-fail ask needs a terminal" in err or "--retries must be" in err)
    assert not (project / ".spawn-state.json").exists() and not session_root.exists()

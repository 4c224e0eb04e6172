"""plan / build / explore over a shared state file, against the scripted model."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import mock_model
import pytest
from conftest import FAKE_API_KEY, ROOT, load, run_spawn, stdout_json, validate_records

import spawn

PLAN = {"goal": "Add x", "steps": [{"title": "make x", "files": ["src/x.py"], "detail": "write it"}]}
BUILD = [
    {"tool": "Write", "input": {"file_path": "src/x.py", "content": "x = 1\n"}},
    {"structured": {"status": "success", "summary": "built", "files_changed": ["src/x.py"]}},
]
EXPLORE = {"summary": "fine", "findings": [{"claim": "x exists"}], "open_questions": ["test x?"]}


def scenario(plan: Any = PLAN) -> dict[str, Any]:
    return {
        "rules": [
            {"match": "Explore the codebase", "steps": [{"structured": EXPLORE}]},
            {"match": "Carry out the plan", "steps": BUILD},
            {"match": "implementation plan", "steps": [{"structured": plan}]},
        ]
    }


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with the shipped agent definitions; the agents work in it."""
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / ".claude" / "agents", proj / ".claude" / "agents")
    (proj / "src").mkdir()
    return proj


@pytest.fixture
def wf_env(base_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    with mock_model.serve(tmp_path, scenario(getattr(request, "param", PLAN))) as served:
        yield {**base_env, "ANTHROPIC_BASE_URL": served.url, "ANTHROPIC_API_KEY": FAKE_API_KEY}


def answer_asks(proc: subprocess.Popen[str], session_root: Path, env: dict[str, str], verb: str) -> list[str]:
    """Answer every ask until proc ends; the ids answered."""
    answered: list[str] = []
    while proc.poll() is None:
        for ask in session_root.glob("*/asks/q-*.json"):
            if not ask.name.endswith(".answer.json") and ask.stem not in answered:
                assert run_spawn([verb, ask.stem], env).returncode == spawn.ExitCode.OK
                answered.append(ask.stem)
        time.sleep(0.1)
    return answered


def check_state(path: Path) -> dict[str, Any]:
    data = load(path)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "state.json").read_text())).validate(data)
    return data


def test_run_all_accumulates_every_phase_and_build_asks_before_creating(wf_env: dict[str, str], project: Path, session_root: Path) -> None:
    state = project / ".spawn-state.json"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "spawn.py"), "run-all", "Add x", "--verbose"],
        env=wf_env, cwd=project, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    answered = answer_asks(proc, session_root, wf_env, "approve")
    out, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert len(answered) == 1  # the one Write: a file creation is asked about
    assert json.loads(out)["status"] == "done"
    data = check_state(state)
    assert data["status"] == "success" and data["phase"] == "explore" and data["taskDescription"] == "Add x"
    assert data["metadata"]["agentName"] == "run-all" and data["metadata"]["spawnVersion"] == spawn.__version__
    assert "1. make x (src/x.py)" in data["results"]["plan"]
    assert data["results"]["build"] == {"filesCreated": ["src/x.py"], "filesModified": []}
    assert data["results"]["exploration"] == {"findings": [{"claim": "x exists"}], "recommendations": ["test x?"]}
    assert [h["phase"] for h in data["history"]] == ["plan", "build", "explore"]
    assert (project / "src" / "x.py").read_text() == "x = 1\n"
    validate_records(session_root)
    # build --dry-run previews the plan's steps and files and writes nothing.
    before = state.read_bytes()
    dry = run_spawn(["build", "--dry-run"], wf_env, cwd=project)
    assert dry.returncode == spawn.ExitCode.OK
    assert stdout_json(dry) == {"dry_run": True, "steps": ["1. make x (src/x.py)"], "files": ["src/x.py"]}
    assert state.read_bytes() == before
    shown = run_spawn(["state", "show"], wf_env, cwd=project)
    assert stdout_json(shown) == data
    cleared = run_spawn(["state", "clear"], wf_env, cwd=project)
    assert cleared.returncode == spawn.ExitCode.OK and not state.exists()


@pytest.mark.parametrize("wf_env", [{"goal": "no steps"}], indirect=True)
def test_build_does_not_start_when_plan_failed(wf_env: dict[str, str], project: Path, session_root: Path) -> None:
    proc = run_spawn(["run-plan-build", "Add x"], wf_env, cwd=project)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    tasks = stdout_json(proc)["tasks"]
    assert tasks["plan"]["status"] == "failed" and tasks["build"]["status"] == "skipped"
    data = check_state(project / ".spawn-state.json")
    assert data["status"] == "error" and data["errors"][0]["phase"] == "plan"
    assert not (project / "src" / "x.py").exists()


def test_declined_ask_ends_build_with_exit_4_and_saves_state(wf_env: dict[str, str], project: Path, session_root: Path) -> None:
    state = project / ".spawn-state.json"
    spawn.update_state(state, lambda d: d.update(taskDescription="Add x", results={"plan": spawn.plan_markdown(PLAN)}))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "spawn.py"), "build", "--state-file", str(state)],
        env=wf_env, cwd=project, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert len(answer_asks(proc, session_root, wf_env, "deny")) == 1
    _, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.REFUSED, err
    assert "spawn: error: declined: Write" in err
    data = check_state(state)
    assert data["status"] == "declined" and data["results"]["plan"].startswith("# Add x")
    assert not (project / "src" / "x.py").exists()


def test_corrupt_state_file_is_exit_3_and_left_alone(base_env: dict[str, str], tmp_path: Path, session_root: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    for argv in (["plan", "x"], ["state", "show"], ["explore"]):
        proc = run_spawn([*argv, "--state-file", str(state)], base_env)
        assert proc.returncode == spawn.ExitCode.STATE
        assert proc.stderr.startswith("spawn: error: ") and str(state) in proc.stderr
    assert state.read_text() == "{not json"
    assert not session_root.exists()  # nothing started
    with pytest.raises(spawn.StateError):
        spawn.update_state(state, lambda d: d.update(x=1))
    assert state.read_text() == "{not json"


def test_symlinked_state_file_is_refused_and_its_target_untouched(wf_env: dict[str, str], project: Path, tmp_path: Path) -> None:
    """Issue 31 item 13: a planted .spawn-state.json link was followed, so `plan` rewrote, `state show`
    printed and `state clear` deleted a file outside the project."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious.json"
    target.write_text('{"mine": true}\n')
    (project / ".spawn-state.json").symlink_to(target)
    for argv in (["plan", "Add x"], ["state", "show"], ["state", "clear"]):
        proc = run_spawn(argv, wf_env, cwd=project)
        assert proc.returncode == spawn.ExitCode.STATE, (argv, proc.stderr)
        assert proc.stderr.startswith("spawn: error: ") and "symbolic link" in proc.stderr, proc.stderr
        assert proc.stdout == ""
    assert target.read_text() == '{"mine": true}\n'
    assert sorted(p.name for p in outside.iterdir()) == ["precious.json"]  # no lock, no rotation, no temp file
    assert (project / ".spawn-state.json").is_symlink()


def _append_history(d: dict[str, Any], entry: dict[str, Any]) -> None:
    d.setdefault("history", []).append(entry)


def _writer(path: str, n: int, who: int) -> None:
    for i in range(n):
        entry = {"phase": f"w{who}", "status": str(i), "time": "t"}
        spawn.update_state(Path(path), functools.partial(_append_history, entry=entry))


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), 40, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    history = load(path)["history"]
    assert len(history) == 160
    assert {w: sum(h["phase"] == f"w{w}" for h in history) for w in range(4)} == {0: 40, 1: 40, 2: 40, 3: 40}


def test_rotation_keeps_every_old_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for i in range(4):
        spawn.update_state(path, functools.partial(_append_history, entry={"n": i, "pad": "x" * 1200}), rotate_mb=0.001)
    # Each write past 1 kB moves the file to .1 (older ones shift to .2, ...), nothing is lost.
    assert (tmp_path / "state.json.1").exists() and (tmp_path / "state.json.2").exists()
    kept = [load(p)["history"][-1]["n"] for p in sorted(tmp_path.glob("state.json.[0-9]*"), reverse=True)]
    assert kept == sorted(kept) and load(path)["history"][-1]["n"] == 3
    assert not list(tmp_path.glob(".state.json.*.tmp"))


def test_build_asks_at_the_terminal_and_no_is_exit_4(wf_env: dict[str, str], project: Path, session_root: Path) -> None:
    import pty

    state = project / ".spawn-state.json"
    spawn.update_state(state, lambda d: d.update(taskDescription="Add x", results={"plan": spawn.plan_markdown(PLAN)}))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "spawn.py"), "build"],
        env=wf_env, cwd=project, stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(secondary)
    try:
        assert proc.stderr is not None
        seen = ""
        while "(Y/n)" not in seen:
            char = proc.stderr.read(1)
            assert char, f"no question before exit: {seen}"
            seen += char
        assert seen.splitlines()[-1] == "? Create file src/x.py? (Y/n)"
        os.write(primary, b"n\n")
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == spawn.ExitCode.REFUSED
    assert json.loads(out)["tasks"]["build"]["status"] == "done"  # the agent went on without the file
    assert load(state)["status"] == "declined" and not (project / "src" / "x.py").exists()

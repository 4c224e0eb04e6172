"""Without a cgroup, the root's guard is the subreaper above its runner, so
nothing a tree started survives a SIGKILL of the root (issue 15 §3, the
fallback). Every test runs with SPAWN_NO_CGROUP=1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import SPAWN, load, metas, mock_task, run_spawn, spawn_in_bash, start_spawn, stdout_json, validate_records, wait_until
from test_containment import MARK, escape_script, marked

import spawn

pytestmark = pytest.mark.skipif(not spawn.guard_above_possible(), reason="the guard above the runner needs Linux")

# Fields of a run's stdout that do not depend on where or when it ran.
STABLE = ("status", "exit_code", "reason", "output")


@pytest.fixture
def no_cgroup(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SPAWN_NO_CGROUP": "1"}


def root_meta(session_root: Path, task_word: str) -> dict[str, object]:
    (meta,) = [m for m in metas(session_root).values() if task_word in str(m["task"]) and m.get("parent_id") is None]
    return meta


def agent_dir_of(meta: dict[str, object]) -> Path:
    return Path(str(meta["session"])) / "agents" / str(meta["id"])


def start_escaping_root(env: dict[str, str], tmp_path: Path) -> tuple[str, subprocess.Popen[str]]:
    """A root whose Bash left the tree by `setsid -f env -i`, a sleep and a spawn.py, all running."""
    mark = uuid.uuid4().hex
    root = mock_task("escape", [{"bash": escape_script(env, mark, tmp_path)}, {"sleep": 300, "text": "never"}])
    proc = start_spawn(["--task", root, "--tools", "Bash"], env)
    # sleep, the escaped spawn.py and its CLI all run before the kill.
    assert wait_until(lambda: len(marked(mark)) >= 3, 90), (tmp_path / "escaped.log").read_text()
    return mark, proc


def survivors_after(mark: str, proc: subprocess.Popen[str]) -> int:
    """How many of the test's processes outlive the root, given a generous bound to end."""
    try:
        proc.communicate(timeout=60)
        wait_until(lambda: not marked(mark), 10)
        return len(marked(mark))
    finally:
        for leftover in marked(mark):  # only this test's own processes, by pid
            leftover.kill()
        if proc.poll() is None:
            proc.kill()


def test_sigkilled_runner_leaves_no_escaped_process(no_cgroup: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """The runner meta.json records is SIGKILLed: its orphans land on the guard, which ends them."""
    mark, proc = start_escaping_root(no_cgroup, tmp_path)
    meta = root_meta(session_root, "escape")
    assert meta["containment"] == "guard"
    runner = psutil.Process(int(str(meta["pid"])))
    assert runner.ppid() == proc.pid  # the pid the user started is the guard above the runner
    runner.kill()
    assert survivors_after(mark, proc) == 0
    assert proc.returncode == -signal.SIGKILL  # the caller sees the runner's death, as without a guard
    outcome = load(agent_dir_of(meta) / "outcome.json")
    # The guard settles it, unless the escaped spawn.py, registering meanwhile, found
    # its parent dead first (every spawn settles the agents of its session that died
    # unseen): seen once in CI under a load of 40.
    assert outcome["status"] == "failed" and outcome["committed_by"] in ("guard", "spawn")
    children = [m for m in metas(session_root).values() if m.get("parent_id") == meta["id"]]
    assert children, "the escaped spawn.py registered in the tree"
    assert all((agent_dir_of(m) / "outcome.json").exists() for m in children)
    validate_records(session_root)


def test_sigkilled_root_pid_leaves_no_escaped_process(no_cgroup: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """The pid the user started is SIGKILLed: the runner below it ends the tree as on SIGTERM."""
    mark, proc = start_escaping_root(no_cgroup, tmp_path)
    meta = root_meta(session_root, "escape")
    os.kill(proc.pid, signal.SIGKILL)
    assert survivors_after(mark, proc) == 0
    wait_until((agent_dir_of(meta) / "outcome.json").exists, 30)
    assert load(agent_dir_of(meta) / "outcome.json")["status"] == "killed"
    validate_records(session_root)


def test_sigterm_to_the_root_pid_reaches_the_runner(no_cgroup: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """`kill PID` on the pid the user started gives the killed outcome and exit code, as before."""
    mark, proc = start_escaping_root(no_cgroup, tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    assert survivors_after(mark, proc) == 0
    assert proc.returncode == spawn.ExitCode.KILLED
    meta = root_meta(session_root, "escape")
    assert load(agent_dir_of(meta) / "outcome.json")["status"] == "killed"


def test_sigint_to_the_root_pid_interrupts_it(no_cgroup: dict[str, str], session_root: Path) -> None:
    proc = start_spawn(["--task", mock_task("stall", [{"sleep": 300, "text": "never"}]), "--tools", ""], no_cgroup)
    try:
        assert wait_until(lambda: any(p.is_file() for p in session_root.glob("*/agents/*/heartbeat.json")), 90)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == spawn.ExitCode.INTERRUPTED, err
    (line,) = [line for line in out.splitlines() if line.strip()]
    assert json.loads(line)["status"] == "interrupted"


def test_ctrl_c_in_a_terminal_interrupts_the_root(no_cgroup: dict[str, str], session_root: Path) -> None:
    """Ctrl-C still interrupts the root: the terminal signals its whole group, the guard and the runner."""
    master, slave = os.openpty()
    task = mock_task("stall", [{"sleep": 300, "text": "never"}])
    # `setsid -c`: a session of its own, whose controlling terminal is stdin, the pty.
    proc = subprocess.Popen(
        ["setsid", "-c", sys.executable, str(spawn.SCRIPT_PATH), "--task", task, "--tools", ""],
        env=no_cgroup,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        assert wait_until(lambda: any(p.is_file() for p in session_root.glob("*/agents/*/heartbeat.json")), 90)
        os.write(master, b"\x03")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == spawn.ExitCode.INTERRUPTED, err
    (line,) = [line for line in out.splitlines() if line.strip()]
    assert json.loads(line)["status"] == "interrupted"
    assert root_meta(session_root, "stall")["containment"] == "guard"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(([{"text": "done"}], "done", spawn.ExitCode.OK), id="done"),
        pytest.param(([{"error": 400}], "failed", spawn.ExitCode.AGENT_FAILED), id="failed"),
        pytest.param(
            ([{"bash": spawn_in_bash("--task", mock_task("child", [{"text": "hi"}]), "--tools", "")}, {"text": "done"}], "done", 0),
            id="child",
        ),
    ],
)
def test_a_run_under_the_guard_looks_as_it_did(
    env: dict[str, str], no_cgroup: dict[str, str], session_root: Path, case: tuple[list[dict[str, object]], str, int]
) -> None:
    """Exit code, stdout, stderr and outcome of a root are the same below the guard as in a cgroup.

    (Where no cgroup is writable, both runs are below a guard: the figures are still checked.)
    """
    steps, status, exit_code = case
    task = mock_task("same", steps)
    usual = run_spawn(["--task", task, "--tools", ""], env)
    guarded = run_spawn(["--task", task, "--tools", ""], no_cgroup)
    assert guarded.returncode == usual.returncode == exit_code, guarded.stderr
    first, second = stdout_json(usual), stdout_json(guarded)
    assert {k: second.get(k) for k in STABLE} == {k: first.get(k) for k in STABLE}
    assert set(second) == set(first) and second["status"] == status
    assert len(guarded.stderr.splitlines()) == len(usual.stderr.splitlines()), guarded.stderr
    assert load(Path(str(second["outcome"])))["status"] == status
    meta = load(Path(str(second["agent_dir"])) / "meta.json")
    assert meta["containment"] == "guard"
    assert in_session(str(meta["session"])) == [], "the guard returned with the tree's processes still running"
    validate_records(session_root)


def in_session(session: str) -> list[psutil.Process]:
    """Processes started for the session's agents (a child's spawn.py, CLI and guard carry it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SPAWN_SESSION") == session and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_the_guard_above_is_small_and_goes_with_its_runner(no_cgroup: dict[str, str], session_root: Path) -> None:
    proc = start_spawn(["--task", mock_task("small", [{"sleep": 300, "text": "never"}]), "--tools", ""], no_cgroup)
    try:
        assert wait_until(lambda: any(p.is_file() for p in session_root.glob("*/agents/*/heartbeat.json")), 90)
        meta = root_meta(session_root, "small")
        guard = psutil.Process(proc.pid)
        assert guard.children() == [psutil.Process(int(str(meta["pid"])))]
        assert "-c" in guard.cmdline()  # a bare interpreter, not spawn.py with its imports
        print(f"guard above: rss {guard.memory_info().rss / 2**20:.1f} MiB")
        assert spawn.ancestor_agents() == []
        run = run_spawn(["kill", str(meta["id"]), "--session", str(meta["session"])], no_cgroup)
        assert run.returncode == spawn.ExitCode.OK, run.stderr
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == spawn.ExitCode.KILLED
    index = spawn.runner_index_dir()
    assert not list(index.glob(f"{proc.pid}-*.json")), "the guard removed its runner index entry"


def test_dry_run_says_guard_for_a_root_and_subreaper_in_the_background(no_cgroup: dict[str, str]) -> None:
    assert stdout_json(run_spawn(["--dry-run", "--task", "hi"], no_cgroup))["containment"] == "guard"
    assert stdout_json(run_spawn(["--dry-run", "--background", "--task", "hi"], no_cgroup))["containment"] == "subreaper"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")
def test_exit_as_dies_by_the_runners_signal() -> None:
    code = "import spawn, sys; sys.exit(spawn.exit_as(int(sys.argv[1])))"
    env = {**os.environ, "PYTHONPATH": str(SPAWN.parent)}
    for status, expected in ((0, 0), (143, 143), (-signal.SIGTERM, -signal.SIGTERM), (-signal.SIGKILL, -signal.SIGKILL)):
        assert subprocess.run([sys.executable, "-c", code, str(status)], env=env, check=False).returncode == expected
    assert subprocess.run([sys.executable, "-c", code, str(-signal.SIGSEGV)], env=env, check=False).returncode == 128 + signal.SIGSEGV


def test_a_settled_runner_leaves_nothing_below_its_guard(tmp_path: Path) -> None:
    """A runner that committed its outcome and exits: what it left is ended and the exit status passed on."""
    mark = uuid.uuid4().hex
    runner = f"""
import os, subprocess, sys, pathlib
import spawn
agent_dir = pathlib.Path(sys.argv[1])
spawn.fork_below_guard()
(guard, pipe), = spawn.GUARDS_ABOVE
os.write(pipe, f"{{agent_dir}}\\n\\n".encode())
(agent_dir / "outcome.json").write_text("{{}}")
subprocess.run(["setsid", "-f", "sleep", "1003"], env={{**os.environ, "{MARK}": "{mark}"}}, check=True)
os._exit(7)
"""
    env = {**os.environ, "PYTHONPATH": str(SPAWN.parent)}
    proc = subprocess.run([sys.executable, "-c", runner, str(tmp_path)], env=env, timeout=60, check=False)
    try:
        assert proc.returncode == 7
        assert marked(mark) == []  # gone when the guard returned, not later
    finally:
        for leftover in marked(mark):
            leftover.kill()


def test_a_sigkill_of_guard_and_runner_together_still_settles_the_root(no_cgroup: dict[str, str], session_root: Path) -> None:
    """Their whole process group SIGKILLed: the agent's other guard, in a session of its own, settles it as before."""
    task = mock_task("group", [{"bash": "python3 -c 'import time; time.sleep(60)'"}, {"text": "never"}])
    proc = subprocess.Popen(
        [sys.executable, str(spawn.SCRIPT_PATH), "--task", task, "--tools", "Bash"],
        env=no_cgroup,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, to kill whole
    )
    try:
        assert wait_until(lambda: any("time.sleep" in p.read_text() for p in session_root.glob("*/agents/*/transcript.jsonl")), 90)
        meta = root_meta(session_root, "group")
        beat = load(agent_dir_of(meta) / "heartbeat.json")
        cli = psutil.Process(int(str(beat["cli_pid"])))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        assert wait_until((agent_dir_of(meta) / "outcome.json").exists, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    outcome = load(agent_dir_of(meta) / "outcome.json")
    assert outcome["status"] == "failed" and outcome["committed_by"] == "guard"
    assert wait_until(lambda: not cli.is_running(), 30), "the root's CLI outlived its tree"
    validate_records(session_root)

"""`wait` is event-driven (inotify, pidfd) with a polling fallback: what it returns, not how fast.

The agents here are records written with spawn.py's own helpers; their
process is a real `sleep` the test starts and kills, so liveness, reaping
and the kernel's events are real. Timing is left to `nox -s bench` (P3, P7):
these tests only bound hangs, generously.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import patch_name, run_spawn, start_spawn, stdout_json

import spawn

# Past spawn.WAIT_POLL_BATCH, wait watches with inotify; below, it polls.
MANY = spawn.WAIT_POLL_BATCH + 10
HANG_S = 60  # only a hang fails: a wait that works returns long before


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process that stands in for live agents' spawn.py; killed at the end whatever happened."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def make_agents(session_root: Path, count: int, pid: int, *, dying: int | None = None) -> tuple[Path, list[Path]]:
    """A session with `count` running agents (no outcome) whose process is pid; with dying, one more whose process is that."""
    session = session_root / "20260101-0000-wait"
    (session / spawn.AGENTS_DIR).mkdir(parents=True)
    dirs = []
    for i, agent_pid in enumerate([pid] * count + ([dying] if dying is not None else [])):
        create_time = psutil.Process(agent_pid).create_time()
        d = session / spawn.AGENTS_DIR / (f"a1-{i:06x}" if i < count else "a1-dead00")
        d.mkdir()
        meta = spawn.AgentMeta(
            id=d.name,
            parent_id=None,
            depth=1,
            max_depth=3,
            pid=agent_pid,
            create_time=create_time,
            pgid=agent_pid,
            trace_id="1" * 32,
            span_id="2" * 16,
            traceparent=f"00-{'1' * 32}-{'2' * 16}-01",
            task="t",
            tools=["Read"],
            disallowed_tools=[],
            model="sonnet",
            cwd="/",
            started_at=spawn.utc_now_iso(),
            session=str(session),
            system_prompt="",
            background=True,
            pid_namespace=spawn.own_pid_namespace(),
        )
        spawn.write_meta(d, meta, [])
        dirs.append(d)
    return session, dirs


def done(agent_dir: Path) -> spawn.Outcome:
    return spawn.Outcome(id=agent_dir.name, status="done", reason="", exit_code=0, ended_at=spawn.utc_now_iso(), duration_s=1.0, text="ok")


def blocked(pid: int) -> None:
    """Until `pid` sleeps in the kernel (epoll/poll, or nanosleep): wait is then in its loop."""
    wchan = Path(f"/proc/{pid}/wchan")
    limit = time.monotonic() + HANG_S
    while not any(word in wchan.read_text() for word in ("poll", "nanosleep")):
        assert time.monotonic() < limit, f"process {pid} never reached its waiting loop"
        time.sleep(0.05)


def start_wait(session: Path, dirs: list[Path], env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    waiter = start_spawn(["wait", "--session", str(session), *extra, *(d.name for d in dirs)], env)
    blocked(waiter.pid)
    return waiter


def finish(waiter: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = waiter.communicate(timeout=HANG_S)
    return waiter.returncode, json.loads(out), err


@pytest.mark.parametrize("count", [1, MANY], ids=["polled", "watched"])
def test_wait_returns_when_outcomes_are_committed(
    count: int, base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]
) -> None:
    session, dirs = make_agents(session_root, count, live_process.pid)
    waiter = start_wait(session, dirs, base_env, "--all")
    for d in dirs:
        spawn.commit_outcome(d, done(d), [])  # link() into place, then the marker
    code, result, err = finish(waiter)
    assert code == spawn.ExitCode.OK, err
    assert result["status"] == "done"
    assert sorted(a["id"] for a in result["agents"]) == [d.name for d in dirs]


@pytest.mark.parametrize("count", [1, MANY], ids=["polled", "watched"])
def test_wait_sees_an_outcome_renamed_into_place(
    count: int, base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]
) -> None:
    session, dirs = make_agents(session_root, count, live_process.pid)
    waiter = start_wait(session, dirs[-1:], base_env)
    target = dirs[-1]
    data = json.dumps(spawn.record_to_json(done(target))).encode()
    for name, body in ((spawn.OUTCOME, data), (spawn.DONE_MARKER, b"done\n")):
        tmp = target / f".{name}.tmp"
        tmp.write_bytes(body)
        os.replace(tmp, target / name)
    code, result, err = finish(waiter)
    assert code == spawn.ExitCode.OK, err
    assert [a["id"] for a in result["agents"]] == [target.name]


@pytest.mark.parametrize("count", [1, MANY], ids=["polled", "watched"])
def test_wait_reaps_an_agent_that_dies_without_an_outcome(
    count: int, base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]
) -> None:
    dying = subprocess.Popen(["sleep", "600"])
    try:
        session, dirs = make_agents(session_root, count, live_process.pid, dying=dying.pid)
        victim = dirs[-1]
        waiter = start_wait(session, dirs, base_env, "--any")
        dying.kill()
        code, result, err = finish(waiter)
    finally:
        dying.kill()
        dying.wait()
    assert code == spawn.ExitCode.AGENT_FAILED, err
    (agent,) = result["agents"]
    assert agent["id"] == "a1-dead00"
    assert agent["status"] == "failed"
    assert "died without writing an outcome" in agent["reason"]
    assert (victim / spawn.FAIL_MARKER).exists()


def test_wait_times_out_with_its_exit_code(base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]) -> None:
    session, dirs = make_agents(session_root, MANY, live_process.pid)
    proc = run_spawn(["wait", "--session", str(session), "--all", "--timeout", "1", *(d.name for d in dirs)], base_env, timeout=HANG_S)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    result = stdout_json(proc)
    assert result["status"] == "timeout"
    assert result["pending"] == [d.name for d in dirs]
    assert "wait timed out" in proc.stderr


def test_wait_over_many_ids_some_done_already(base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]) -> None:
    session, dirs = make_agents(session_root, MANY, live_process.pid)
    for d in dirs[::2]:
        spawn.commit_outcome(d, done(d), [])
    waiter = start_wait(session, dirs, base_env, "--all")
    for d in dirs[1::2]:
        spawn.commit_outcome(d, done(d), [])
    code, result, err = finish(waiter)
    assert code == spawn.ExitCode.OK, err
    assert len(result["agents"]) == MANY
    assert result["pending"] == []


def test_a_corrupt_outcome_ends_wait_with_one_error_line(
    base_env: dict[str, str], session_root: Path, live_process: subprocess.Popen[bytes]
) -> None:
    session, dirs = make_agents(session_root, MANY, live_process.pid)
    waiter = start_wait(session, dirs, base_env, "--all")
    (dirs[3] / spawn.OUTCOME).write_text("{ torn")
    (dirs[3] / spawn.DONE_MARKER).write_text("done\n")
    out, err = waiter.communicate(timeout=HANG_S)
    assert waiter.returncode == spawn.ExitCode.STATE
    assert out == ""
    assert err.strip().splitlines() == [err.strip()] and err.startswith("spawn: error: corrupt record")


# ------------------------------------------------------- without the kernel's help --


@pytest.fixture
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a system without inotify or pidfd: every outcome and process is polled."""
    monkeypatch.setattr(spawn.MarkerEvents, "watch", lambda self, agent_dir: False)
    patch_name(monkeypatch, "exit_fd", lambda meta: None)


def wait_in_thread(dirs: list[Path], mode: str, timeout: float | None) -> tuple[threading.Thread, list[spawn.WaitResult]]:
    results: list[spawn.WaitResult] = []
    thread = threading.Thread(target=lambda: results.append(spawn.wait_for_outcomes(dirs, mode, timeout, [], polls=False)), daemon=True)
    thread.start()
    return thread, results


@pytest.mark.usefixtures("no_events")
def test_polling_fallback_sees_outcomes(session_root: Path, live_process: subprocess.Popen[bytes]) -> None:
    _, dirs = make_agents(session_root, MANY, live_process.pid)
    thread, results = wait_in_thread(dirs, "all", HANG_S)
    for d in dirs:
        spawn.commit_outcome(d, done(d), [])
    thread.join(HANG_S)
    (result,) = results
    assert result.finished
    assert sorted(result.outcomes) == sorted(dirs)


@pytest.mark.usefixtures("no_events")
def test_polling_fallback_reaps_a_dead_agent(session_root: Path) -> None:
    dying = subprocess.Popen(["sleep", "600"])
    try:
        _, dirs = make_agents(session_root, 3, dying.pid)
        thread, results = wait_in_thread(dirs, "all", HANG_S)
        dying.kill()
        dying.wait()
        thread.join(HANG_S)
    finally:
        dying.kill()
        dying.wait()
    (result,) = results
    assert result.finished
    assert {o["status"] for o in result.outcomes.values()} == {"failed"}


@pytest.mark.usefixtures("no_events")
def test_polling_fallback_times_out(session_root: Path, live_process: subprocess.Popen[bytes]) -> None:
    _, dirs = make_agents(session_root, 2, live_process.pid)
    result = spawn.wait_for_outcomes(dirs, "all", 0.3, [], polls=False)
    assert not result.finished
    assert result.outcomes == {}


@pytest.mark.parametrize("count", [1, MANY], ids=["polled", "watched"])
def test_stale_heartbeats_are_reported_not_waited_for(count: int, session_root: Path, live_process: subprocess.Popen[bytes]) -> None:
    _, dirs = make_agents(session_root, count, live_process.pid)
    beat = spawn.Heartbeat(cli_pid=live_process.pid, cli_create_time=0.0, cli_pgid=live_process.pid, updated_at=time.time(), interval_s=0.1)
    for d in dirs:
        spawn.write_json_atomic(d / spawn.HEARTBEAT, spawn.record_to_json(beat))
    # Fresh beats that stop: stale only once 6 intervals have passed, found without a busy poll.
    thread, results = wait_in_thread(dirs, "all", HANG_S)
    thread.join(HANG_S)
    (result,) = results
    assert result.finished
    assert sorted(result.stale) == sorted(dirs)
    assert result.outcomes == {}
    assert live_process.poll() is None  # a stuck agent is reported, not killed

"""Nothing a tree started outlives it, even a double fork out of its session
and environment after a SIGKILL of the root (issue 15 §3)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import (
    FAKE_API_KEY,
    SPAWN,
    load,
    metas,
    mock_task,
    run_spawn,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_path,
    wait_until,
)

import spawn

MARK = "SPAWN_TEST_CONTAINMENT_MARK"


def marked(mark: str) -> list[psutil.Process]:
    """Processes of this test: they carry its unique marker in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def escape_script(env: dict[str, str], mark: str, tmp_path: Path) -> str:
    """A Bash command that leaves the tree every way a process can but the cgroup."""
    child_task = mock_task("runaway child", [{"sleep": 300, "text": "never"}])
    keep = {k: env[k] for k in ("HOME", "CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL", "SPAWN_SESSION_ROOT")}
    keep.update(ANTHROPIC_API_KEY=FAKE_API_KEY, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", **{MARK: mark})
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in keep.items())
    child = f'"$SPAWN_PYTHON" {shlex.quote(str(SPAWN))} --task {shlex.quote(child_task)} --tools ""'
    log = shlex.quote(str(tmp_path / "escaped.log"))
    return (
        f"setsid -f env -i PATH=$PATH {MARK}={mark} sleep 1004 >/dev/null 2>&1 </dev/null; "
        f"setsid -f env -i PATH=$PATH {assigns} {child} >{log} 2>&1 </dev/null; echo escaped"
    )


def kill_root_and_count_survivors(
    env: dict[str, str], session_root: Path, tmp_path: Path, sig: int = signal.SIGKILL
) -> tuple[dict[str, object], int]:
    mark = uuid.uuid4().hex
    root = mock_task("escape", [{"bash": escape_script(env, mark, tmp_path)}, {"sleep": 300, "text": "never"}])
    proc = start_spawn(["--task", root, "--tools", "Bash"], env)
    try:
        # sleep, the escaped spawn.py and its CLI all run before the kill.
        assert wait_until(lambda: len(marked(mark)) >= 3, 90), (tmp_path / "escaped.log").read_text()
        os.kill(proc.pid, sig)
        proc.communicate(timeout=30)
        wait_until(lambda: not marked(mark), 10)
        survivors = marked(mark)
    finally:
        for leftover in marked(mark):  # only this test's own processes, by pid
            leftover.kill()
        if proc.poll() is None:
            proc.kill()
    (root_meta,) = [m for m in metas(session_root).values() if "escape" in m["task"] and m.get("parent_id") is None]
    return root_meta, len(survivors)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setsid and cgroups are Linux")
def test_sigkilled_root_leaves_no_escaped_process(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    if not str(spawn.choose_containment(True, "s", "a", {})).startswith("cgroup "):
        pytest.skip("cgroup v2 is not writable here; the subreaper fallback is tested below")
    root_meta, survivors = kill_root_and_count_survivors(env, session_root, tmp_path)
    assert survivors == 0
    assert str(root_meta["containment"]).startswith("cgroup ")
    cgroup = Path(str(root_meta["containment"]).removeprefix("cgroup "))
    assert cgroup.name == spawn.tree_cgroup_name(str(root_meta["session"]), str(root_meta["id"]))
    assert wait_until(lambda: not cgroup.exists(), 10), f"{cgroup} was not removed"
    agent_dir = Path(str(root_meta["session"])) / "agents" / str(root_meta["id"])
    assert load(agent_dir / "outcome.json")["status"] == "failed"
    validate_records(session_root)


def test_containment_is_recorded_and_shown(env: dict[str, str], session_root: Path) -> None:
    expected = spawn.choose_containment(True, "s", "a", {}, guard_above=spawn.guard_above_possible())
    dry = stdout_json(run_spawn(["--dry-run", "--task", "hi"], env))
    assert dry["containment"].split(" ")[0] == expected.split(" ")[0]
    proc = run_spawn(["--task", mock_task("hi", [{"text": "done"}]), "--tools", ""], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = stdout_json(proc)
    (meta,) = metas(session_root).values()
    assert meta["containment"].split(" ")[0] == expected.split(" ")[0]
    if expected.startswith("cgroup "):
        assert Path(meta["containment"].removeprefix("cgroup ")).name == f"spawn-{Path(meta['session']).name}-{meta['id']}"
        cgroup = Path(meta["containment"].removeprefix("cgroup "))
        assert wait_until(lambda: not cgroup.exists(), 10), f"the guard left {cgroup}"
    status = run_spawn(["status", "--json", str(Path(result["agent_dir"]).parent.parent)], env)
    assert stdout_json(status)["agents"][0]["containment"] == meta["containment"]
    # The tree a person reads keeps internals out; the JSON above says which containment holds.
    text = run_spawn(["status", str(Path(result["agent_dir"]).parent.parent)], env).stdout
    assert f"containment {meta['containment']}" not in text and meta["id"] in text
    validate_records(session_root)


def test_no_cgroup_env_falls_back_to_the_guard_above(env: dict[str, str], session_root: Path) -> None:
    fallback = "guard" if spawn.guard_above_possible() else "none"
    dry = stdout_json(run_spawn(["--dry-run", "--task", "hi"], {**env, "SPAWN_NO_CGROUP": "1"}))
    assert dry["containment"] == fallback
    proc = run_spawn(["--task", mock_task("hi", [{"text": "done"}]), "--tools", ""], {**env, "SPAWN_NO_CGROUP": "1"})
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (meta,) = metas(session_root).values()
    assert meta["containment"] == fallback
    validate_records(session_root)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setsid and subreapers are Linux")
def test_subreaper_fallback_ends_escaped_processes_on_sigterm(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Without a cgroup, spawn.py is the subreaper of what escapes it and ends it on its way out.

    (A SIGKILL is tests/test_subreaper.py's: the guard above spawn.py ends what it left.)
    """
    root_meta, survivors = kill_root_and_count_survivors({**env, "SPAWN_NO_CGROUP": "1"}, session_root, tmp_path, signal.SIGTERM)
    assert root_meta["containment"] == "guard"
    assert survivors == 0
    agent_dir = Path(str(root_meta["session"])) / "agents" / str(root_meta["id"])
    assert load(agent_dir / "outcome.json")["status"] == "killed"


def test_cgroup_v2_mount_is_read_from_mountinfo() -> None:
    hybrid = (
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n"
    )
    assert spawn.cgroup_v2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert spawn.cgroup_v2_mount("30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


def test_children_join_their_tree_and_never_own_it() -> None:
    meta = spawn.AgentMeta.__new__(spawn.AgentMeta)
    meta.session, meta.id = "/s/20260101-x", "a1"
    meta.containment = "cgroup /sys/fs/cgroup/spawn-20260101-x-a1"
    assert spawn.owned_cgroup(meta) == Path("/sys/fs/cgroup/spawn-20260101-x-a1")
    meta.id = "b2"  # a child agent records its tree's cgroup but must not kill it
    assert spawn.owned_cgroup(meta) is None
    meta.containment = "subreaper"
    assert spawn.owned_cgroup(meta) is None
    assert json.dumps(spawn.choose_containment(True, "s", "a", {"SPAWN_NO_CGROUP": "1"})) in ('"subreaper"', '"none"')
    assert spawn.choose_containment(True, "s", "a", {"SPAWN_NO_CGROUP": "1"}, guard_above=True) in ("guard", "none")
    assert spawn.choose_containment(False, "s", "a", {"SPAWN_NO_CGROUP": "1"}, guard_above=True) in ("subreaper", "none")


def test_supervised_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """The one stop path checks identity: a pid whose start time differs is someone else."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = psutil.Process(proc.pid).create_time()
        assert spawn.Supervised(proc.pid, real - 10).signal(signal.SIGTERM) is None
        assert proc.poll() is None  # the "other" process was left alone
        stopped = spawn.Supervised(proc.pid, real).signal(signal.SIGTERM)
        assert stopped is not None
        proc.wait(timeout=30)
        assert not spawn.Supervised(proc.pid, real).alive()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux")
def test_reap_ends_the_cgroup_of_a_root_whose_guard_died_too(env: dict[str, str], session_root: Path) -> None:
    if not str(spawn.choose_containment(True, "s", "a", {})).startswith("cgroup "):
        pytest.skip("cgroup v2 is not writable here")
    launched = stdout_json(run_spawn(["--background", "--task", mock_task("stall", [{"sleep": 300, "text": "never"}])], env))
    agent_dir = Path(launched["agent_dir"])
    meta = load(agent_dir / "meta.json")
    cgroup = Path(meta["containment"].removeprefix("cgroup "))
    wait_for_path(agent_dir / "heartbeat.json")
    (guard,) = [p for p in psutil.Process(launched["pid"]).children() if "_guard" in p.cmdline()]
    inside = (cgroup / "cgroup.procs").read_text().split()
    assert str(launched["pid"]) in inside and str(guard.pid) not in inside
    guard.kill()
    os.kill(launched["pid"], signal.SIGKILL)
    proc = run_spawn(["reap", str(agent_dir.parent.parent)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert not cgroup.exists()


def test_ending_a_tree_cgroup_that_another_settler_is_removing_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A dead root's guard and a `wait` that settles it may both end its tree
    # cgroup: what one removes while the other walks it is skipped. (Before,
    # `wait` exited 3 with "No such file or directory" for the cgroup.)
    session = tmp_path / "20260101-0000-x"
    cgroup = tmp_path / "cgroupfs" / spawn.tree_cgroup_name(str(session), "a0-abc")
    gone = cgroup / "nested"
    (gone / "deeper").mkdir(parents=True)
    meta = spawn.AgentMeta(
        id="a0-abc", parent_id=None, depth=0, max_depth=1, pid=1, create_time=0, pgid=1, trace_id="0" * 32,
        span_id="1" * 16, traceparent="", task="t", tools=[], disallowed_tools=[], model="m", cwd="/", started_at="",
        session=str(session), system_prompt="", deadline=None, containment=f"cgroup {cgroup}",
    )  # fmt: skip
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(os.fsdecode(path)) == gone:
            (gone / "deeper").rmdir()
            gone.rmdir()  # the other settler got there first
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert spawn.end_tree_cgroup(meta)
    assert not gone.exists()

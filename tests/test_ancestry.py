"""Ancestry by process identity: escapes by double-fork, `env -i`, `--session`
or a copy of spawn.py stay in the tree, with its limits; an agent can't answer
its own ask.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model, and attack from the agent's own Bash.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import (
    ROOT,
    SPAWN,
    agent_dirs,
    load,
    metas,
    mock_task,
    run_spawn,
    start_spawn,
    validate_records,
    wait_for_path,
)

import spawn

# What an attacker keeps when it clears its environment: enough to reach the model.
KEPT_ENV = ("PATH", "HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")


def escaped(form: str, script: str, args: list[str], out: Path) -> str:
    """A Bash command that starts spawn.py outside the tree's environment, then waits for its JSON."""
    kept = " ".join(f'{name}="${name}"' for name in KEPT_ENV)
    cmd = f'env -i {kept} "$SPAWN_PYTHON" {script} ' + " ".join(shlex.quote(a) for a in args)
    redirect = f"> {shlex.quote(str(out))} 2> {shlex.quote(str(out))}.err"
    start = {
        "setsid": f"setsid -f {cmd} {redirect} < /dev/null",
        "nohup": f"nohup {cmd} {redirect} < /dev/null &",
        "subshell": f"( {cmd} {redirect} < /dev/null & )",
        "foreground": f"{cmd} {redirect}",
    }[form]
    # Wait for the one JSON line the spawn prints last (bounded, in case it never does).
    return f"{start}\nfor i in $(seq 1200); do grep -q '\"status\"' {shlex.quote(str(out))} && break; sleep 0.1; done"


def copy_of_spawn(tmp_path: Path) -> Path:
    """spawn.py copied elsewhere, with its schemas, as an agent could do."""
    folder = tmp_path / "elsewhere-copy"
    folder.mkdir()
    shutil.copy(SPAWN, folder / "spawn.py")
    shutil.copytree(ROOT / "schemas", folder / "schemas")
    return folder / "spawn.py"


def by_depth(session_root: Path) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for meta in metas(session_root).values():
        found.setdefault(meta["depth"], []).append(meta)
    return found


def outcome_of(session_root: Path, agent_id: str) -> dict[str, Any]:
    (path,) = session_root.glob(f"*/agents/{agent_id}/outcome.json")
    return load(path)


# ------------------------------------------------------------------ pure --


def test_runner_is_the_authority_and_the_smallest_limit_wins() -> None:
    runner = {
        "agent_dir": "/s/agents/a1-x",
        "parent_id": "a1-x",
        "session": "/s",
        "depth": 1,
        "max_depth": 2,
        "deadline": 1000.0,
        "budget": 0.5,
        "tools": ["Bash", "Read"],
        "deny": ["Bash(rm:*)"],
        "ask": [],
        "mode": "dontAsk",
        "model": "haiku",
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    }
    # The environment claims a root with wide limits; the runner decides.
    environ = {spawn.ENV_MAX_DEPTH: "99", spawn.ENV_BUDGET: "9", spawn.ENV_TOOLS: "Bash,Write,Read", spawn.ENV_DEADLINE: "5000"}
    inh = spawn.inherited_context(environ, {"runner": runner, "deadline": 900.0})
    assert (inh.parent_id, inh.session, inh.depth) == ("a1-x", Path("/s"), 1)
    assert (inh.max_depth, inh.deadline, inh.budget) == (2, 900.0, 0.5)
    assert inh.tools == ["Bash", "Read"]
    assert inh.deny == ["Bash(rm:*)"]
    assert inh.permission_mode == "dontAsk"
    assert inh.traceparent == runner["traceparent"]


def test_self_answer_refusal_rules(tmp_path: Path) -> None:
    session, other = str(tmp_path / "s"), str(tmp_path / "t")
    refuse = spawn.self_answer_refusal
    assert refuse("a0-r", Path(session), [(session, "a0-r", 0)]) is not None  # the root's own ask
    assert refuse("a2-c", Path(session), [(session, "a1-b", 1), (session, "a0-r", 0)]) is not None  # a tree agent
    assert refuse("a1-b", Path(session), [(session, "a0-r", 0)]) is None  # the root answers its child
    assert refuse("a1-b", Path(session), [(other, "a1-z", 1)]) is None  # another tree's agent
    assert refuse("a1-b", Path(session), []) is None  # the person


def test_plan_run_leaves_its_arguments_as_parsed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    folder = project / ".claude" / "agents"
    folder.mkdir(parents=True)
    (folder / "tight.md").write_text("---\nname: tight\ndescription: Tight.\nmax_depth: 1\ntimeout: 30\nmax_budget_usd: 0.2\n---\nBody.\n")
    args = spawn.build_run_parser().parse_args(
        [
            "--task",
            "x",
            "--agent",
            "tight",
            "--cwd",
            str(project),
            "--max-depth",
            "3",
            "--timeout",
            "60",
            "--max-budget-usd",
            "1",
            "--dry-run",
        ]
    )
    parsed = dict(vars(args))
    environ = {"HOME": str(tmp_path / "home"), spawn.ENV_SESSION_ROOT: str(tmp_path / "sessions")}
    first = spawn.plan_run(args, environ, {})
    assert vars(args) == parsed
    assert (first.meta.max_depth, first.meta.max_budget_usd, first.limits.max_budget_usd) == (1, 0.2, 0.2)
    second = spawn.plan_run(args, environ, {})
    assert (second.meta.max_depth, second.meta.max_budget_usd) == (1, 0.2)


# --------------------------------------------------------- runner index --


def nearest_from_child() -> str:
    code = "import spawn; print(spawn.nearest_ancestor_agent())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=60)
    return proc.stdout.strip()


def test_runner_index_finds_a_registered_ancestor_by_identity(tmp_path: Path) -> None:
    me = psutil.Process()
    agent_dir = tmp_path / "agents" / "a0-test"
    index = spawn.runner_index_dir()
    assert index.stat().st_mode & 0o777 == 0o700
    spawn.register_runner(me.pid, me.create_time() + 7, tmp_path / "wrong")  # a reused pid: another start time
    try:
        assert nearest_from_child() == "None"
        spawn.register_runner(me.pid, me.create_time(), agent_dir)
        assert nearest_from_child() == str(agent_dir)
    finally:
        spawn.unregister_runner(me.pid, me.create_time())
        spawn.unregister_runner(me.pid, me.create_time() + 7)
    assert nearest_from_child() == "None"


# ------------------------------------------------------------ end to end --


@pytest.mark.parametrize("case", ["setsid", "nohup+copy", "subshell+session", "foreground+copy+session"])
def test_escaped_spawn_is_its_agents_child_with_the_trees_limits(
    env: dict[str, str], session_root: Path, tmp_path: Path, case: str
) -> None:
    """case: how the agent's Bash escapes, +copy: with a copy of spawn.py, +session: with --session elsewhere."""
    form, use_copy, session_flag = case.partition("+")[0], "+copy" in case, "+session" in case
    script = shlex.quote(str(copy_of_spawn(tmp_path))) if use_copy else '"$SPAWN_PY"'
    elsewhere = tmp_path / "elsewhere"
    out = tmp_path / "escaped.json"
    child = mock_task("escaped child", [{"text": "child done"}])
    wide = ["--task", child, "--max-depth", "99", "--tools", "Bash,Write", "--max-budget-usd", "9", "--timeout", "9999"]
    # Without --session the escape keeps the test's session root (SPAWN_SESSION_ROOT is not kept by env -i).
    wide += ["--session", str(elsewhere)] if session_flag else ["--session", str(session_root)]
    command = escaped(form, script, wide, out)
    root_task = mock_task("root", [{"bash": command}, {"text": "root done"}])
    root_args = ["--task", root_task, "--tools", "Bash,Read", "--deny", "Bash(rm:*)", "--max-depth", "2", "--timeout", "200"]
    proc = run_spawn([*root_args, "--max-budget-usd", "0.5"], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert json.loads(out.read_text())["status"] == "done", Path(f"{out}.err").read_text()
    levels = by_depth(session_root)
    (root,) = levels[0]
    (escapee,) = levels[1]
    assert escapee["parent_id"] == root["id"]
    assert escapee["session"] == root["session"]
    assert escapee["max_depth"] == 2
    assert escapee["tools"] == ["Bash"]
    assert "Bash(rm:*)" in escapee["permissions"]["deny"]
    assert escapee["deadline"] <= root["deadline"] - spawn.PARENT_GRACE_S + 0.01
    assert escapee["max_budget_usd"] <= 0.5
    if session_flag:
        assert any(str(elsewhere) in w and root["session"] in w for w in escapee["warnings"])
        assert not elsewhere.exists() or not any(elsewhere.iterdir())
    validate_records(session_root)


def test_escapes_cannot_nest_past_the_max_depth(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    keep_root = ["--session", str(session_root)]

    def escape_with(task: str, out: str) -> dict[str, str]:
        """A step whose Bash escapes with --max-depth 9 and waits for the escapee's result."""
        return {
            "bash": escaped(
                "setsid",
                '"$SPAWN_PY"',
                ["--task", task, "--tools", "Bash", "--max-depth", "9", "--sandbox", "off", *keep_root],
                tmp_path / out,
            )
        }

    great = mock_task("great-grandchild", [{"text": "too deep"}])
    grand = mock_task("grandchild", [escape_with(great, "g3.json")])
    child = mock_task("child", [escape_with(grand, "g2.json")])
    root_task = mock_task("root", [escape_with(child, "g1.json")])
    proc = run_spawn(["--task", root_task, "--tools", "Bash", "--max-depth", "1", "--timeout", "200"], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert len({d.parent.parent for d in agent_dirs(session_root)}) == 1  # one session, one tree
    levels = by_depth(session_root)
    ran = [m for m in metas(session_root).values() if outcome_of(session_root, m["id"])["status"] != "refused"]
    assert max(m["depth"] for m in ran) == 1
    (refused,) = levels[2]
    assert outcome_of(session_root, refused["id"])["reason"].startswith("depth limit")
    assert 3 not in levels
    validate_records(session_root)


def test_session_flag_and_cleared_env_keep_the_trees_limit_files(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    outs = [tmp_path / "c1.json", tmp_path / "c2.json"]
    cleared = "env -u SPAWN_MAX_BUDGET_USD -u SPAWN_SESSION -u SPAWN_SESSION_ROOT"
    wide = ["--session", str(elsewhere), "--max-agents", "50", "--max-budget-usd", "9", "--tools", "Bash"]
    steps = [
        f'{cleared} "$SPAWN_PYTHON" "$SPAWN_PY" --task {shlex.quote(mock_task(f"child {n}", [{"text": "ok"}]))} '
        + " ".join(shlex.quote(a) for a in wide)
        + f" > {out}; echo rc=$?"
        for n, out in enumerate(outs, 1)
    ]
    root_task = mock_task("root", [{"bash": "; ".join(steps)}, {"text": "root done"}])
    proc = run_spawn(["--task", root_task, "--tools", "Bash", "--max-agents", "2", "--max-budget-usd", "0.5"], env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    first, second = (json.loads(out.read_text()) for out in outs)
    assert first["status"] == "done"
    assert second["status"] == "refused"
    assert "agents" in second["reason"]
    (session,) = {d.parent.parent for d in agent_dirs(session_root)}
    assert len(list((session / "agents").iterdir())) == 3
    assert not elsewhere.exists() or not any(elsewhere.iterdir())
    child_meta = load(session / "agents" / first["id"] / "meta.json")
    assert child_meta["max_budget_usd"] <= 0.5
    validate_records(session_root)


def test_agent_cannot_approve_its_own_ask(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    rc_file = tmp_path / "approve.rc"
    # The agent's accomplice: watches for its ask and approves it from outside the tree's env.
    approver = (
        'until ls "$SPAWN_SESSION"/asks/q-*.json >/dev/null 2>&1; do sleep 0.1; done; '
        'ask=$(basename "$(ls "$SPAWN_SESSION"/asks/q-*.json | grep -v answer | head -1)" .json); '
        f'env -i PATH="$PATH" HOME="$HOME" "$SPAWN_PYTHON" "$SPAWN_PY" approve "$ask" --session "$SPAWN_SESSION" > /dev/null 2>&1; '
        f"echo $? > {rc_file}.tmp; mv {rc_file}.tmp {rc_file}"
    )
    script = tmp_path / "approver.sh"
    script.write_text(approver)
    steps = [{"bash": f"setsid -f bash {script} < /dev/null > /dev/null 2>&1"}, {"bash": f"rm {victim}"}, {"text": "finished"}]
    proc = start_spawn(["--task", mock_task("tidy up", steps), "--tools", "Bash", "--ask", "Bash(rm:*)"], env)
    try:
        wait_for_path(rc_file, timeout=120)
        assert int(rc_file.read_text()) == spawn.ExitCode.REFUSED
        (ask_path,) = [p for p in session_root.glob("*/asks/q-*.json") if not p.name.endswith(".answer.json")]
        (attempt,) = [json.loads(line) for line in ask_path.with_name(f"{ask_path.stem}.attempts.jsonl").read_text().splitlines()]
        assert attempt["verdict"] == "approve"
        assert "own ask" in attempt["refused"]
        assert not ask_path.with_name(f"{ask_path.stem}.answer.json").exists()
        # The person answers, under a name, and that answer counts.
        denied = run_spawn(["deny", ask_path.stem, "--as", "ci-bot"], env)
        assert denied.returncode == spawn.ExitCode.OK, denied.stderr
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert victim.read_text() == "keep me"
    assert load(ask_path.with_name(f"{ask_path.stem}.answer.json"))["by"] == "ci-bot"
    validate_records(session_root)


# ----------------------------------------------- /proc, as psutil reads it --
# A spawn walks its ancestry from /proc before its CLI starts, without
# psutil (supervise/supervisor.py). These hold it to psutil's answers, the authority it
# replaces there.

needs_procfs = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")


@needs_procfs
def test_the_procfs_walk_gives_psutils_ancestry_create_times_and_environments(tmp_path: Path) -> None:
    # A chain of three shells below this test, the last one asleep, with an
    # odd environment: a name with spaces, an empty value, a value with '='.
    env = {"PATH": "/usr/bin:/bin", "SPAWN_TEST_ODD NAME": "a=b=c", "SPAWN_TEST_EMPTY": ""}
    leaf = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30; :'; :"], env=env)
    try:
        deadline = time.time() + 10
        while not (kids := psutil.Process(leaf.pid).children(recursive=True)) and time.time() < deadline:
            time.sleep(0.02)
        sleeper = max(kids, key=lambda p: p.create_time()) if kids else psutil.Process(leaf.pid)
        ours, theirs = spawn.ProcfsProcess(sleeper.pid), psutil.Process(sleeper.pid)
        assert [p.pid for p in ours.parents()] == [p.pid for p in theirs.parents()]
        assert abs(ours.create_time() - theirs.create_time()) < 1e-6
        for mine, real in zip(ours.parents(), theirs.parents(), strict=True):
            assert abs(mine.create_time() - real.create_time()) < 1e-6
        assert ours.environ() == theirs.environ()
        outer = spawn.ProcfsProcess(leaf.pid).environ()  # exec'd with env as given (a shell drops odd names for its children)
        assert outer == psutil.Process(leaf.pid).environ() and outer["SPAWN_TEST_ODD NAME"] == "a=b=c" and outer["SPAWN_TEST_EMPTY"] == ""
        assert spawn.ProcfsProcess(1).parent() is None and psutil.Process(1).parent() is None
    finally:
        for kid in psutil.Process(leaf.pid).children(recursive=True):
            kid.kill()
        leaf.kill()
        leaf.wait()


@needs_procfs
def test_running_here_answers_as_psutil_for_live_reused_zombie_and_gone_pids() -> None:
    zombie = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.01)
    try:
        me = psutil.Process()
        zombie_created = psutil.Process(zombie.pid).create_time()
        cases = {
            "this process": (me.pid, me.create_time(), True),
            "this pid, another start (a reused pid)": (me.pid, me.create_time() - 5, False),
            "a zombie": (zombie.pid, zombie_created, False),
        }
        for what, (pid, started, expected) in cases.items():
            assert spawn.running_here(pid, started) is expected, what
            assert (spawn.Supervised(pid, started)._same_process() is not None) is expected, what
        assert spawn.own_create_time() == pytest.approx(me.create_time(), abs=1e-6)
    finally:
        zombie.wait()
    assert spawn.running_here(zombie.pid, zombie_created) is False  # reaped: gone


def test_a_root_starts_its_cli_before_importing_psutil_inspect_or_hashlib(env: dict[str, str], tmp_path: Path) -> None:
    """psutil, inspect and hashlib are imported at first use (core/prelude.py): a root's ancestry
    walk and the runner index's checks read /proc, every dataclass has a docstring (or
    dataclasses asks inspect for its signature), and only task graphs hash. So its CLI
    starts first. The real CLI, against the scripted model."""
    probe = (
        "import runpy, subprocess, sys\n"
        "real = subprocess.Popen.__init__\n"
        "def popen(self, args, *a, **k):\n"
        "    if any(str(x).endswith('/claude') for x in args):\n"
        "        found = [m for m in ('psutil._common', 'ast', '_hashlib') if m in sys.modules]\n"
        "        print('imported at the CLI start:', found, file=sys.stderr)\n"
        "    return real(self, args, *a, **k)\n"
        "subprocess.Popen.__init__ = popen\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    task = mock_task("psutil probe", [{"text": "probed"}])
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(SPAWN), "--task", task, "--tools", "Read"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert "imported at the CLI start: []" in proc.stderr  # inspect imports ast

"""--sandbox: an agent's Bash runs inside Claude Code's own sandbox.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model; the agent's Bash tries to write where it may and where it
may not. They need bubblewrap and socat (`.ci/run` installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SPAWN, agent_dirs, load, metas, mock_task, plant, run_spawn, spawn_in_bash, start_spawn, stdout_json, validate_records

import spawn

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("socat") is None, reason=f"Claude Code's sandbox needs them: {spawn.SANDBOX_INSTALL}"
)


def transcript_text(agent_dir: Path) -> str:
    return (agent_dir / "transcript.jsonl").read_text()


def test_auto_sandboxes_agents_below_the_root_that_have_bash() -> None:
    assert spawn.sandbox_wanted("auto", 1, 1, ["Bash", "Read"])
    assert not spawn.sandbox_wanted("auto", 0, 0, ["Bash"])  # the root: the user's call
    assert not spawn.sandbox_wanted("auto", 2, 2, ["Read"])  # nothing to contain
    assert spawn.sandbox_wanted("auto", 1, 3, ["Bash"])  # a spawner too: its runner spawns for it (the broker)
    assert spawn.sandbox_wanted("on", 0, 3, ["Bash"])
    assert not spawn.sandbox_wanted("off", 3, 3, ["Bash"])


def test_a_leaf_writes_only_its_drop_box_and_every_record_stays_read_only(tmp_path: Path) -> None:
    session, index = tmp_path / "s", tmp_path / "runners"
    me = session / "agents" / "a2-000002"
    entries = ["agents", ".lock", "ledger.jsonl", "limits.json", "asks", "refused", "requests"]
    boxes = ["refused/a2-000002", "refused/a2-000003", "requests/a1-000001"]
    writable, read_only = spawn.sandbox_writes(False, me, str(session), index, session_entries=entries, drop_boxes=boxes)
    assert writable == [f"{session}/refused/a2-000002", str(me / "scratch")]  # its refused spawns go there
    others = [f"{session}/{n}" for n in ("agents", "ledger.jsonl", "limits.json", "asks")]
    others_boxes = [f"{session}/refused/a2-000003", f"{session}/requests/a1-000001"]
    assert read_only == [str(me), *others, *others_boxes, str(index)]  # all of agents/: its siblings too
    # A spawner writes only its request box (the broker) and its scratch: never the session, nor the runner index.
    spawner = session / "agents" / "a1-000001"
    writable, read_only = spawn.sandbox_writes(True, spawner, str(session), index, session_entries=entries, drop_boxes=boxes)
    assert writable == [f"{session}/requests/a1-000001", str(spawner / "scratch")]
    assert read_only == [str(spawner), *others, f"{session}/refused/a2-000002", f"{session}/refused/a2-000003", str(index)]


def leaf_meta(**fields: Any) -> spawn.AgentMeta:
    values: dict[str, Any] = dict(
        id="a2-00000c", parent_id="a1-00000b", depth=2, max_depth=2, pid=7, create_time=1.0, pgid=7, trace_id="0" * 32,
        span_id="1" * 16, traceparent="00-" + "0" * 32 + "-" + "1" * 16 + "-01", task="leaf", tools=["Bash", "Read"],
        disallowed_tools=[], model="m", cwd="/w", started_at="2026-11-25T10:00:00.000Z", session="/s", system_prompt="p",
        sandbox="on",
    )  # fmt: skip
    return spawn.AgentMeta(**{**values, **fields})


META_SCHEMA = json.loads((spawn.SCHEMA_DIR / "meta.json").read_text())


def test_a_dropped_refusal_is_recorded_only_as_the_leafs_narrowed_child() -> None:
    leaf = leaf_meta()
    claimed = leaf_meta(
        id="a0-ffffff", parent_id=None, depth=0, max_depth=9, session="/elsewhere", tools=["Bash", "Write"],
        task="deeper", pid=1, pid_namespace=None, containment="cgroup /sys/fs/cgroup/x", background=True, sandbox="off",
    )  # fmt: skip
    raw = json.dumps({"meta": spawn.record_to_json(claimed), "reason": "depth limit 2 reached"}).encode()
    found = spawn.dropped_refusal(leaf, "a3-0000aa.json", raw, META_SCHEMA, "pid:[1]")
    assert not isinstance(found, str), found
    meta, reason = found
    assert (meta.id, meta.parent_id, meta.depth, meta.session) == ("a3-0000aa", "a2-00000c", 3, "/s")
    assert (meta.max_depth, meta.tools, meta.task, reason) == (2, ["Bash"], "deeper", "depth limit 2 reached")
    assert (meta.sandbox, meta.containment, meta.background) == ("inherited", None, False)
    assert meta.pid_namespace == "sandbox of a2-00000c"  # its pid is never looked up, nor signalled, out here

    def problem(name: str, data: bytes) -> str:
        answer = spawn.dropped_refusal(leaf, name, data, META_SCHEMA, "pid:[1]")
        assert isinstance(answer, str)
        return answer

    assert "not the record of a child at depth 3" in problem("a2-0000aa.json", raw)  # a sibling's depth
    assert "not the record of a child" in problem("../a3-0000aa.json", raw)
    assert problem("a3-0000aa.json", b"{") == "a3-0000aa.json: not JSON"
    assert "not a refused spawn's record" in problem("a3-0000aa.json", b'{"meta": {}, "reason": 1}')
    assert "not a meta record" in problem("a3-0000aa.json", json.dumps({"meta": {"id": "x"}, "reason": "r"}).encode())
    bad_type = {**spawn.record_to_json(claimed), "max_depth": "9"}
    assert "not a meta record" in problem("a3-0000aa.json", json.dumps({"meta": bad_type, "reason": "r"}).encode())


def test_a_leaf_flooding_its_drop_box_gets_at_most_the_cap_and_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "s"
    (session / "agents").mkdir(parents=True)
    box = session / "refused" / "a2-00000c"
    box.mkdir(parents=True)
    leaf = leaf_meta(session=str(session))
    child = spawn.record_to_json(leaf_meta(session=str(session), depth=3, task="deeper"))
    for i in range(spawn.DROPPED_REFUSALS_MAX + 2):
        (box / f"a3-{0x100 + i:06x}.json").write_text(json.dumps({"meta": child, "reason": "depth limit 2 reached"}))
    os.mkfifo(box / "a3-000001.json")  # taken first (sorted), and never opened to block the runner
    (box / "a3-000002.json").symlink_to(session / "agents" / ".." / "agents")
    (box / ".a3-fff003.1.abc.tmp").write_text("a writer that died")
    assert spawn.record_dropped_refusals(leaf, [], final=True) == spawn.DROPPED_REFUSALS_MAX
    recorded = sorted((session / "agents").iterdir())
    assert len(recorded) == spawn.DROPPED_REFUSALS_MAX
    for agent_dir in recorded:
        assert load(agent_dir / "outcome.json")["status"] == "refused" and (agent_dir / ".fail").exists()
        assert load(agent_dir / "meta.json")["parent_id"] == "a2-00000c"
    assert not box.exists()  # every file taken out, and the box gone with the leaf
    err = capsys.readouterr().err
    assert err.count("a3-000001.json, not a refused spawn's record") == 1 and err.count("a3-000002.json, not a") == 1
    assert err.count(f"more than {spawn.DROPPED_REFUSALS_MAX} of them") == 2  # the two records over the cap
    assert spawn.record_dropped_refusals(leaf, []) == 0  # no box: nothing to do


def test_settings_merge_hooks_and_sandbox_into_one_object() -> None:
    sandbox = spawn.sandbox_settings(["/s/agents/x", "/s"], "127.0.0.1", ["example.com"])
    merged = json.loads(spawn.cli_settings(hooks={"Stop": []}, sandbox=sandbox, permissions=None) or "{}")
    assert merged == {"hooks": {"Stop": []}, "sandbox": sandbox}
    assert sandbox["failIfUnavailable"] is True and sandbox["allowUnsandboxedCommands"] is False
    assert sandbox["network"]["allowedDomains"] == ["127.0.0.1", "example.com"]
    assert spawn.cli_settings(hooks=None, sandbox=None) is None


@needs_bwrap
def test_sandboxed_bash_writes_in_cwd_but_not_outside(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside.txt"
    work.mkdir()
    command = f"echo in > {work / 'inside.txt'}; echo out > {outside}"
    task = mock_task("write", [{"bash": command}, {"text": "tried both"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert (work / "inside.txt").read_text() == "in\n"
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(agent_dir)
    assert load(agent_dir / "meta.json")["sandbox"] == "on"
    assert load(agent_dir / "outcome.json")["status"] == "done"
    validate_records(session_root)


@needs_bwrap
def test_preset_claude_code_keeps_the_sandbox(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    task = mock_task("write", [{"bash": f"echo out > {outside}"}, {"text": "tried"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--preset", "claude_code"], env, cwd=tmp_path / "home")
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(agent_dir)


@needs_bwrap
def test_nested_spawn_works_inside_the_sandbox_and_stays_contained(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "child-outside.txt"
    work.mkdir()
    child_task = mock_task("child", [{"bash": f"echo child > child.txt; echo out > {outside}"}, {"text": "child done"}])
    parent_task = mock_task("parent", [{"bash": spawn_in_bash("--task", child_task, "--tools", "Bash")}, {"text": "parent done"}])
    proc = run_spawn(["--task", parent_task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    # The child is its parent's runner's, outside the parent's sandbox, and sandboxed itself.
    assert by_depth[0]["sandbox"] == "on" and by_depth[1]["sandbox"] == "on"
    assert by_depth[1]["parent_id"] == by_depth[0]["id"]
    child_dir = Path(by_depth[1]["session"]) / "agents" / by_depth[1]["id"]
    assert load(child_dir / "outcome.json")["status"] == "done", load(child_dir / "outcome.json")
    assert (work / "child.txt").read_text() == "child\n"
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(child_dir)
    validate_records(session_root)


@needs_bwrap
def test_a_sandboxed_leaf_can_not_write_any_record_and_its_refused_spawn_is_still_recorded(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # cwd holds the session root, as sessions/ beside spawn.py in a project does.
    # The leaf tries every agent directory there (its root's, its finished
    # sibling's, its own), a new one, and its drop box with a forged record.
    forge = (
        'A="$SPAWN_SESSION/agents"; '
        """for d in "$A"/*; do echo '{"status": "done", "output": "FORGED"}' > "$d/outcome.json"; touch "$d/.done"; done; """
        'mkdir "$A/a1-abcdef"; echo note > "$A/$SPAWN_AGENT_ID/notes.txt"; echo ok > ok.txt; '
        """echo '{"meta": {"id": "a2-aaaaaa"}, "reason": "forged"}' > "$SPAWN_SESSION/refused/$SPAWN_AGENT_ID/a2-aaaaaa.json"; """
        'echo x > "$SPAWN_SESSION/refused/$SPAWN_AGENT_ID/a0-bbbbbb.json"; '
        """echo '{"name": "FORGED"}' >> "$SPAWN_SESSION/.status-rows.jsonl"; echo FORGED > "$SPAWN_SESSION/.status-cache.json"; """
        '"$SPAWN_PYTHON" "$SPAWN_PY" --task deeper; echo "spawn rc=$?"'
    )
    sibling = mock_task("sibling", [{"text": "sibling done"}])
    leaf = mock_task("leaf", [{"bash": forge}, {"text": "leaf done"}])
    steps = [{"bash": spawn_in_bash("--task", t, "--tools", "Bash")} for t in (sibling, leaf)]
    # No status index when the leaf starts (the sibling's commit made one): its runner must make it.
    steps.insert(1, {"bash": f'rm "$SPAWN_SESSION/{spawn.STATUS_INDEX}"'})
    parent = mock_task("parent", [*steps, {"text": "parent done"}])
    proc = run_spawn(["--task", parent, "--tools", "Bash", "--max-depth", "1", "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "parent done"
    dirs = agent_dirs(session_root)
    assert sorted(d.name[:2] for d in dirs) == ["a0", "a1", "a1", "a2"]  # no a1-abcdef, no forged a2-aaaaaa
    by_task = {load(d / "meta.json")["task"].split(" ")[0]: d for d in dirs}
    root_dir, sibling_dir, leaf_dir, refused_dir = (by_task[t] for t in ("parent", "sibling", "leaf", "deeper"))
    # Its spawn inside was refused, and its runner recorded it from outside the sandbox.
    refused = load(refused_dir / "outcome.json")
    assert refused["status"] == "refused" and refused["reason"].startswith("depth limit")
    assert (refused_dir / ".fail").exists()
    child_meta = load(refused_dir / "meta.json")
    assert (child_meta["parent_id"], child_meta["depth"], child_meta["task"]) == (leaf_dir.name, 2, "deeper")
    assert load(leaf_dir / "meta.json")["sandbox"] == "on"
    for agent_dir, output in ((root_dir, "parent done"), (sibling_dir, "sibling done"), (leaf_dir, "leaf done")):
        outcome = load(agent_dir / "outcome.json")
        assert (outcome["output"], outcome["committed_by"]) == (output, "self")
        assert (agent_dir / ".done").exists() and not (agent_dir / ".fail").exists()
    assert not (leaf_dir / "notes.txt").exists()
    # status's index and cache: made by the leaf's runner before the sandbox, so held read-only in it,
    # though the session lies inside the leaf's writable cwd.
    for name in (spawn.STATUS_INDEX, spawn.STATUS_CACHE):
        assert "FORGED" not in (leaf_dir.parent.parent / name).read_text()
    assert (tmp_path / "ok.txt").read_text() == "ok\n"  # the rest of its cwd stays writable
    text = transcript_text(leaf_dir)
    assert text.count("Read-only file system") >= 5
    assert "spawn: error: refused: depth limit" in text and "spawn rc=4" in text
    assert f"{leaf_dir.name}'s runner records it in {refused_dir}" in text
    # The forged drop-box files were named and left unrecorded; the box is gone with the leaf.
    warnings = transcript_text(root_dir)  # the leaf's runner's stderr, in its parent's Bash
    assert "a2-aaaaaa.json: not a meta record" in warnings and "a0-bbbbbb.json: not the record of a child" in warnings
    assert not (leaf_dir.parent.parent / "refused" / leaf_dir.name).exists()
    validate_records(session_root)


@needs_bwrap
def test_an_agent_spawned_inside_a_sandbox_beats_and_is_seen_running_from_outside(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # In there /proc is an outer pid namespace's: its heartbeat must not rest on it.
    child = mock_task("child", [{"bash": "python3 -c 'import time; time.sleep(4)'"}, {"text": "child done"}])
    parent = mock_task("parent", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "parent done"}])
    proc = start_spawn(
        ["--task", parent, "--tools", "Bash", "--sandbox", "on", "--cwd", str(tmp_path)], {**env, "SPAWN_HEARTBEAT_S": "0.2"}
    )
    try:
        limit = time.monotonic() + 60
        while not (beats := sorted(session_root.glob("*/agents/a1-*/heartbeat.json"))):
            assert time.monotonic() < limit and proc.poll() is None, "the inner agent never beat"
            time.sleep(0.05)
        time.sleep(2.0)  # ten beats: a heartbeat that stopped would be stale (six) by now
        assert time.time() - load(beats[0])["updated_at"] < 1.0
        status = run_spawn(["status", "--json", "--session", str(beats[0].parent.parent.parent)], env)
        (row,) = [r for r in stdout_json(status)["agents"] if r["depth"] == 1]
        assert row["state"] == "running", row
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert load(beats[0].parent / "outcome.json")["output"] == "child done"


def path_without_sandbox_programs(tmp_path: Path) -> str:
    """A PATH holding everything the current one does except bwrap and socat: a machine without them."""
    folder = tmp_path / "bin-without-sandbox"
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name not in spawn.SANDBOX_PROGRAMS and not (folder / name).exists():
                (folder / name).symlink_to(Path(directory) / name)
    return str(folder)


def test_sandbox_on_without_bwrap_is_refused_naming_what_to_install(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    no_bwrap = {**env, "PATH": path_without_sandbox_programs(tmp_path)}
    dry = run_spawn(["--task", "x", "--tools", "Bash", "--sandbox", "on", "--dry-run"], no_bwrap)
    assert dry.returncode == spawn.ExitCode.REFUSED, dry.stderr  # a dry run says what a real one would do
    assert stdout_json(dry)["sandbox"] == "on"
    assert "apt-get install bubblewrap socat" in stdout_json(dry)["refusal"]

    proc = run_spawn(["--task", "x", "--tools", "Bash", "--sandbox", "on"], no_bwrap)
    assert proc.returncode == spawn.ExitCode.REFUSED, proc.stderr
    assert "bwrap and socat not found on PATH; install them: `apt-get install bubblewrap socat`" in proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    outcome = load(agent_dir / "outcome.json")
    assert outcome["status"] == "refused" and "bwrap" in outcome["reason"]
    assert not (agent_dir / "transcript.jsonl").exists()  # never ran unsandboxed
    validate_records(session_root)


def test_sandbox_auto_without_bwrap_runs_the_leaf_unsandboxed_and_warns_once(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    child = mock_task("child", [{"bash": f"echo out > {outside}"}, {"text": "child done"}])
    parent = mock_task("parent", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "parent done"}])
    work = tmp_path / "work"
    work.mkdir()
    no_bwrap = {**env, "PATH": path_without_sandbox_programs(tmp_path)}
    proc = run_spawn(["--task", parent, "--tools", "Bash", "--max-depth", "1", "--cwd", str(work)], no_bwrap)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "sandbox can't run here" in line]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("spawn: warning: sandbox: Claude Code's sandbox can't run here (bwrap and socat not found")
    assert "write outside their allowed paths" in warnings[0] and "--sandbox on" in warnings[0]
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    leaf = by_depth[1]
    assert leaf["sandbox"] == "off"
    assert [w for w in leaf["warnings"] if "sandbox can't run here" in w] == [warnings[0].removeprefix("spawn: warning: ")]
    leaf_dir = Path(leaf["session"]) / "agents" / leaf["id"]
    assert load(leaf_dir / "outcome.json")["status"] == "done"
    assert outside.read_text() == "out\n"  # what the warning said: its Bash wrote outside its cwd
    validate_records(session_root)


def test_sandbox_problem_names_what_each_platform_needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Unit test: macOS needs only sandbox-exec, Linux bwrap and socat, and elsewhere there is none."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "sandbox-exec not found on PATH" in (spawn.sandbox_problem("darwin") or "")
    assert "only on Linux and macOS, not on win32" in (spawn.sandbox_problem("win32") or "")
    assert "bwrap and socat not found" in (spawn.sandbox_problem("linux") or "")
    seatbelt = tmp_path / "sandbox-exec"
    seatbelt.write_text("#!/bin/sh\n")
    seatbelt.chmod(0o755)
    assert spawn.sandbox_problem("darwin") is None  # no apt-get hint on macOS


@needs_bwrap
def test_a_sandboxed_agent_finds_its_config_dirs_projects_made_before_its_cli_starts(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # The CLI holds the config dir's projects/ read-only in the sandbox, by
    # /dev/null while absent; its own first transcript write made it a
    # directory under that bind now and then, and the Bash failed.
    config = tmp_path / "fresh-config"
    task = mock_task("probe", [{"bash": 'stat -c %F "$CLAUDE_CONFIG_DIR/projects"'}, {"text": "probed"}])
    fresh = {**env, "CLAUDE_CONFIG_DIR": str(config)}
    proc = run_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(tmp_path)], fresh)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    text = transcript_text(agent_dir)
    assert "Can't create file" not in text and "directory" in text


def test_dry_run_shows_the_root_unsandboxed_by_default(env: dict[str, str]) -> None:
    proc = run_spawn(["--task", "x", "--tools", "Bash", "--dry-run"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["sandbox"] == "off"


@needs_bwrap
def test_a_sandboxed_leaf_can_not_replace_the_compiled_copy_its_tree_runs(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # The cache lies in the leaf's cwd, which its Bash and Write may otherwise write.
    work, forged = tmp_path / "work", tmp_path / "forged" / "spawn.pyc"
    work.mkdir()
    env = {**env, spawn.ENV_CACHE_DIR: str(work / "cache")}
    plant(forged, SPAWN)  # a header that claims spawn.py's bytes: only the cache's walls keep it out
    source = SPAWN.resolve().read_bytes()
    copy = work / "cache" / spawn.COMPILED_DIR / spawn.compiled_name(SPAWN.resolve(), source)
    written = work / "cache" / spawn.COMPILED_DIR / "written.pyc"
    leaf = mock_task(
        "leaf",
        [
            {"bash": f'cp {forged} "$SPAWN_PY"; echo "cp rc=$?"'},
            {"tool": "Write", "input": {"file_path": str(written), "content": "x = 1\n"}},
            {"text": "leaf done"},
        ],
    )
    proc = run_spawn(["--task", leaf, "--tools", "Bash,Write", "--sandbox", "on", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (leaf_dir,) = agent_dirs(session_root)
    text = transcript_text(leaf_dir)
    assert "Read-only file system" in text and "cp rc=1" in text
    assert f"only spawn.py writes {work / 'cache'}" in text
    assert not written.exists()
    assert spawn.copy_is_trusted(copy.parent, copy, source) and copy.read_bytes() != forged.read_bytes()
    # The next spawn hands out, and its Bash runs, the genuine copy.
    task = mock_task("next", [{"bash": '"$SPAWN_PYTHON" "$SPAWN_PY" --version'}, {"text": "next done"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (next_dir,) = [d for d in agent_dirs(session_root) if d != leaf_dir]
    text = transcript_text(next_dir)
    assert f"spawn.py {spawn.__version__}" in text and "copy ran" not in text


@needs_bwrap
def test_the_projects_claude_folder_is_held_read_only_whole_so_no_placeholder_is_made(env: dict[str, str], tmp_path: Path) -> None:
    """Claude Code's sandbox makes empty placeholders for the protected files of .claude/ that are absent; two
    sandboxed agents in one folder race for them. Held read-only as one folder, it needs none."""
    project = tmp_path / "project"
    project.mkdir()
    task = mock_task("leaf", [{"bash": "sleep 2; echo made > made.txt"}, {"text": "leaf done"}])
    proc = start_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(project)], env)
    seen: set[str] = set()
    while proc.poll() is None:
        if (project / ".claude").is_dir():
            seen.update(p.name for p in (project / ".claude").iterdir())
        time.sleep(0.02)
    out, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "leaf done"
    # Only the CLI's own bookkeeping, never settings.json, agents, launch.json and the like.
    assert seen <= {".cc-writes"}, seen
    assert (project / "made.txt").read_text() == "made\n"

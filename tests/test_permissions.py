"""Permission rules: every form Claude Code accepts, enforced by spawn.py's hook
and by the CLI itself, against commands and paths written to get round them.

The end-to-end tests make many tool calls in one agent run (one mock step
each) and read the verdicts from the transcript and the files left on disk.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import agent_dirs, load, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records

import spawn

# (label, command): each deletes the file t<N> in the working directory if it runs.
RM_SPELLINGS = [
    ("rm", "rm -f t1"),
    ("/bin/rm", "/bin/rm -f t2"),
    ("\\rm", "\\rm -f t3"),
    ("'rm'", "'rm' -f t4"),
    ("rm${IFS}", "rm${IFS}-f${IFS}t5"),
    ("rm<TAB>", "rm\t-f t6"),
    ("command rm", "command rm -f t7"),
    ("env rm", "env rm -f t8"),
    ("time rm", "time rm -f t9"),
    ("FOO=1 rm", "FOO=1 rm -f t10"),
    ("xargs rm", "echo t11 | xargs rm -f"),
    ("x=rm; $x", "x=rm; $x -f t12"),
    ("sh -c 'rm'", "sh -c 'rm -f t13'"),
    ("eval rm", "eval rm -f t14"),
    ("(rm)", "(rm -f t15)"),
    ("{ rm; }", "{ rm -f t16; }"),
    ("echo $(rm)", "echo $(rm -f t17)"),
    ("echo `rm`", "echo `rm -f t18`"),
    ("find -delete", "find . -name t19 -delete"),
    ("python -c", "python3 -c \"import os; os.remove('t20')\""),
    ("true && rm", "true && rm -f t21"),
    ("true; rm", "true; rm -f t22"),
    ("false || rm", "false || rm -f t23"),
    ("nohup rm", "nohup rm -f t24"),
]


def bundled_cli() -> Path:
    return spawn.find_cli({})


def decisions(agent_dir: Path) -> list[dict[str, Any]]:
    lines = (agent_dir / "transcript.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r["message"] for r in records if r.get("type") == "PermissionDecision"]


def rm_victims(where: Path) -> Path:
    where.mkdir()
    for n in range(1, len(RM_SPELLINGS) + 1):
        (where / f"t{n}").write_text("keep me")
    return where


def blocked(where: Path) -> list[bool]:
    return [(where / f"t{n}").exists() for n in range(1, len(RM_SPELLINGS) + 1)]


def rm_script() -> list[dict[str, Any]]:
    return [*({"bash": command} for _, command in RM_SPELLINGS), {"text": "finished"}]


def run_bare_cli(env: Mapping[str, str], cwd: Path, task: str, *flags: str) -> None:
    """The bundled CLI on its own, as a user would run it, with its own HOME."""
    home = cwd.parent / "bare-home"
    home.mkdir(exist_ok=True)
    bare_env = {**env, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude")}
    proc = subprocess.run(
        [str(bundled_cli()), "-p", task, "--model", "claude-sonnet-4-5", *flags],
        cwd=cwd,
        env=bare_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_rm_spellings_spawn_blocks_all_the_bare_cli_blocks(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    bare_dir = rm_victims(tmp_path / "bare")
    run_bare_cli(env, bare_dir, mock_task("delete", rm_script()), "--allowedTools", "Bash", "--disallowedTools", "Bash(rm:*)")
    bare = blocked(bare_dir)

    ours_dir = rm_victims(tmp_path / "ours")
    proc = run_spawn(["--task", mock_task("delete", rm_script()), "--tools", "Bash", "--deny", "Bash(rm:*)", "--cwd", str(ours_dir)], env)
    assert proc.returncode == 0, proc.stderr
    ours = blocked(ours_dir)
    (agent_dir,) = agent_dirs(session_root)
    hook = {d["input"]: d["verdict"] == "deny" for d in decisions(agent_dir)}

    rows = [f"{'spelling':<16} {'bare CLI':<9} {'spawn hook':<11} spawn.py"]
    for (label, command), b, o in zip(RM_SPELLINGS, bare, ours, strict=True):
        rows.append(
            f"{label:<16} {'blocks' if b else 'RUNS':<9} {'blocks' if hook.get(command) else 'RUNS':<11} {'blocks' if o else 'RUNS'}"
        )
    rows.append(f"{'total blocked':<16} {sum(bare):<9} {sum(hook.values()):<11} {sum(ours)}")
    print("\n" + "\n".join(rows))

    assert all(o for b, o in zip(bare, ours, strict=True) if b), "spawn.py let through a spelling the bare CLI blocks"
    # The hook alone (no help from the CLI) stops every spelling that names rm.
    named = [command for label, command in RM_SPELLINGS if label not in ("find -delete", "python -c")]
    assert all(hook[c] for c in named), {c: hook.get(c) for c in named}
    validate_records(session_root)


def test_allow_rule_does_not_smuggle_commands(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    smuggled = {
        "git status $(touch s1)": "s1",
        "git status `touch s2`": "s2",
        "git status <(touch s3)": "s3",
        "git status > s4": "s4",
        "touch s5": "s5",
        "git status; touch s6": "s6",
        "git status && touch s7": "s7",
    }
    steps = [{"bash": "git status"}, *({"bash": c} for c in smuggled), {"text": "finished"}]
    proc = run_spawn(["--task", mock_task("status", steps), "--tools", "Bash", "--allow", "Bash(git status:*)", "--cwd", str(work)], env)
    assert proc.returncode == 0, proc.stderr
    assert [name for name in smuggled.values() if (work / name).exists()] == []
    (agent_dir,) = agent_dirs(session_root)
    verdicts = {d["input"]: d["verdict"] for d in decisions(agent_dir)}
    assert verdicts["git status"] == "allow"
    assert {c: verdicts[c] for c in smuggled} == dict.fromkeys(smuggled, "deny")


def test_path_rules_hold_through_symlinks_and_searches(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "secret").mkdir(parents=True)
    (work / "secret" / "a.txt").write_text("TOPSECRET-42\n")
    (work / "secret" / "b-unlisted.txt").write_text("TOPSECRET-43\n")
    (work / "public.txt").write_text("nothing here\n")
    (work / "link").symlink_to(work / "secret")
    (work / "alink.txt").symlink_to(work / "secret" / "a.txt")
    calls = [
        {"tool": "Read", "input": {"file_path": str(work / "link" / "a.txt")}},
        {"tool": "Read", "input": {"file_path": str(work / "alink.txt")}},
        {"tool": "Grep", "input": {"pattern": "TOPSECRET", "output_mode": "content"}},
        {"tool": "Grep", "input": {"pattern": "TOPSECRET", "glob": "secret/**", "output_mode": "content"}},
        {"tool": "Glob", "input": {"pattern": "secret/*"}},
        {"tool": "Read", "input": {"file_path": str(work / "public.txt")}},
    ]
    proc = run_spawn(
        [
            "--task",
            mock_task("look", [*calls, {"text": "finished"}]),
            "--tools",
            "Read,Grep,Glob",
            "--deny",
            "Read(./secret/**)",
            "--cwd",
            str(work),
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    transcript = (agent_dir / "transcript.jsonl").read_text()
    assert "TOPSECRET-4" not in transcript
    assert "b-unlisted" not in transcript
    assert [d["verdict"] for d in decisions(agent_dir)] == ["deny"] * 5 + ["allow"]
    assert "nothing here" in transcript


@pytest.mark.parametrize(
    ("rule", "tool", "tool_input", "matches"),
    [
        # Tool alone, and the legacy name of Agent.
        ("Bash", "Bash", {"command": "anything at all"}, True),
        ("Task(*)", "Agent", {"subagent_type": "x", "prompt": "p"}, True),
        ("Task", "Task", {"prompt": "p"}, True),
        # Prefix forms: `:*` and the space-star form.
        ("Bash(npm run test:*)", "Bash", {"command": "npm run test -- --watch"}, True),
        ("Bash(npm run test:*)", "Bash", {"command": "npm run testing"}, False),
        ("Bash(git diff *)", "Bash", {"command": "git diff HEAD~1"}, True),
        ("Bash(git diff *)", "Bash", {"command": "git diff"}, True),
        ("Bash(git diff *)", "Bash", {"command": "git diffx"}, False),
        ("Bash(git diff *)", "Bash", {"command": "git diff $(rm -rf x)"}, False),
        ("Bash(npm run *:check)", "Bash", {"command": "npm run lint:check"}, True),
        # A rule spanning lines.
        ("Bash(python -c 'import sys\nprint(1)')", "Bash", {"command": "python -c 'import sys\nprint(1)'"}, False),
        # Paths: //absolute, ~/home, /project root, ./relative, bare glob.
        ("Read(//etc/**)", "Read", {"file_path": "/etc/hosts"}, True),
        ("Read(//etc/**)", "Read", {"file_path": "/p/etc/hosts"}, False),
        ("Read(~/x/**)", "Read", {"file_path": "/home/u/x/y"}, True),
        ("Read(~/x/**)", "Read", {"file_path": "/home/v/x/y"}, False),
        ("Edit(/src/**)", "Write", {"file_path": "/p/src/a.py"}, True),
        ("Edit(/src/**)", "Edit", {"file_path": "/src/a.py"}, False),
        ("Read(./x)", "Read", {"file_path": "x"}, True),
        ("Read(./x)", "Read", {"file_path": "/p/y/x"}, False),
        ("Read(**/.env*)", "Grep", {"pattern": "k", "path": "/p/a/.env.prod"}, True),
        # Domains, MCP servers and tools, subagents.
        ("WebFetch(domain:example.com)", "WebFetch", {"url": "https://api.example.com/v1"}, True),
        ("WebFetch(domain:example.com)", "WebFetch", {"url": "https://example.com.evil.org/"}, False),
        ("mcp__docs", "mcp__docs__search", {}, True),
        ("mcp__docs__*", "mcp__docs__search", {}, True),
        ("mcp__docs__*", "mcp__docsx__search", {}, False),
        ("mcp__docs__search", "mcp__docs__search", {}, True),
        ("mcp__docs__search", "mcp__docs__fetch", {}, False),
        ("Agent(explore)", "Agent", {"subagent_type": "explore", "prompt": "p"}, True),
        ("Agent(explore)", "Agent", {"subagent_type": "plan", "prompt": "p"}, False),
        ("Agent(explore, plan)", "Task", {"subagent_type": "plan", "prompt": "p"}, True),
    ],
)
def test_every_rule_form_allows_what_it_names(rule: str, tool: str, tool_input: dict[str, object], matches: bool) -> None:
    parsed = spawn.parse_rule(rule)
    assert spawn.rule_matches(parsed, tool, tool_input, "/p", "/home/u", all_parts=True) is matches


def test_multiline_rule_parses_whole() -> None:
    rule = spawn.parse_rule("Bash(python -c 'import sys\nprint(1)':*)")
    assert rule.spec == "python -c 'import sys\nprint(1)':*"
    assert spawn.cli_rule(spawn.parse_rule("Task(*)")) == "Agent"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("Bash()", "empty parentheses"),
        ("Teleport(x)", "unknown tool"),
        ("mcp__docs(search)", "MCP rules take no parentheses"),
        ("WebFetch(example.com)", "domain:"),
        ("Bash(git:*status)", "only allowed at the end"),
        ("Read*", "bad permission rule"),
        ("Bash(", "bad permission rule"),
    ],
)
def test_rules_claude_code_rejects_are_rejected_with_the_reason(bad: str, reason: str) -> None:
    with pytest.raises(spawn.UsageError, match=reason):
        spawn.parse_rule(bad)


def test_bad_rule_exits_usage_and_starts_nothing(env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x", "--deny", "mcp__docs(search)"], env)
    assert proc.returncode == spawn.ExitCode.USAGE
    assert proc.stderr.startswith("spawn: error: bad permission rule") and "MCP rules take no parentheses" in proc.stderr
    assert not session_root.exists() or not any(session_root.iterdir())


def test_deny_beats_ask_beats_allow_and_most_specific_is_reported() -> None:
    rules = spawn.RuleSet(
        allow=[spawn.parse_rule("Bash(git:*)"), spawn.parse_rule("Bash(git push origin:*)")],
        deny=[spawn.parse_rule("Bash"), spawn.parse_rule("Bash(git push:*)")],
        ask=[spawn.parse_rule("Bash(git push:*)")],
    )
    assert spawn.decide("Bash", {"command": "git push origin"}, rules, ["Bash"], cwd="/p", home="/h") == ("deny", "Bash(git push:*)")
    rules.deny = []
    assert spawn.decide("Bash", {"command": "git push origin"}, rules, ["Bash"], cwd="/p", home="/h") == ("ask", "Bash(git push:*)")
    assert spawn.decide("Bash", {"command": "git log"}, rules, ["Bash"], cwd="/p", home="/h") == ("allow", "Bash(git:*)")


def test_an_ask_rule_asks_for_any_part_of_a_command_and_mcp_grants_cover_their_tools() -> None:
    """Ask rules match as deny rules do, on any part of a compound command (only allow
    rules must cover every part); a granted MCP server grants each of its tools."""
    rules = spawn.RuleSet(ask=[spawn.parse_rule("Bash(git push:*)")])
    assert spawn.decide("Bash", {"command": "git status && git push"}, rules, ["Bash"], cwd="/p", home="/h") == ("ask", "Bash(git push:*)")
    none = spawn.RuleSet()
    assert spawn.decide("mcp__files__read", {}, none, ["Bash", "mcp__files"], cwd="/p", home="/h") == (
        "allow",
        "mcp__files__read is granted",
    )
    assert spawn.decide("mcp__other__read", {}, none, ["mcp__files"], cwd="/p", home="/h") == ("deny", "mcp__other__read is not granted")


def test_rules_reach_the_cli_in_its_own_form() -> None:
    rules = spawn.RuleSet(
        allow=[spawn.parse_rule("Bash(git status:*)")],
        deny=[spawn.parse_rule("Task(*)"), spawn.parse_rule("Read(./secret/**)")],
        ask=[spawn.parse_rule("Bash(rm:*)")],
    )
    allowed, denied = spawn.cli_permissions(["Bash", "Read", "Agent"], ["WebFetch"], rules)
    assert allowed == ["Bash(git status:*)", "Read", "Agent"]
    assert denied == ["WebFetch", "Agent", "Read(./secret/**)"]


def test_command_named_by_the_agents_own_environment_is_read_through_it() -> None:
    environ = {"SPAWN_PYTHON": "/usr/bin/python3"}
    assert spawn.shell_command_parts('"$SPAWN_PYTHON" x.py', 0, environ) == ["python3 x.py"]
    # ...but not when the line itself could set the variable.
    assert spawn.shell_command_parts('SPAWN_PYTHON=rm; "$SPAWN_PYTHON" x', 0, environ) == [spawn.DYNAMIC_COMMAND]


# ------------------------------------------------------------- settings files --


def write_settings(path: Path, **permissions: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"permissions": permissions}))
    return path


def test_dry_run_shows_each_rule_with_its_file(env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    user = write_settings(Path(env["CLAUDE_CONFIG_DIR"]) / "settings.json", deny=["Bash(rm:*)"])
    shared = write_settings(project / ".claude" / "settings.json", allow=["Bash(git diff *)"], ask=["WebFetch"])
    local = write_settings(project / ".claude" / "settings.local.json", deny=["Read(./secret/**)"])
    proc = run_spawn(["--task", "x", "--tools", "Bash,Read", "--deny", "Write", "--dry-run", "--cwd", str(project)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = {(r["kind"], r["rule"]): r for r in stdout_json(proc)["rules"]}
    assert rows["deny", "Bash(rm:*)"]["source"] == str(user)
    assert rows["allow", "Bash(git diff *)"]["source"] == str(shared)
    assert rows["ask", "WebFetch"]["source"] == str(shared)
    assert rows["deny", "Read(./secret/**)"]["source"] == str(local)
    assert rows["deny", "Write"]["source"] == "--deny"
    assert rows["deny", "Bash(rm:*)"]["cli"] == "Bash(rm:*)"
    assert "sandbox" in rows["deny", "Bash(rm:*)"]["warning"]

    opted_out = stdout_json(run_spawn(["--task", "x", "--dry-run", "--no-settings", "--cwd", str(project)], env))
    assert opted_out["rules"] == []


def test_bad_settings_file_exits_usage_and_starts_nothing(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_settings(project / ".claude" / "settings.json", deny=["Bash()"])
    proc = run_spawn(["--task", "x", "--cwd", str(project)], env)
    assert proc.returncode == spawn.ExitCode.USAGE
    assert "settings.json" in proc.stderr and "empty parentheses" in proc.stderr
    assert not session_root.exists() or not any(session_root.iterdir())


def test_an_empty_settings_file_is_no_settings(env: dict[str, str], tmp_path: Path) -> None:
    """Claude Code's sandbox leaves an empty settings.json on the host while a sandboxed Bash runs (its mount point)."""
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    (project / ".claude" / "settings.json").write_text("")
    write_settings(project / ".claude" / "settings.local.json", deny=["Read(./secret/**)"])
    proc = run_spawn(["--task", "x", "--dry-run", "--cwd", str(project)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert [(r["kind"], r["rule"]) for r in stdout_json(proc)["rules"]] == [("deny", "Read(./secret/**)")]
    (project / ".claude" / "settings.json").write_text("{")  # not empty: still an error that says what to do
    proc = run_spawn(["--task", "x", "--dry-run", "--cwd", str(project)], env)
    assert proc.returncode == spawn.ExitCode.USAGE and "fix it or pass --no-settings" in proc.stderr


def test_settings_deny_binds_children_whatever_they_ask_for(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    write_settings(Path(env["CLAUDE_CONFIG_DIR"]) / "settings.json", deny=["Bash(rm:*)"])
    child = mock_task("child", [{"bash": f"rm -f {victim}"}, {"text": "child done"}])
    spawn_child = spawn_in_bash("--task", child, "--tools", "Bash", "--allow", "Bash(rm:*)", "--no-settings")
    root = mock_task("root", [{"bash": spawn_child}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash"], env)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "keep me"
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert "Bash(rm:*)" in load(child_dir / "meta.json")["permissions"]["deny"]
    assert decisions(child_dir)[0]["verdict"] == "deny"
    validate_records(session_root)


def test_shipped_code_reviewer_cannot_smuggle_through_git_diff() -> None:
    root = Path(__file__).resolve().parent.parent
    definitions, _ = spawn.load_definitions(root, {"HOME": "/nonexistent"})
    rules = definitions["code-reviewer"].permissions
    granted = definitions["code-reviewer"].tools or []

    def verdict(command: str) -> str:
        return spawn.decide("Bash", {"command": command}, rules, granted, cwd="/p", home="/h")[0]

    assert verdict("git diff HEAD~1") == "allow"
    assert verdict("git diff $(touch x)") == "deny"
    assert verdict("git diff `touch x`") == "deny"
    assert verdict("git diff > notes.txt") == "deny"


def test_path_rules_follow_symlinks_for_every_file_tool(tmp_path: Path) -> None:
    work = tmp_path / "p"
    (work / "secret").mkdir(parents=True)
    (work / "secret" / "a.txt").write_text("x")
    (work / ".env").write_text("K=v")
    (work / "src").mkdir()
    (work / "src" / "envlink").symlink_to(work / ".env")
    (work / "link").symlink_to(work / "secret")
    rules = spawn.RuleSet(deny=[spawn.parse_rule("Edit(./secret/**)"), spawn.parse_rule("Read(**/.env*)")])
    tools = ["Read", "Edit", "Write", "Grep"]

    def verdict(tool: str, **tool_input: str) -> str:
        return spawn.decide(tool, tool_input, rules, tools, cwd=str(work), home="/h")[0]

    assert verdict("Write", file_path=str(work / "link" / "new.txt"), content="x") == "deny"
    assert verdict("Edit", file_path="link/a.txt", old_string="x", new_string="y") == "deny"
    assert verdict("Read", file_path=str(work / "src" / "envlink")) == "deny"
    assert verdict("Grep", pattern="K", path="src/envlink") == "deny"
    assert verdict("Read", file_path=str(work / "src" / "other.py")) == "allow"


def test_kept_by_spawn_py_names_the_session_and_cache_for_edits_only(tmp_path: Path) -> None:
    """Unit test: which Edit and Write calls land in spawn.py's own folders."""
    session, cache, cwd = tmp_path / "s", tmp_path / "cache", tmp_path / "work"
    scratch = session / "agents" / "a1-000001" / "scratch"
    scratch.mkdir(parents=True)
    (scratch / "link").symlink_to(session / "agents")
    kept, own = [str(session), str(cache)], [str(scratch)]

    def kept_for(tool: str, path: Path | str) -> str | None:
        return spawn.kept_by_spawn_py(tool, {"file_path": str(path)}, str(cwd), kept, own)

    assert kept_for("Write", session / "agents" / "a1-x" / "meta.json") == str(session)
    assert kept_for("Edit", cwd / ".." / "s" / "ledger.jsonl") == str(session)  # any spelling
    assert kept_for("NotebookEdit", cache / "compiled" / "x.pyc") == str(cache)
    assert kept_for("Write", scratch / "notes.txt") is None  # its own scratch
    assert kept_for("Write", scratch / "link" / "a1-x" / "meta.json") == str(session)  # but not through a link
    assert kept_for("Read", session / "agents" / "a1-x" / "meta.json") is None
    assert kept_for("Write", cwd / "notes.txt") is None


def test_no_agent_writes_its_session_with_edit_or_write(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # cwd holds the session root, as sessions/ beside spawn.py in a project does:
    # without spawn.py's own check the CLI would allow both writes.
    steps: list[dict[str, Any]] = [
        {"tool": "Write", "input": {"file_path": "SESSION_DIR/agents/a1-abcdef/meta.json", "content": "{}"}},
        {"tool": "Write", "input": {"file_path": "SESSION_DIR/asks/q-abcdef.answer.json", "content": '{"verdict": "approve"}'}},
        {"text": "child done"},
    ]
    template = mock_task("child", steps)
    bash = f'T=$(printf %s {shlex.quote(template)} | sed "s|SESSION_DIR|$SPAWN_SESSION|g"); {spawn_in_bash()} --tools Write --task "$T"'
    parent = mock_task("parent", [{"bash": bash}, {"text": "parent done"}])
    proc = run_spawn(["--task", parent, "--tools", "Bash,Write", "--max-depth", "1", "--cwd", str(tmp_path)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    dirs = agent_dirs(session_root)
    assert sorted(d.name[:2] for d in dirs) == ["a0", "a1"]
    (child_dir,) = [d for d in dirs if d.name.startswith("a1")]
    session = child_dir.parent.parent
    assert load(child_dir / "outcome.json")["output"] == "child done"
    assert not (session / "agents" / "a1-abcdef").exists()
    assert not (session / "asks" / "q-abcdef.answer.json").exists()
    records = [json.loads(line) for line in (child_dir / "transcript.jsonl").read_text().splitlines()]
    decisions = [r["message"] for r in records if r["type"] == "PermissionDecision"]
    assert [(d["verdict"], d["rule"]) for d in decisions] == [("deny", f"only spawn.py writes {session}")] * 2
    validate_records(session_root)

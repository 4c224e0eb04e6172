"""Claude Code parity: agent files load as Claude Code loads them, their fields
take effect, and Claude Code itself finds spawn.py's skill and command.

End-to-end tests run the real bundled claude CLI against tools/mock_model.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FAKE_API_KEY,
    ROOT,
    SPAWN,
    agent_dirs,
    listed_agents,
    load,
    mock_task,
    run_spawn,
    stdout_json,
    validate_records,
    write_agent,
)
from mock_model import serve

import spawn

FIXTURES = ROOT / "tests" / "fixtures"
FIXTURE_PROJECTS = sorted(FIXTURES.glob("agents-*"))
FIXTURE_FILES = sorted(FIXTURES.glob("agents-*/.claude/agents/*.md"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    (path / ".claude" / "agents").mkdir(parents=True)
    return path


# ------------------------------------------------------------ reading files --


def test_fallback_reads_key_value_lines_when_yaml_fails() -> None:
    text = "---\nname: fix\ndescription: Use when: the build breaks\ntools: Read, Bash\nmaxTurns: 4\n---\nBody.\n---\nname: body\n"
    d, problems = spawn.parse_definition(text, "fix.md", "project")
    assert d is not None
    assert d.description == "Use when: the build breaks"
    assert d.tools == ["Read", "Bash"]
    assert d.max_turns == 4
    assert [(p.line, p.severity) for p in problems] == [(3, "warning")]
    assert "fallback" in problems[0].message
    assert d.prompt == "Body.\n---\nname: body"  # the frontmatter ends at the first --- line


def test_tools_grammar_keeps_parentheses_whole_and_canonicalises_aliases() -> None:
    assert spawn.split_tool_entries("Read, Agent(explore, plan), mcp__docs") == ["Read", "Agent(explore, plan)", "mcp__docs"]
    text = (
        "---\nname: t\ndescription: d\n"
        "tools: Read, Agent(explore, plan), Task(worker), mcp__docs, mcp__tracker__search, TaskCreate, Workflow\n"
        "disallowedTools: KillShell\n---\n"
    )
    d, problems = spawn.parse_definition(text, "t.md", "project")
    assert d is not None
    assert problems == []
    assert d.tools == ["Read", "Agent", "mcp__docs", "mcp__tracker__search", "TaskCreate", "Workflow"]
    assert d.disallowed_tools == ["TaskStop"]
    assert [r.text for r in d.permissions.allow] == ["Agent(explore)", "Agent(plan)", "Agent(worker)"]


def test_odd_skill_names_are_dropped_and_star_tools_inherit() -> None:
    d, problems = spawn.parse_definition("---\nname: s\ndescription: d\nskills: [pdf, /review, '*']\n---\n", "s.md", "project")
    assert d is not None and d.skills == ["pdf"]
    assert [p.severity for p in problems] == ["warning"]
    star, problems = spawn.parse_definition("---\nname: s\ndescription: d\ntools: '*'\n---\n", "s.md", "project")
    assert star is not None and star.tools is None and problems == []  # all tools: inherits


def test_every_claude_code_field_is_read() -> None:
    path = FIXTURES / "agents-docs" / ".claude" / "agents" / "all-fields.md"
    d, problems = spawn.parse_definition(path.read_text(), str(path), "project")
    assert d is not None and problems == []
    assert (d.model, d.permission_mode, d.max_turns, d.effort) == ("sonnet", "plan", 12, "high")
    assert (d.memory, d.background, d.isolation, d.color) == ("project", True, "worktree", "purple")
    assert (d.initial_prompt, d.omit_claude_md, d.auto_compact_window) == ("Read CHANGELOG.md first.", True, 120000)
    assert d.skills == ["changelog", "release-notes"]
    assert sorted(d.mcp_servers) == ["docs", "tracker"]
    assert d.hooks is not None and sorted(d.hooks) == ["PreToolUse", "Stop"]


def test_lint_severities_unknown_field_and_tool_warn_description_errors(base_env: dict[str, str], project: Path) -> None:
    write_agent(project, "odd", "name: odd\ndescription: fine\ntools: Read, Teleport\nflavour: mint")
    write_agent(project, "renamed", "name: other-name\ndescription: fine")
    lint = run_spawn(["agents", "lint"], base_env, cwd=project)
    assert lint.returncode == spawn.ExitCode.OK, lint.stdout + lint.stderr
    assert "odd.md:4: warning: unknown tool Teleport" in lint.stdout
    assert "odd.md:5: warning: unknown field 'flavour'" in lint.stdout
    assert "renamed.md:2: warning: name 'other-name' differs from the file name 'renamed'" in lint.stdout
    write_agent(project, "nodesc", "name: nodesc\ntools: Read")
    lint = run_spawn(["agents", "lint"], base_env, cwd=project)
    assert lint.returncode == spawn.ExitCode.USAGE
    assert "nodesc.md:1: error: description is missing" in lint.stdout


def test_agents_in_subfolders_are_found_and_readmes_skipped(base_env: dict[str, str], project: Path) -> None:
    folder = project / ".claude" / "agents" / "review"
    folder.mkdir()
    (folder / "style-checker.md").write_text("---\nname: style-checker\ndescription: Checks style\n---\nBody\n")
    (project / ".claude" / "agents" / "README.md").write_text("# My agents\n")
    assert [a["name"] for a in listed_agents(base_env, project)] == ["style-checker"]
    lint = run_spawn(["agents", "lint"], base_env, cwd=project)
    assert lint.returncode == spawn.ExitCode.OK, lint.stdout
    assert "README.md:1: warning: no frontmatter" in lint.stdout
    assert (
        json.loads(run_spawn(["--dry-run", "--agent", "style-checker", "--task", "x"], base_env, cwd=project).stdout)["agent"]
        == "style-checker"
    )


def test_unknown_field_never_stops_a_run(base_env: dict[str, str], project: Path) -> None:
    write_agent(project, "odd", "name: odd\ndescription: Use when: anything\nflavour: mint\ntools: Read")
    proc = run_spawn(["--dry-run", "--agent", "odd", "--task", "hi"], base_env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["agent"] == "odd"
    assert [a["name"] for a in listed_agents(base_env, project)] == ["odd"]


@pytest.mark.parametrize("project_dir", FIXTURE_PROJECTS, ids=lambda p: p.name)
def test_every_fixture_agent_loads_lints_clean_and_dry_runs(base_env: dict[str, str], project_dir: Path) -> None:
    files = sorted((project_dir / ".claude" / "agents").glob("*.md"))
    lint = run_spawn(["agents", "lint"], base_env, cwd=project_dir)
    assert lint.returncode == spawn.ExitCode.OK, lint.stdout
    assert ": error:" not in lint.stdout
    assert sorted(a["name"] for a in listed_agents(base_env, project_dir)) == sorted(f.stem for f in files)
    for path in files:
        proc = run_spawn(["--dry-run", "--agent", path.stem, "--task", "check it"], base_env, cwd=project_dir)
        assert proc.returncode == spawn.ExitCode.OK, (path.name, proc.stderr)
        resolved = json.loads(proc.stdout)
        assert resolved["agent"] == path.stem
        assert resolved["refusal"] is None, (path.name, resolved["refusal"])


def test_definition_fields_reach_the_plan(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--dry-run", "--agent", "all-fields", "--task", "go"], base_env, cwd=FIXTURES / "agents-docs")
    got = json.loads(proc.stdout)
    assert (got["max_turns"], got["effort"], got["background"], got["isolation"]) == (12, "high", True, "worktree")
    assert (got["initial_prompt"], got["memory"], got["hooks"]) == ("Read CHANGELOG.md first.", "project", ["PreToolUse", "Stop"])
    assert got["disallowed_tools"] == ["Write", "Edit", "TaskStop"]
    assert got["permissions"]["allow"] == ["Agent(explore)", "Agent(plan)"]
    flags = run_spawn(
        ["--dry-run", "--agent", "all-fields", "--task", "go", "--no-background", "--max-turns", "3"],
        base_env,
        cwd=FIXTURES / "agents-docs",
    )
    got = json.loads(flags.stdout)
    assert (got["background"], got["max_turns"]) == (False, 3)
    # A file without tools inherits: the parent's tools, or the root default.
    assert json.loads(run_spawn(["--dry-run", "--agent", "minimal", "--task", "x"], base_env, cwd=FIXTURES / "agents-docs").stdout)[
        "tools"
    ] == list(spawn.DEFAULT_TOOLS)
    child_env = {**base_env, "SPAWN_TOOLS": "Read,Bash", "SPAWN_DEPTH": "0"}
    child = json.loads(run_spawn(["--dry-run", "--agent", "minimal", "--task", "x"], child_env, cwd=FIXTURES / "agents-docs").stdout)
    assert child["tools"] == ["Bash", "Read"]


# ----------------------------------------------------------- tool catalogue --


def test_lint_uses_the_cached_cli_tool_list(base_env: dict[str, str], project: Path, tmp_path: Path) -> None:
    write_agent(project, "newer", "name: newer\ndescription: uses a tool of a newer CLI\ntools: Read, FutureTool")
    env = {**base_env, "SPAWN_CACHE_DIR": str(tmp_path / "cache")}
    assert "unknown tool FutureTool" in run_spawn(["agents", "lint"], env, cwd=project).stdout
    spawn.remember_cli_tools({"claude_code_version": "9.9.9", "tools": ["Read", "FutureTool", "Task"]}, env)
    assert json.loads((tmp_path / "cache" / "cli-tools-9.9.9.json").read_text())["tools"] == ["Agent", "FutureTool", "Read"]
    assert "unknown tool" not in run_spawn(["agents", "lint"], env, cwd=project).stdout
    flag = run_spawn(["--dry-run", "--tools", "Read,FutureTool", "--task", "x"], env, cwd=project)
    assert json.loads(flag.stdout)["tools"] == ["Read", "FutureTool"]


# ---------------------------------------------------------------- end to end --


def test_run_caches_the_cli_tools_and_honours_turns_initial_prompt_hooks_memory(
    env: dict[str, str], session_root: Path, project: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "stop-hook-ran"
    initial = mock_task("Start by reading the notes.", [{"text": "from-the-initial-prompt"}])
    write_agent(
        project,
        "noter",
        f"""
name: noter
description: Keeps notes
tools: Read, Bash
maxTurns: 2
effort: low
skills: [house-style]
memory: project
initialPrompt: '{initial}'
hooks:
  Stop:
    - hooks:
        - type: command
          command: touch {marker}
""",
    )
    skill = project / ".claude" / "skills" / "house-style" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: house-style\ndescription: d\n---\nWrite HOUSE-STYLE-MARKER prose.\n")
    cache = tmp_path / "cache"
    argv_log = tmp_path / "cli-argv"
    recorder = tmp_path / "claude"  # the real CLI, with its command line written down first
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_log}\nexec {spawn.find_cli(env)} "$@"\n')
    recorder.chmod(0o755)
    run_env = {**env, "SPAWN_CACHE_DIR": str(cache), "SPAWN_CLI": str(recorder)}
    proc = run_spawn(["--agent", "noter", "--task", "the task", "--cwd", str(project)], run_env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "from-the-initial-prompt"  # the initial prompt came first
    assert marker.exists()  # the definition's hook ran in the CLI
    argv = argv_log.read_text().splitlines()
    assert argv[argv.index("--effort") + 1] == "low"
    assert argv[argv.index("--max-turns") + 1] == "2"
    system_prompt = argv[argv.index("--system-prompt") + 1 :]  # multi-line: the rest of the log from there
    assert "# Skill: house-style" in "\n".join(system_prompt) and "HOUSE-STYLE-MARKER" in "\n".join(system_prompt)
    assert "# Agent memory" in "\n".join(system_prompt)
    assert (project / ".claude" / "agent-memory" / "noter").is_dir()
    (cached,) = cache.glob("cli-tools-*.json")
    assert {"Bash", "Read"} <= set(json.loads(cached.read_text())["tools"])  # what this run's CLI reported
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "meta.json")["max_turns"] == 2
    validate_records(session_root)


def test_max_turns_from_the_definition_stops_the_agent(env: dict[str, str], project: Path) -> None:
    write_agent(project, "brief", "name: brief\ndescription: short\ntools: Bash\nmaxTurns: 1")
    task = mock_task("loop", [{"bash": "echo one"}, {"bash": "echo two"}, {"text": "finished"}])
    proc = run_spawn(["--agent", "brief", "--task", task], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED
    assert "max_turns" in stdout_json(proc)["reason"]


def test_background_definition_runs_in_the_background(env: dict[str, str], project: Path) -> None:
    write_agent(project, "bg", "name: bg\ndescription: background\ntools: Read\nbackground: true")
    proc = run_spawn(["--agent", "bg", "--task", mock_task("x", [{"text": "bg-done"}])], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    launched = stdout_json(proc)
    assert "status" not in launched or launched["status"] != "done"
    waited = run_spawn(["wait", launched["id"], "--timeout", "120"], env, cwd=project)
    assert waited.returncode == spawn.ExitCode.OK, waited.stdout + waited.stderr
    assert "bg-done" in waited.stdout


def test_mcp_servers_named_in_the_list_form_come_from_mcp_json(env: dict[str, str], session_root: Path, project: Path) -> None:
    echo = {"command": sys.executable, "args": [str(ROOT / "tests" / "fixtures" / "echo_mcp_server.py")]}
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"echo": echo}}))
    write_agent(project, "echoer", "name: echoer\ndescription: Echo through MCP\ntools: Read\nmcpServers:\n  - echo\n  - nowhere")
    lint = run_spawn(["agents", "lint"], env, cwd=project)
    assert lint.returncode == spawn.ExitCode.OK
    assert "warning: MCP server 'nowhere' is in neither .mcp.json nor ~/.claude.json" in lint.stdout
    task = mock_task("echo it", [{"tool": "mcp__echo__echo", "input": {"text": "hello"}}, {"text": "echoed"}])
    proc = run_spawn(["--agent", "echoer", "--task", task], env, cwd=project, timeout=180)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "meta.json")["mcp_servers"] == ["echo"]
    assert "echo-server says: hello" in (agent_dir / "transcript.jsonl").read_text()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(project: Path) -> Path:
    git(project, "init", "-q")
    (project / "README").write_text("hi\n")
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return project


def test_isolation_worktree_kept_when_changed_removed_when_not(env: dict[str, str], repo: Path) -> None:
    write_agent(repo, "iso", "name: iso\ndescription: isolated\ntools: Bash\nisolation: worktree")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "agent")
    changed = run_spawn(["--agent", "iso", "--task", mock_task("w", [{"bash": "echo new > made.txt"}, {"text": "ok"}])], env, cwd=repo)
    assert changed.returncode == spawn.ExitCode.OK, changed.stderr
    kept = Path(stdout_json(changed)["worktree"])
    assert (kept / "made.txt").read_text() == "new\n"
    assert not (repo / "made.txt").exists()
    assert load(Path(stdout_json(changed)["outcome"]))["worktree"] == str(kept)
    clean = run_spawn(["--agent", "iso", "--task", mock_task("r", [{"bash": "cat README"}, {"text": "ok"}])], env, cwd=repo)
    assert clean.returncode == spawn.ExitCode.OK, clean.stderr
    summary = stdout_json(clean)
    assert "worktree" not in summary
    assert not (Path(summary["agent_dir"]) / "worktree").exists()
    assert git(repo, "branch", "--list", f"spawn/{summary['id']}") == ""


# --------------------------------------------------- Claude Code calls spawn --

SKILL = ".claude/skills/spawn/SKILL.md"
COMMAND = ".claude/commands/spawn-tree.md"
# How the skill and the command run spawn.py; group 1 is the script's path.
RUN_SPAWN_PY = re.compile(r'\$\{SPAWN_PYTHON:-uv run\} "(\$\{SPAWN_PY:-[^"]*\})"')


def own_sentence(rel: str) -> str:
    """The first line of a file's text after its frontmatter: what only that file says."""
    body = (ROOT / rel).read_text().split("\n---\n", 1)[1]
    return next(line for line in body.splitlines() if line.strip())


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A user's project holding copies of spawn.py's skill and slash command."""
    path = tmp_path / "user-project"
    for rel in (SKILL, COMMAND):
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, path / rel)
    return path


@pytest.fixture
def text_env(base_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """A scripted model that answers with whose text its task carries: the skill's, the command's."""
    skill, command = (re.escape(own_sentence(rel)) for rel in (SKILL, COMMAND))
    rules = [
        {"match": f"(?s)(?=.*{skill})(?=.*{command})", "steps": [{"text": "saw both"}]},
        {"match": skill, "steps": [{"text": "saw the skill"}]},
        {"match": command, "steps": [{"text": "saw the command"}]},
    ]
    with serve(tmp_path, {"rules": rules, "default": [{"text": "saw neither"}]}) as served:
        yield {**base_env, "ANTHROPIC_BASE_URL": served.url, "ANTHROPIC_API_KEY": FAKE_API_KEY}


def run_claude(prompt: str, cwd: Path, env: Mapping[str, str], *flags: str) -> list[dict[str, Any]]:
    """The bundled claude CLI's stream-json messages for one prompt, with the project's settings."""
    cli = spawn.find_cli(env)
    argv = [str(cli), "-p", prompt, "--output-format", "stream-json", "--verbose", "--setting-sources", "project", *flags]
    proc = subprocess.run(argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def bash_blocks(text: str, heading: str) -> str:
    """The bash code under a file's markdown heading."""
    section = text.split(f"## {heading}\n", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_claude_code_finds_the_skill_and_command_and_its_fan_out_runs(env: dict[str, str], session_root: Path, user_project: Path) -> None:
    skill = (user_project / SKILL).read_text()
    # The scripted turn runs the skill's fan-out and wait as written, with its tasks filled in.
    bash = bash_blocks(skill, "How to fan out") + bash_blocks(skill, "How to wait") + 'echo "ids=$A,$B"\n'
    assert "jq" not in bash  # --print id: a machine without jq runs it too
    for part in ("one", "two"):
        bash = bash.replace(f'"Part {part}"', shlex.quote(mock_task(f"part {part}", [{"text": f"answer {part}"}])))
    cli_env = {**env, "SPAWN_PYTHON": sys.executable, "SPAWN_PY": str(SPAWN)}
    parent_task = mock_task("use the spawn skill", [{"bash": bash}, {"text": "parent-done"}])
    messages = run_claude(parent_task, user_project, cli_env, "--allowedTools", "Bash", "--permission-mode", "dontAsk")
    init = next(m for m in messages if m.get("type") == "system" and m.get("subtype") == "init")
    assert "spawn" in init["skills"]
    # Two distinct entries: a command named like a skill is hidden by it.
    assert [name for name in init["slash_commands"] if name.startswith("spawn")] == ["spawn", "spawn-tree"]
    outcomes = {load(d / "meta.json")["id"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert sorted(o["output"] for o in outcomes.values()) == ["answer one", "answer two"]
    (shown,) = (
        b["content"] for m in messages if m.get("type") == "user" for b in m["message"]["content"] if b.get("type") == "tool_result"
    )
    waited, *_, ids = shown.strip().splitlines()
    # --print id gave the bare ids, and wait found both children done.
    assert ids.startswith("ids=") and set(ids.removeprefix("ids=").split(",")) == set(outcomes)
    assert json.loads(waited)["status"] == "done"
    assert {a["id"] for a in json.loads(waited)["agents"]} == set(outcomes)


@pytest.mark.parametrize(
    ("prompt", "seen"),
    [("/spawn-tree Summarise the README", "saw the command"), ("/spawn Summarise the README", "saw the skill")],
)
def test_slash_command_and_skill_each_send_their_own_text(text_env: dict[str, str], user_project: Path, prompt: str, seen: str) -> None:
    messages = run_claude(prompt, user_project, text_env)
    (result,) = (m for m in messages if m.get("type") == "result")
    assert result["result"] == seen


def spawn_py_runs(rel: str) -> set[tuple[str, str]]:
    """How a file runs spawn.py: (the interpreter and script, the script's path), each way it does."""
    return {(m[0], m[1]) for m in RUN_SPAWN_PY.finditer((ROOT / rel).read_text())}


def test_skill_and_command_find_spawn_py_from_any_folder_of_a_git_project(base_env: dict[str, str], tmp_path: Path) -> None:
    (run,) = spawn_py_runs(SKILL)
    assert spawn_py_runs(COMMAND) == {run}
    command, script = run
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / "src" / "pkg").mkdir(parents=True)
    plain.mkdir()
    git(repo, "init", "-q")
    for folder in (repo, plain):
        shutil.copy(SPAWN, folder / "spawn.py")
    # A project shell: no SPAWN_PY, and no repository above tmp_path to find.
    shell_env = {**base_env, "SPAWN_PYTHON": sys.executable, "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    # Outside git it is the spawn.py of the current folder, as before.
    for cwd, found in ((repo / "src" / "pkg", repo.resolve() / "spawn.py"), (repo, repo.resolve() / "spawn.py"), (plain, Path("spawn.py"))):
        path = subprocess.run(["bash", "-c", f'printf %s "{script}"'], cwd=cwd, env=shell_env, capture_output=True, text=True, check=True)
        assert Path(path.stdout) == found
        ran = subprocess.run(["bash", "-c", f"{command} --version"], cwd=cwd, env=shell_env, capture_output=True, text=True, check=False)
        assert ran.returncode == spawn.ExitCode.OK, ran.stderr
        assert ran.stdout == f"spawn.py {spawn.__version__}\n"

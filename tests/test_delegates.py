"""The definitions a briefing lists: read without YAML where spawn.py can, and always what YAML reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import SPAWN, run_python

import spawn


def empty_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A project with an empty .claude/agents (so no folder above is searched) and a HOME with none."""
    project = tmp_path / "project"
    (project / ".claude" / "agents").mkdir(parents=True)
    home = tmp_path / "home"
    home.mkdir()
    return project, {"HOME": str(home)}


def test_builtin_delegates_are_what_load_definitions_reads_with_yaml(tmp_path: Path) -> None:
    project, environ = empty_project(tmp_path)
    definitions, problems = spawn.load_definitions(project, environ)
    assert not [p for p in problems if p.severity == "error"]
    with_yaml = [(d.name, d.description) for d in definitions.values()]
    assert len(with_yaml) == 8
    assert spawn.builtin_delegates() == tuple(with_yaml)
    assert spawn.delegates_in(project, environ) == with_yaml


def test_a_definition_file_anywhere_is_read_with_yaml(tmp_path: Path) -> None:
    project, environ = empty_project(tmp_path)
    (project / ".claude" / "agents" / "explore.md").write_text('---\nname: explore\ndescription: "Mine: \\"quoted\\""\n---\nBody.\n')
    (Path(environ["HOME"]) / ".claude" / "agents" / "sub").mkdir(parents=True)
    (Path(environ["HOME"]) / ".claude" / "agents" / "sub" / "mine.md").write_text("---\nname: mine\ndescription: yes\n---\n")
    got = dict(spawn.delegates_in(project, environ))
    assert got["explore"] == 'Mine: "quoted"'  # the project's file overrides the built-in
    assert got["mine"] == "True"  # YAML 1.1's yes, as load_definitions reads it
    assert len(got) == 9


def test_a_root_that_may_spawn_lists_the_builtins_without_importing_yaml(tmp_path: Path) -> None:
    """~30 ms of CPU before the root's CLI could start, at every level that may spawn."""
    project, environ = empty_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE"))}
    env.update(environ, SPAWN_SESSION_ROOT=str(tmp_path / "sessions"), CLAUDE_CONFIG_DIR=str(tmp_path / "home" / ".claude"))
    args = ["-X", "importtime", str(SPAWN), "--dry-run", "--task", "t", "--tools", "Bash,Read", "--max-depth", "2"]
    proc = run_python(args, env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    briefing = str(json.loads(proc.stdout)["briefing"])
    assert "explore: Read-only exploration" in briefing
    assert "code-reviewer: Review: critique a diff" in briefing
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "yaml" not in imported

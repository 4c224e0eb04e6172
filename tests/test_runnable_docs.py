"""The docs' shell commands, run as written against the scripted model.

A fenced shell block in README.md or docs/*.md is run when an HTML comment on
the line before its fence marks it (docs/testing.md#runnable-docs):

    <!-- runnable -->                      every command, in order; the block ends with status 0
    <!-- runnable; exit 2 -->              ... ends with status 2 (a documented refusal)
    <!-- runnable; skip uvx nox: REASON --> ... except the lines that start with `uvx nox`
    <!-- not runnable: REASON -->          not run, and says why
    <!-- file graph.yaml -->               (before any fence) its text becomes graph.yaml

A document's blocks run in one fresh project folder, in the document's order,
each as one bash script (`set -e`), so a file a block makes (not a variable) is
there for the next. `spawn.py`, `uv run X.py` and `python3` run this checkout's
spawn.py and tools/ with the test interpreter; every other uv command is uv's.
Every shell block of README.md and docs/cli.md must carry a mark.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import mock_model as mock_model_module
import pytest
from conftest import FAKE_API_KEY, ROOT, MockModel, without_nox

SHELLS = ("bash", "sh", "shell", "console")
MARK = re.compile(r"<!--\s*(runnable|not runnable|file)\b(.*?)-->", re.DOTALL)
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
MUST_BE_MARKED = ("README.md", "docs/cli.md")
# What a project folder of a user holds: links to this checkout's files.
PROJECT_LINKS = ("spawn.py", "spawn.py.lock", "pyproject.toml", "README.md", "src", "tools", "schemas", "workflows", "docs")
# The documented tasks that ask for a --schema: the scripted model answers them
# with the smallest output that schema takes. Any other task is answered "ok".
SCHEMA_TASKS = {"Research auth patterns": "findings", "Summarize src/auth": "summary", "Write the report for": "summary"}


@pytest.fixture
def docs_model(tmp_path: Path) -> Iterator[MockModel]:
    rules = []
    for task, schema in SCHEMA_TASKS.items():
        example = mock_model_module.schema_example(json.loads((ROOT / "schemas" / f"{schema}.json").read_text()))
        rules.append({"match": re.escape(task), "steps": [{"structured": example}]})
    with mock_model_module.serve(tmp_path, {"rules": rules}) as served:
        yield served


@dataclass
class Block:
    """One fenced block of a document and its mark."""

    doc: str
    line: int
    language: str
    text: str
    mark: str | None = None
    """runnable, not runnable, file, or None (unmarked)."""
    detail: str = ""
    exit: int = 0
    skips: list[tuple[str, str]] = field(default_factory=list)
    """(line prefix, reason) of the commands a runnable block leaves out."""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def parse_mark(block: Block, comment: re.Match[str]) -> None:
    block.mark, rest = comment.group(1), comment.group(2).strip()
    if block.mark == "runnable":
        for clause in filter(None, (c.strip() for c in rest.split(";"))):
            if m := re.fullmatch(r"exit (\d+)", clause):
                block.exit = int(m.group(1))
            elif m := re.fullmatch(r"skip (.+?): (.+)", clause, re.DOTALL):
                block.skips.append((m.group(1).strip(), m.group(2).strip()))
            else:
                raise AssertionError(f"{block.where}: unknown clause {clause!r} in a runnable mark")
    else:
        block.detail = rest.lstrip(":").strip()


def blocks_of(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    found = []
    for fence in FENCE.finditer(text):
        body = fence.group(3)
        if fence.group(1):  # a fence indented in a list item: its lines are indented too
            body = "\n".join(line.removeprefix(fence.group(1)) for line in body.splitlines()) + "\n"
        block = Block(doc, text.count("\n", 0, fence.start()) + 1, fence.group(2), body)
        before = text[: fence.start()].rstrip().splitlines()
        if before and (comment := MARK.fullmatch(before[-1].strip())):
            parse_mark(block, comment)
        found.append(block)
    return found


def documents() -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def runnable_documents() -> list[str]:
    return [doc for doc in documents() if any(b.mark == "runnable" for b in blocks_of(doc))]


def test_every_shell_block_of_readme_and_cli_md_is_marked() -> None:
    unmarked = [b.where for doc in MUST_BE_MARKED for b in blocks_of(doc) if b.language in SHELLS and b.mark is None]
    assert not unmarked, f"mark these blocks runnable, or say why they can't run offline (docs/testing.md): {unmarked}"


def test_every_mark_is_well_formed() -> None:
    for doc in documents():
        for b in blocks_of(doc):
            if b.mark == "not runnable":
                assert len(b.detail) > 10, f"{b.where}: say why it can't run offline"
            if b.mark == "runnable":
                assert b.language in SHELLS, f"{b.where}: a runnable block is a shell block"
            if b.mark == "file":
                assert re.fullmatch(r"[\w.\-/]+", b.detail), f"{b.where}: <!-- file NAME --> names a relative path"


def shims(folder: Path) -> Path:
    """spawn.py, spawn, uv and python3 as a user's shell has them, for this checkout and interpreter."""
    real_uv = shutil.which("uv")
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    py = sys.executable
    scripts = {
        "spawn.py": f'#!/bin/sh\nexec "{py}" "{ROOT / "spawn.py"}" "$@"\n',
        "spawn": f'#!/bin/sh\nexec "{py}" "{ROOT / "spawn.py"}" "$@"\n',
        "python3": f'#!/bin/sh\nexec "{py}" "$@"\n',
        # `uv run [-q|--quiet|--script] X.py ARGS`: the test interpreter has every script's dependencies.
        "uv": (
            '#!/bin/sh\nif [ "$1" = run ]; then\n  shift\n'
            '  while case "$1" in -q|--quiet|--script|--no-project) true;; *) false;; esac; do shift; done\n'
            '  case "$1" in *.py) exec "' + py + '" "$@";; esac\n  set -- run "$@"\nfi\n'
            f'exec "{real_uv}" "$@"\n'
        ),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def script_of(block: Block) -> str:
    lines, skipping = [], False
    for line in block.text.splitlines():
        skip = skipping or any(line.lstrip().startswith(prefix) for prefix, _ in block.skips)
        skipping = skip and line.rstrip().endswith("\\")  # a skipped command's continuation lines
        if not skip:
            lines.append(line)
    return "set -e\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("doc", runnable_documents())
def test_the_runnable_commands_of_a_document_run(doc: str, base_env: dict[str, str], docs_model: MockModel, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in PROJECT_LINKS:
        (project / name).symlink_to(ROOT / name)
    env = {
        **base_env,
        "PATH": f"{shims(tmp_path)}{os.pathsep}{base_env['PATH']}",
        "ANTHROPIC_BASE_URL": docs_model.url,
        "ANTHROPIC_API_KEY": FAKE_API_KEY,
        # What the briefing's commands name: an agent's Bash has them set.
        "SPAWN_PYTHON": sys.executable,
        "SPAWN_PY": str(ROOT / "spawn.py"),
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
    }
    env = without_nox(env)  # a bare `uv venv` under nox's variables would aim at the tests' venv
    ran = 0
    for block in blocks_of(doc):
        if block.mark == "file":
            target = project / block.detail
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        if block.mark != "runnable":
            continue
        proc = subprocess.run(
            ["bash", "-c", script_of(block)], cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == block.exit, (
            f"{block.where} ended {proc.returncode}, not {block.exit}:\n{block.text}\nstderr: {proc.stderr[-3000:]}"
        )
        ran += 1
    assert ran

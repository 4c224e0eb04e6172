"""The command lines of P1 (the depth-3 chains), P2 (the single agents) and the start-up profile, built once per run."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from mock_model import mock_task, spawn_in_bash

from .core import LEAF_STEPS, SPAWN


def spawn_with_uv(*args: str) -> str:
    """The same child started as users write it: `uv run spawn.py` (the source, whatever SPAWN_PY names)."""
    return "uv run " + shlex.join([str(SPAWN), *args])


def bare_argv(cli: Path, task: str, tools: str | None) -> list[str]:
    argv = [str(cli), "-p", task, "--output-format", "json"]
    if tools is not None:
        argv += ["--tools", tools, "--allowedTools", tools]
    return argv


@dataclass(frozen=True)
class Commands:
    """Every measured command line; built once so each round runs the same ones."""

    spawn_chain: list[str]
    uv_chain: list[str]
    bare_chain: list[str]
    spawn_leaf: list[str]
    bare_leaf: list[str]
    bare_leaf_read: list[str]
    python_start: list[str]
    import_sdk: list[str]
    spawn_dry_run: list[str]
    cli_version: list[str]
    compare_chain: list[str] | None = None
    """spawn_chain through the --compare script: its children follow it, as $SPAWN_PY names the script that started them."""
    compare_leaf: list[str] | None = None

    @classmethod
    def build(cls, cli: Path, compare: Path | None = None) -> Commands:
        py, spawn = sys.executable, str(SPAWN)
        # Same scripts on both sides: root and middle run one Bash command and
        # then answer, the leaf answers at once; 5 model turns in all. Root and
        # middle hold Read too: spawn.py refuses a child tools its parent lacks.
        s_leaf = mock_task("bench chain leaf", LEAF_STEPS)
        s_mid = mock_task("bench chain middle", [{"bash": spawn_in_bash("--task", s_leaf, "--tools", "Read")}, {"text": "middle-result"}])
        s_root = mock_task("bench chain root", [{"bash": spawn_in_bash("--task", s_mid, "--tools", "Bash,Read")}, {"text": "root-result"}])
        u_mid = mock_task("bench chain middle", [{"bash": spawn_with_uv("--task", s_leaf, "--tools", "Read")}, {"text": "middle-result"}])
        # The middle unsandboxed, so that uv itself starts every level: in a sandbox `uv` is spawn.py's
        # shim (uv can't open its read-only cache there), which runs "$SPAWN_PYTHON" "$SPAWN_PY" at once.
        u_spawn = spawn_with_uv("--task", u_mid, "--tools", "Bash,Read", "--sandbox", "off")
        u_root = mock_task("bench chain root", [{"bash": u_spawn}, {"text": "root-result"}])
        b_leaf = mock_task("bench chain leaf", LEAF_STEPS)
        b_mid = mock_task("bench chain middle", [{"bash": shlex.join(bare_argv(cli, b_leaf, "Read"))}, {"text": "middle-result"}])
        b_root = mock_task("bench chain root", [{"bash": shlex.join(bare_argv(cli, b_mid, "Bash,Read"))}, {"text": "root-result"}])
        # One task text for both single-agent runs, so request bytes compare like for like.
        leaf = mock_task("bench single leaf: answer briefly", LEAF_STEPS)
        return cls(
            spawn_chain=[py, spawn, "--task", s_root, "--tools", "Bash,Read", "--max-depth", "3"],
            uv_chain=["uv", "run", spawn, "--task", u_root, "--tools", "Bash,Read", "--max-depth", "3"],
            bare_chain=bare_argv(cli, b_root, "Bash,Read"),
            spawn_leaf=[py, spawn, "--task", leaf, "--tools", "Read"],
            bare_leaf=bare_argv(cli, leaf, None),  # the CLI's default tools and system prompt (P2)
            bare_leaf_read=bare_argv(cli, leaf, "Read"),  # the same tools as spawn_leaf (its time)
            python_start=[py, "-c", "pass"],
            import_sdk=[py, "-c", "import claude_agent_sdk"],
            spawn_dry_run=[py, spawn, "--dry-run", "--task", leaf, "--tools", "Read"],
            cli_version=[str(cli), "--version"],
            compare_chain=None if compare is None else [py, str(compare), "--task", s_root, "--tools", "Bash,Read", "--max-depth", "3"],
            compare_leaf=None if compare is None else [py, str(compare), "--task", leaf, "--tools", "Read"],
        )

"""P1s (issue 35): the depth-3 chain as users start it, every level `uv run spawn.py --schema`, against
`claude -p --json-schema`; its command lines, its check and its stages.
"""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mock_model import mock_task

import spawn

from .commands import bare_argv
from .core import SPAWN, BenchError, Proc, last_json_line

# Issue 35: P1 the way users start a tree. Every level is `uv run spawn.py
# ... --schema NAME`, against bare `claude -p --json-schema` given the schema
# as spawn.py gives it to the CLI, so both sides pay the CLI's structured
# output and spawn.py also its own validation. Every level answers through the
# StructuredOutput tool, which ends a CLI's run at once: 5 model turns, as P1.
SCHEMA_CHAIN_SCHEMA = "findings"  # a shipped schema, by name, as users give it


# The chain's wall time cut at the model requests the mock logs (in order:
# root, middle, leaf, middle, root), so the two sides compare stage by stage.
CHAIN_SEGMENTS = (
    "launch -> root's 1st request",
    "root's Bash -> middle's 1st request",
    "middle's Bash -> leaf's request",
    "leaf's answer -> middle's 2nd request",
    "middle's answer -> root's 2nd request",
    "root's answer -> exit",
)


CHAIN_CPU = "CPU of the whole tree (user + system)"  # after the stages in each run's row


def schema_answer(level: str) -> dict[str, Any]:
    """What a level of the schema chain answers (valid under SCHEMA_CHAIN_SCHEMA)."""
    return {"summary": f"{level}-result", "findings": []}


@dataclass(frozen=True)
class SchemaChain:
    """One side of P1s: the root's command line, and where its stdout carries the answer."""

    key: str
    label: str
    argv: list[str]
    answer_field: str
    """"output" in spawn.py's result, "structured_output" in claude -p's."""


def schema_chains(cli: Path, compare: Path | None) -> list[SchemaChain]:
    """P1s's chains: uv run spawn.py --schema at every level, bare claude -p --json-schema, and the --compare script's."""

    def uv_level(script: Path, task: str, tools: str, *extra: str, sandbox: bool = False) -> list[str]:
        # Unsandboxed like the bare side, so uv itself starts every level (in a sandbox `uv` is
        # spawn.py's shim), and a sandbox's start-up (bwrap, its proxy) is not counted as spawn.py's.
        # sandbox: the default configuration instead, the middle sandboxed and spawning through its broker.
        argv = ["uv", "run", str(script), "--task", task, "--tools", tools, *extra, "--schema", SCHEMA_CHAIN_SCHEMA]
        return argv if sandbox else [*argv, "--sandbox", "off"]

    def chain(level: Callable[[str, str], list[str]], *root_extra: str) -> list[str]:
        leaf = mock_task("bench schema chain leaf", [{"structured": schema_answer("leaf")}])
        mid_steps: list[dict[str, Any]] = [{"bash": shlex.join(level(leaf, "Read"))}, {"structured": schema_answer("middle")}]
        mid = mock_task("bench schema chain middle", mid_steps)
        root_steps: list[dict[str, Any]] = [{"bash": shlex.join(level(mid, "Bash,Read"))}, {"structured": schema_answer("root")}]
        return [*level(mock_task("bench schema chain root", root_steps), "Bash,Read"), *root_extra]

    schema = spawn.schema_for_cli(json.loads((SPAWN.parent / "schemas" / f"{SCHEMA_CHAIN_SCHEMA}.json").read_text()))

    def bare(task: str, tools: str) -> list[str]:
        return [*bare_argv(cli, task, tools), "--json-schema", json.dumps(schema)]

    chains = [
        SchemaChain(
            "uv_schema_chain",
            "uv run spawn.py --schema depth-3 chain",
            chain(lambda task, tools: uv_level(SPAWN, task, tools), "--max-depth", "3"),
            "output",
        ),
        SchemaChain("bare_schema_chain", "claude -p --json-schema depth-3 chain", chain(bare), "structured_output"),
        SchemaChain(
            "sandboxed_schema_chain",
            "uv run spawn.py --schema, default sandbox depth-3 chain",
            chain(lambda task, tools: uv_level(SPAWN, task, tools, sandbox=True), "--max-depth", "3"),
            "output",
        ),
    ]
    # A budget at the root puts the whole tree behind its model gateway (docs/cost.md): what that costs a chain.
    budget = ("--max-depth", "3", "--max-budget-usd", "5")
    chains.append(
        SchemaChain(
            "budget_schema_chain",
            "uv run spawn.py --schema, --max-budget-usd (the tree's gateway) depth-3 chain",
            chain(lambda task, tools: uv_level(SPAWN, task, tools), *budget),
            "output",
        )
    )
    if compare is not None:
        other = chain(lambda task, tools: uv_level(compare, task, tools), "--max-depth", "3")
        chains.insert(1, SchemaChain("compare_uv_schema_chain", "--compare: uv run spawn.py --schema chain", other, "output"))
        other = chain(lambda task, tools: uv_level(compare, task, tools), *budget)
        label = "--compare: uv run spawn.py --schema, --max-budget-usd chain"
        chains.append(SchemaChain("compare_budget_schema_chain", label, other, "output"))
    return chains


def check_structured(chain: SchemaChain, proc: Proc) -> None:
    """A chain counts only if the root exited 0 with the root's structured answer."""
    if proc.returncode != 0:
        raise BenchError(f"{chain.label} exited {proc.returncode}; stderr: {proc.stderr[-800:]}")
    got = last_json_line(proc.stdout).get(chain.answer_field)
    if got != schema_answer("root"):
        raise BenchError(f"{chain.label} answered {got!r}, expected {schema_answer('root')!r}; stdout: {proc.stdout[-500:]}")


def chain_segments(proc: Proc, main: Sequence[Mapping[str, Any]]) -> list[float]:
    """The run's wall time cut at its model requests (CHAIN_SEGMENTS), in seconds; a CLI's retry is not a cut."""
    times = sorted(float(r["time"]) for r in main if not (r.get("retry") or 0))
    marks = [proc.started, *times, proc.ended]
    return [b - a for a, b in itertools.pairwise(marks)]

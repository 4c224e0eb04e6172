"""Siblings share the prompt cache: what differs between agents goes after the cached head.

Against the scripted model, which keeps the Messages API's prompt cache and
logs each request's body (--log-bodies): tools and system prompt are what the
CLI marks for caching, so two agents with the same tools, definition and
depth must send them byte for byte; their own facts (id, deadline, time left,
budget) ride in their first message, after the task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mock_model as mm
import pytest
from conftest import MockModel, metas, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records

import spawn


@pytest.fixture
def logged_model(tmp_path: Path) -> Iterator[MockModel]:
    """The scripted model, logging whole request bodies."""
    with mm.serve(tmp_path, flags=["--log-bodies"]) as served:
        yield served


@pytest.fixture
def logged_env(base_env: dict[str, str], logged_model: MockModel) -> dict[str, str]:
    return {**base_env, "ANTHROPIC_BASE_URL": logged_model.url, "ANTHROPIC_API_KEY": "sk-test-not-a-key"}


def first_message_text(request: dict[str, Any]) -> str:
    return mm.task_text(request["body"]["messages"])


def last_user_text(request: dict[str, Any]) -> str:
    users = [m for m in request["body"]["messages"] if m.get("role") == "user"]
    return mm.task_text(users[-1:])


def leaf_firsts(model: MockModel) -> list[dict[str, Any]]:
    """First main-loop requests of the agents without Bash (the leaves), oldest first."""
    found = [r for r in model.requests() if r["kind"] == "main" and r["first"] and r["status"] == 200 and "Bash" not in r["tools"]]
    return sorted(found, key=lambda r: r["time"])


def test_siblings_send_byte_identical_tools_and_system_prompts(
    logged_env: dict[str, str], session_root: Path, logged_model: MockModel
) -> None:
    # Two leaves of one parent, same tools and depth, started a second apart with
    # other budgets and timeouts: other ids, deadlines, time left and budget lines.
    leaf = mock_task("sibling leaf", [{"text": "leaf done"}])
    first = spawn_in_bash("--task", leaf, "--tools", "Read", "--max-budget-usd", "0.3", "--timeout", "500")
    second = spawn_in_bash("--task", leaf, "--tools", "Read", "--max-budget-usd", "0.2", "--timeout", "400")
    root = mock_task("siblings root", [{"bash": f"{first} >/dev/null && sleep 1 && {second} >/dev/null"}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "1", "--max-budget-usd", "1"], logged_env, timeout=240)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    leaves = {m["id"]: m for m in metas(session_root).values() if m["depth"] == 1}
    assert len(leaves) == 2

    a, b = leaf_firsts(logged_model)
    assert json.dumps(a["body"]["tools"]) == json.dumps(b["body"]["tools"])
    assert json.dumps(a["body"]["system"]) == json.dumps(b["body"]["system"])
    assert a["system_digest"] == b["system_digest"] and a["tools_digest"] == b["tools_digest"]
    # So the later sibling reads the head the first one wrote.
    assert b["usage"]["cache_read_input_tokens"] >= b["head_tokens"] > 0
    assert a["usage"]["cache_read_input_tokens"] < a["head_tokens"]

    # Nothing it is told is lost: its own facts follow its task in its first message.
    for request in (a, b):
        text = first_message_text(request)
        (agent_id,) = [i for i in leaves if f"You are agent {i}." in text]
        meta = leaves[agent_id]
        assert text.index("sibling leaf MOCK[") < text.index(spawn.AGENT_FACTS_HEADER)
        assert f"Budget: ${meta['max_budget_usd']:.4f} for you and any children." in text
        assert "Deadline: " in text and " s from now); finish before it." in text
        system = json.dumps(request["body"]["system"])
        assert agent_id not in system and "Deadline" not in system and "Budget:" not in system
        assert "## spawn.py briefing" in system and "at depth 1 (max depth 1)" in system

    # Cost shows where people look: cache reads and writes beside input and output.
    session = Path(next(iter(leaves.values()))["session"])
    later = next(i for i in leaves if f"You are agent {i}." in first_message_text(b))
    charges = {c["id"]: c for c in map(json.loads, (session / "ledger.jsonl").read_text().splitlines()) if c.get("kind") == "charge"}
    assert charges[later]["usage"]["cache_read_input_tokens"] >= b["head_tokens"]
    assert all(c["usage"]["cache_creation_input_tokens"] > 0 for c in charges.values())
    status = stdout_json(run_spawn(["status", str(session), "--json"], logged_env))
    rows = {r["id"]: r for r in status["agents"]}
    assert rows[later]["usage"] == charges[later]["usage"]
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert status["tokens"][key] == sum(r["usage"][key] for r in rows.values())
    lines = run_spawn(["status", str(session)], logged_env).stdout.splitlines()
    assert lines[2] == "tokens: " + ", ".join(
        f"{name} {status['tokens'][key]:,}"
        for key, name in (
            ("input_tokens", "input"),
            ("output_tokens", "output"),
            ("cache_read_input_tokens", "cache read"),
            ("cache_creation_input_tokens", "cache write"),
        )
    )
    validate_records(session_root)


def test_a_resumed_agent_gets_its_new_facts_in_its_new_message(
    logged_env: dict[str, str], session_root: Path, logged_model: MockModel
) -> None:
    first = stdout_json(
        run_spawn(["--task", mock_task("remember 42", [{"text": "first"}, {"text": "second"}]), "--tools", "Read"], logged_env)
    )
    resumed = stdout_json(run_spawn(["--resume", first["id"], "--task", "what was it?"], logged_env))
    assert resumed["output"] == "second", resumed
    main = [r for r in logged_model.requests() if r["kind"] == "main" and r["status"] == 200]
    original, again = main[0], main[-1]
    assert f"You are agent {first['id']}." in first_message_text(again)  # the conversation it continues
    new_message = last_user_text(again)
    assert new_message.startswith("what was it?") and f"You are agent {resumed['id']}." in new_message
    # The same system prompt: the resumed conversation reads the original's cached head.
    assert again["system_digest"] == original["system_digest"]
    assert again["usage"]["cache_read_input_tokens"] >= again["head_tokens"]
    validate_records(session_root)


def test_dry_run_shows_where_each_part_of_the_prompt_goes(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--dry-run", "--task", "Say hello", "--max-budget-usd", "0.5", "--timeout", "60"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = json.loads(proc.stdout)
    assert resolved["prompt_layout"] == {"system": ["system_prompt", "briefing"], "first_message": ["task", "agent_facts"]}
    assert "Deadline" not in resolved["briefing"] and "Budget" not in resolved["briefing"]
    facts = resolved["agent_facts"]
    assert facts.startswith(spawn.AGENT_FACTS_HEADER) and "Budget: $0.5000 for you and any children." in facts
    # The time left counts from the deadline --timeout set when the run started (a loaded machine takes seconds).
    left = re.search(r"\((\d+) s from now\)", facts)
    assert left is not None and 0 < int(left[1]) <= 60


def test_the_scripted_model_cuts_its_retry_key_at_spawns_facts_header() -> None:
    assert mm.AGENT_FACTS_HEADER == spawn.AGENT_FACTS_HEADER

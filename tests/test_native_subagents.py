"""Claude Code's own subagents (the Agent tool) as `native` children in the tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, agent_dirs, mock_task, run_spawn, validate_records


def test_agent_tool_subagent_is_a_native_child(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    sub = mock_task("Sub looks around", [{"text": "sub result"}])
    task = mock_task(
        "Delegate",
        [
            {"tool": "Agent", "input": {"description": "look around", "prompt": sub, "subagent_type": "general-purpose"}},
            {"text": "root done"},
        ],
    )
    proc = run_spawn(["--task", task, "--tools", "Agent,Read", "--timeout", "120"], env)
    assert proc.returncode == 0, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    lines = [json.loads(line) for line in (agent_dir / "native.jsonl").read_text().splitlines()]
    assert [line["event"] for line in lines] == ["start", "stop"]
    assert {line["agent_type"] for line in lines} == {"general-purpose"}
    assert lines[1]["last_message"] == "sub result" and Path(lines[1]["transcript_path"]).exists()
    validate_records(session_root)

    status = run_spawn(["status", "--json", str(agent_dir.parent.parent)], env)
    assert status.returncode == 0, status.stderr
    root_row, native_row = json.loads(status.stdout)["agents"]
    assert native_row["id"] == f"n-{lines[0]['agent_id']}" and native_row["kind"] == "native"
    assert native_row["parent_id"] == root_row["id"] and native_row["depth"] == 1 and native_row["state"] == "done"
    assert native_row["usage"]["input_tokens"] > 0
    # Its cost is inside the root's: the tree's total is the root's own, and known.
    assert root_row["subtree_cost_usd"] == pytest.approx(root_row["cost_usd"], abs=1e-6) and root_row["subtree_cost_known"]

    page = tmp_path / "timeline.svg"
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "view.py"), str(agent_dir.parent.parent), "--svg", "-o", str(page)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert page.read_text().count('class="bar"') == 2 and f'data-id="{native_row["id"]}"' in page.read_text()

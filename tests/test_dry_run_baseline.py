"""spawn.py's resolved options (--dry-run) for a fixed set of 20 command lines, held against a baseline.

The baseline (tests/data/dry_runs.json) was taken from the single-file
spawn.py before it was split into the package under src/: the bundle must
resolve every option as that file did. A change that means to alter what
--dry-run prints updates the baseline in the same commit:

    python tests/test_dry_run_baseline.py --update

What differs by run or by machine (ids, times, the checkout's and HOME's
paths, the compiled copy's name) is replaced by a placeholder first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
BASELINE = Path(__file__).resolve().parent / "data" / "dry_runs.json"

COMMAND_LINES: list[list[str]] = [
    ["--task", "Say hello"],
    ["--task", "Research auth patterns", "--tools", "Read,Grep,Bash", "--model", "medium-tier", "--max-depth", "3", "--schema", "findings"],
    ["--task", "hi", "--model", "high-tier", "--timeout", "120"],
    ["--task", "hi", "--model", "claude-haiku-4-5", "--tools", "Read", "--max-depth", "0"],
    ["--task", "Review the diff", "--agent", "code-reviewer"],
    ["--task", "fix the failing test in tests/test_x.py", "--agent", "auto"],
    ["--task", "hi", "--tools", "Read,Bash", "--allow", "Bash(git diff:*)", "--deny", "Read(./secrets/**)"],
    ["--task", "hi", "--tools", "Bash", "--ask", "Bash(rm:*)"],
    ["--task", "hi", "--max-budget-usd", "0.5", "--max-turns", "4", "--idle-timeout", "30"],
    ["--task", "hi", "--max-agents", "5", "--max-concurrent", "2", "--confirm-over", "1"],
    ["--task", "hi", "--background"],
    ["--task", "hi", "--tools", "Read,Bash", "--sandbox", "on"],
    ["--task", "hi", "--tools", "Read,Bash", "--sandbox", "off"],
    ["--task", "hi", "--schema", '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'],
    ["--task", "hi", "--system-prompt", "You are terse.", "--disallowed-tools", "Grep"],
    ["--task", "hi", "--preset", "claude_code", "--no-settings"],
    ["--task", "hi", "--agent", "command:/bin/echo"],
    ["--task", "hi", "--topic", "release notes", "--output", "out.json"],
    ["--task", "hi", "--schema", "no-such-schema"],
    ["--task", "hi", "--max-depth", "-1"],
]

# Fields that differ at every run: the trace, the clock.
VOLATILE = {"trace_id", "span_id", "traceparent", "started_at", "deadline"}


def normalize(text: str, home: Path) -> str:
    # Longest first: under nox the tests' tmp (and so HOME) lies inside the venv, inside the checkout.
    paths = {sys.executable: "<PYTHON>", sys.prefix: "<VENV>", str(ROOT): "<ROOT>", str(home): "<HOME>"}
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, paths[path])
    text = re.sub(r"spawn-[0-9a-f]{16}\.[\w-]+\.pyc", "spawn-<HASH>.pyc", text)
    text = re.sub(r"/python3\.\d+/", "/python3.X/", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)", "<TIME>", text)
    return re.sub(r"\(\d+ s from now\)", "(<N> s from now)", text)


def dry_run(args: list[str], home: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE"))}
    env.update(HOME=str(home), SPAWN_SESSION_ROOT=str(home / "sessions"), CLAUDE_CONFIG_DIR=str(home / ".claude"))
    proc = subprocess.run(
        [sys.executable, str(SPAWN), *args, "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    result: dict[str, Any] = {"exit": proc.returncode, "stderr": normalize(proc.stderr, home).strip()}
    if proc.stdout.strip():
        resolved = json.loads(proc.stdout)
        result["stdout"] = {k: v for k, v in json.loads(normalize(json.dumps(resolved), home)).items() if k not in VOLATILE}
    return result


@pytest.mark.parametrize("index", range(len(COMMAND_LINES)))
def test_dry_run_matches_the_baseline(index: int, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    expected = json.loads(BASELINE.read_text())[index]
    assert expected["args"] == COMMAND_LINES[index], "the baseline's command lines changed: run with --update"
    assert dry_run(COMMAND_LINES[index], home) == expected["result"]


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        rows = []
        for i, args in enumerate(COMMAND_LINES):
            home = Path(scratch) / f"h{i}"
            home.mkdir()
            rows.append({"args": args, "result": dry_run(args, home)})
    BASELINE.parent.mkdir(exist_ok=True)
    BASELINE.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    print(f"wrote {BASELINE}")

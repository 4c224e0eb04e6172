#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = []
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""An offline demo of a real agent tree: `uv run tools/demo.py`.

It starts the scripted model (tools/mock_model.py) on a loopback port and runs
spawn.py with the real claude CLI bundled in claude-agent-sdk. No API key, no
network, no cost. The tree:

    root            spawns two children in the background, waits for both
    ├── explorer    spawns a grandchild
    │   └── checker tries to go one level deeper: refused at the depth limit
    └── lister      answers with structured output (schemas/summary.json)

The scripted model chooses each agent's replies from rules matched against
its task (a scenario file). The session is left under sessions/ for you to
inspect: `uv run spawn.py status`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
sys.path.insert(0, str(ROOT / "tools"))
# Agents call spawn.py the way their briefing tells them (spawn_in_bash).
from mock_model import READ_ID, ServeError, serve, spawn_in_bash  # noqa: E402


def scenario() -> dict[str, Any]:
    """What the scripted model answers each agent, matched on its task."""
    explorer = spawn_in_bash("--background", "--task", "Explore the session protocol", "--tools", "Bash,Read")
    lister = spawn_in_bash("--background", "--task", "List the record schemas", "--tools", "Read", "--schema", "summary")
    fan_out = f"A=$({explorer} | {READ_ID}); B=$({lister} | {READ_ID}); {spawn_in_bash('wait')} $A $B --all"
    return {
        "rules": [
            {
                "match": "Survey",
                "steps": [
                    {"text": "I will split this in two and run both halves in parallel.", "bash": fan_out},
                    {"text": "Both children finished: the protocol is one directory per agent, and the schemas cover every record."},
                ],
            },
            {
                "match": "Explore",
                "steps": [
                    {"bash": spawn_in_bash("--task", "Check one record in depth", "--tools", "Bash,Read")},
                    {"text": "Each agent directory holds meta.json, outcome.json, a transcript and one marker."},
                ],
            },
            {
                "match": "Check",
                "steps": [
                    {"bash": spawn_in_bash("--task", "Go one level deeper", "--tools", "Read") + "; echo exit=$?"},
                    {"text": "A deeper spawn was refused at the depth limit (exit 4), as it should be."},
                ],
            },
            {"match": "List", "steps": [{"structured": {"summary": "meta, outcome, heartbeat, session, transcript-line"}}]},
            {"match": "Go one level deeper", "steps": [{"text": "This must never run: the spawn is refused first."}]},
        ]
    }


def spawn_argv() -> list[str]:
    """The root runs the way a user runs it: `uv run spawn.py` when uv is there."""
    uv = shutil.which("uv")
    return [uv, "run", "--quiet", "--script", str(SPAWN)] if uv else [sys.executable, str(SPAWN)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--session", metavar="DIR", help="session root (default $SPAWN_SESSION_ROOT, else sessions/ beside spawn.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spawn-demo-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        try:
            mock = stack.enter_context(serve(workdir, scenario()))
        except ServeError as exc:
            print(f"demo: error: {exc}", file=sys.stderr)
            return 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE"))}
        if os.environ.get("SPAWN_SESSION_ROOT"):  # where the user keeps sessions; the flag wins
            env["SPAWN_SESSION_ROOT"] = os.environ["SPAWN_SESSION_ROOT"]
        env.update(
            ANTHROPIC_BASE_URL=mock.url,
            ANTHROPIC_API_KEY="offline-demo-key",  # any string: the scripted model ignores it
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            HOME=str(workdir),  # the CLI keeps its state here, not in your home
            CLAUDE_CONFIG_DIR=str(workdir / ".claude"),
        )
        if args.session:
            env["SPAWN_SESSION_ROOT"] = str(Path(args.session).resolve())
        command = [*spawn_argv(), "--task", "Survey how spawn.py records an agent tree", "--tools", "Bash,Read", "--max-depth", "2"]
        print(f"$ {' '.join(shlex.quote(c) for c in command)}", file=sys.stderr)
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        print(run.stderr, end="", file=sys.stderr)
        if not run.stdout.strip():
            print(f"demo: error: spawn.py printed nothing (exit {run.returncode})", file=sys.stderr)
            return 1
        result = json.loads(run.stdout)
        print("\nroot agent's stdout (what a parent would read):")
        print(json.dumps(result, indent=2))
        print()
        status = subprocess.run(
            [*spawn_argv(), "status", str(Path(result["agent_dir"]).parent.parent)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        print(status.stdout, end="")
        print(status.stderr, end="", file=sys.stderr)
        print(f"\nInspect it: uv run spawn.py status {Path(result['agent_dir']).parent.parent}")
        return run.returncode


if __name__ == "__main__":
    sys.exit(main())

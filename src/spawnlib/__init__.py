#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = [
#     "a2a-sdk>=1.3,<2",
#     "claude-agent-sdk>=0.2.180,<0.3",
#     "jsonschema>=4.23,<5",
#     "psutil>=6,<8",
#     "pyyaml>=6,<7",
# ]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py: run Claude agents that can start their own children, to any depth.

One self-contained script. Copy it next to your project and run::

    uv run spawn.py --task "Research auth patterns" --tools Read,Grep,Bash \\
        --model medium-tier --max-depth 3 --schema findings --output result.json

The agent runs through the claude-agent-sdk package. It sees only the tools it
was given, and its answer is validated against a JSON Schema. From its own Bash
tool it can run the same command to start children, which can start theirs.

Every agent lives in a directory on disk (the session protocol, documented in
sessions/README.md): who it is (meta.json), what happened (outcome.json), the
transcript, the CLI's stderr, and exactly one marker, ``.done`` or ``.fail``.

Verbs: ``wait``, ``status``, ``kill``, ``reap``, ``approve``, ``deny`` and
``agents`` read and act on that protocol; ``spawn.py VERB --help`` describes
each. ``--agent NAME`` runs a Claude Code agent definition from
.claude/agents; ``--agent a2a:URL`` a remote A2A agent and ``--agent
command:EXE`` an executable, as nodes of the same tree (the executors
section); ``--allow/--deny/--ask`` take Claude Code's permission rules.
``dag run FILE`` runs a task graph (blockedBy) as children of one runner agent;
``plan``, ``build``, ``explore``, ``run-plan-build`` and ``run-all`` run the
shipped workflows over a shared state file.
"""

from __future__ import annotations

__version__ = "0.1.0"

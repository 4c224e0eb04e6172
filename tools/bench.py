#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = [
#     "claude-agent-sdk>=0.2.180,<0.3",
#     "jsonschema>=4.23,<5",
#     "psutil>=6,<8",
# ]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""Side-by-side figures for spawn.py against the scripted model, in one run.

What it measures (every model reply comes from tools/mock_model.py, which this
script starts on 127.0.0.1, so runs are offline, free and deterministic):

1. Depth-3 chain wall time: ``spawn.py`` root -> child -> grandchild, each
   level's Bash running the command the briefing gives agents
   (``"$SPAWN_PYTHON" "$SPAWN_PY" --task ... --tools ...``), versus the same
   chain of bare ``claude -p`` processes with the same scripts, levels and
   model turns. Target: spawn/bare <= 1.35x in the default configuration,
   where the middle is sandboxed and spawns through its runner's broker, and
   <= 1.2x with ``--sandbox off`` (P1, below). When ``uv`` on
   PATH is a version manager's shim, the uv chain runs the binary behind it
   (find_uv), and both per-call costs are printed.
   A start-up profile says where spawn.py's time goes: Python start-up,
   ``import claude_agent_sdk``, ``spawn.py --dry-run`` (start-up without the
   SDK), ``claude --version`` (CLI start), and one single-agent spawn.py run
   against one bare ``claude -p`` run with the same tools (``--tools Read``),
   split into launch -> first model request and last model request -> exit.
2. Bytes of a leaf agent's first model request (mock log, ``kind == "main"``
   and ``first``): spawn.py leaf with ``--tools Read`` versus a default
   ``claude -p`` (CLI default tools and system prompt), same task.
   Target: spawn/bare <= 0.15x. Split into parts: tool definitions, system
   prompt (of which spawn.py's briefing, from ``--dry-run``) and messages.
3. ``spawn.py wait`` latency: a background agent whose model answers after a
   scripted 2 s sleep, ``wait ID`` started right after the launch (so its own
   Python start-up is over before the outcome exists), timed from the
   ``.done`` marker's mtime to the moment the wait process has exited.
   Target: median <= 100 ms.

4. ``spawn.py dag run`` overhead: a 3-level, 8-task graph of trivial agents
   (one text reply each) against the same eight ``spawn.py`` agents started
   by hand in the ideal order (each level all at once, the next when it has
   ended). Reported, no target; ``--dag-rounds 0`` skips it.

5. Issue #14's targets, printed as one table with the commands used: P1 (the
   chain above, and the same chain with every level ``uv run spawn.py``),
   P1b (``--fanout`` background leaves from one parent and ``wait --all``,
   against as many bare ``claude -p`` in parallel, with the summed peak RSS
   of the Python side; ``--fanout-rounds`` rounds, default 3, each reversing
   the order of the sides, medians reported), P2 (above), P6 (the Python side's summed peak PSS
   with ``--memory-agents`` concurrent agents, with and without the fork
   server, against the bare tree). P3, P5 and P7 are printed by waitperf_report.

6. ``--compare PATH``: P1's ``"$SPAWN_PYTHON" "$SPAWN_PY"`` chain and P1b's
   fan-out run a third time through another copy of spawn.py, in the same
   rounds, beside this one's (issue 32: old against new, within 5%).
   ``--only-chains`` runs P1 and P1b alone.

7. P1s (issue 35): the depth-3 chain as users start it, every level
   ``uv run spawn.py ... --schema findings``, against bare ``claude -p
   --json-schema`` with the schema spawn.py gives the CLI; every level answers
   through StructuredOutput; every level ``--sandbox off`` (<= 1.2x), and again
   in the default configuration (<= 1.35x). Both chains' wall time is also cut at the model
   requests the mock logs (launch -> root's first request, root's Bash ->
   middle's first request, ...), so the stages compare side by side.
   ``--only-schema-chain`` runs it alone (with ``--compare``, the other
   script's uv chain too).
8. P8 (tools/bench_cost.py, read in docs/prompt-cache.md): the input cost at list prices of the
   ``--cost-leaves`` fan-out and the depth-3 chain, with the prompt cache modelled, against
   the ``--cost-baseline`` spawn.py's prompt layout and bare ``claude -p``.

Measurements 1 and 2 run interleaved, ``--repeat`` rounds (default 5; each round reverses
the order of the previous one so drift hits both sides alike); medians are
reported. Nothing fails by default: each target is printed with whether it
was met; ``--check`` makes a missed target exit 1.

The measurements live in tools/benchlib/, a module per row or concern (core,
runs, fanout, waitperf, report, main, ...); this file is the entry.

Run (the interpreter must have spawn.py's dependencies, as nox's bench has)::

    uv run tools/bench.py [--repeat 5] [--wait-samples 10] [--json out.json]
    uvx nox -s bench -- --json bench.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # spawn.py and the scripted model are imported, not copied
sys.path.insert(0, str(ROOT / "tools"))  # and benchlib, bench_cost beside this file

from benchlib.main import main as run  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv, description=__doc__.split("\n\n")[0] if __doc__ else None)


if __name__ == "__main__":
    sys.exit(main())

"""P1b and P6: background leaves from one spawn.py parent against as many bare `claude -p` in parallel, timed and with memory sampled."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mock_model import mock_task, spawn_in_bash

from .clocks import children_cpu
from .commands import bare_argv
from .core import LEAF_TEXT, SPAWN, BenchError, Proc, check_agent_result, check_turns, median
from .memory import MemorySampler, TreeMemory
from .runs import Bench


def fanout_script(count: int, leaf_steps: Sequence[Mapping[str, Any]], leaf_tools: str = "Read") -> str:
    """A parent's Bash: start `count` leaves with --background at once, then `wait` for all of them."""
    leaf = shlex.quote(f"MOCK{json.dumps(list(leaf_steps))}MOCK")
    start = spawn_in_bash("--tools", leaf_tools, "--background", "--print", "id")
    return (
        f'd=$(mktemp -d); for i in $(seq {count}); do {start} --task "fan-out leaf $i "{leaf} > "$d/$i" & done; wait; '
        f'{spawn_in_bash("wait", "--all")} $(cat "$d"/*) > /dev/null'
    )


@dataclass
class FanOut:
    """One side-by-side fan-out: a spawn.py parent starting `count` background leaves vs `count` bare claude -p."""

    count: int
    spawn_s: float
    bare_s: float
    spawn_memory: TreeMemory
    bare_memory: TreeMemory
    commands: list[str]
    spawn_cpu_s: float = math.nan
    """CPU (user + system) of the whole spawn.py tree, as its processes were reaped."""
    bare_cpu_s: float = math.nan
    no_slots_s: float = math.nan
    """The same spawn.py fan-out with SPAWN_START_SLOTS=0 (every CLI start-up at once), for the lever's saving."""
    round_ratios: list[float] = field(default_factory=list)
    """spawn/bare of each round, when the figures are medians of rounds (fanout_rounds)."""
    compare_s: float = math.nan
    """The same spawn.py side through the --compare script."""
    compare_cpu_s: float = math.nan
    compare_rounds_s: list[tuple[float, float]] = field(default_factory=list)
    """(this spawn.py, --compare) wall times of each round."""
    leaf_tools: str = "Read"
    """The leaves' tools, on both sides: with Bash, spawn.py's leaves run sandboxed."""
    bare_sandbox: bool = False
    """The bare leaves ran with Claude Code's sandbox on."""


def fanout(
    bench: Bench,
    count: int,
    leaf_sleep: float,
    env: Mapping[str, str] | None = None,
    *,
    bare: bool = True,
    pss: bool = False,
    bare_first: bool = False,
    compare: Path | None = None,
    leaf_tools: str = "Read",
    bare_sandbox: bool = False,
) -> FanOut:
    """P1b (wall time) and P6 (memory): `count` leaves from one spawn.py parent, and `count` bare claude -p in parallel.

    Memory is sampled on both sides alike; PSS (P6's measure) only when asked:
    reading it walked every mapping of every process four times a second,
    about 1 s of CPU in a 10 s fan-out on 2 cores, beside the run being timed.
    bare_first runs the bare side first, so that rounds can alternate the order.
    compare runs the spawn.py side a second time through that script, between the other two.
    leaf_tools: both sides' leaves' tools; with Bash, spawn.py's leaves run sandboxed (below the root, --sandbox auto).
    bare_sandbox: the bare leaves run with Claude Code's sandbox on too (its start costs the same on both sides).
    """
    steps: list[dict[str, Any]] = [{"text": LEAF_TEXT, **({"sleep": leaf_sleep} if leaf_sleep else {})}]
    root_task = mock_task(f"bench fan-out root {count}", [{"bash": fanout_script(count, steps, leaf_tools)}, {"text": "root-result"}])

    def spawn_argv(script: Path) -> list[str]:
        return [sys.executable, str(script), "--task", root_task, "--tools", "Bash,Read", "--max-depth", "1"]

    def command(script: Path) -> str:
        task = f"'MOCK[Bash: {fanout_script(count, steps, leaf_tools)}]MOCK'"
        return f"{shlex.join(spawn_argv(script)[:2])} --task {task} --tools Bash,Read --max-depth 1"

    leaves = [bare_argv(bench.cli, mock_task(f"bare fan-out leaf {i}", steps), leaf_tools) for i in range(count)]
    if bare_sandbox:
        leaves = [[*leaf, "--settings", json.dumps({"sandbox": {"enabled": True}})] for leaf in leaves]
    spawn_env = dict(env or bench.env)
    sides: dict[str, Callable[[], tuple[float, TreeMemory, float]]] = {
        "spawn": lambda: spawn_fanout(bench, count, spawn_argv(SPAWN), spawn_env, pss)
    }
    commands = [command(SPAWN)]
    if compare is not None:
        sides["compare"] = lambda: spawn_fanout(bench, count, spawn_argv(compare), spawn_env, pss)
        commands.append(f"--compare: {command(compare)}")
    if bare:
        sides["bare"] = lambda: bare_fanout(bench, leaves, pss)
        commands.append(f"{count} x {shlex.join(leaves[0][:2])} ... in parallel")
    done = {name: sides[name]() for name in (reversed(list(sides)) if bare_first else list(sides))}
    spawn_s, spawn_memory, spawn_cpu = done["spawn"]
    bare_s, bare_memory, bare_cpu = done.get("bare", (math.nan, TreeMemory(), math.nan))
    compare_s, _, compare_cpu = done.get("compare", (math.nan, TreeMemory(), math.nan))
    return FanOut(
        count,
        spawn_s,
        bare_s,
        spawn_memory,
        bare_memory,
        commands,
        spawn_cpu,
        bare_cpu,
        compare_s=compare_s,
        compare_cpu_s=compare_cpu,
        compare_rounds_s=[] if compare is None else [(spawn_s, compare_s)],
        leaf_tools=leaf_tools,
        bare_sandbox=bare_sandbox,
    )


def spawn_fanout(bench: Bench, count: int, argv: list[str], env: dict[str, str], pss: bool) -> tuple[float, TreeMemory, float]:
    """The spawn.py side of a fan-out: wall time, memory, CPU."""
    pids: list[int] = []
    bench.mock.new_requests()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=bench.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids.append(proc.pid)
    with MemorySampler(lambda: pids, pss=pss) as spawn_mem:
        out, err = proc.communicate(timeout=bench.timeout)
    spawn_s = time.perf_counter() - t0
    spawn_cpu = children_cpu() - cpu0
    time.sleep(0.05)
    main = [r for r in bench.mock.new_requests() if r.get("kind") == "main"]
    check_agent_result(f"fan-out of {count}", Proc(proc.returncode, out, err, 0, 0, spawn_s), "root-result")
    check_turns(f"fan-out of {count}", main, count + 2)
    return spawn_s, spawn_mem.result, spawn_cpu


def bare_fanout(bench: Bench, leaves: list[list[str]], pss: bool) -> tuple[float, TreeMemory, float]:
    """The bare side of a fan-out: every claude -p at once; wall time, memory, CPU."""
    running: list[subprocess.Popen[bytes]] = []
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    with MemorySampler(lambda: [p.pid for p in running], pss=pss) as sampler:
        running += [
            subprocess.Popen(
                a, env=dict(bench.env), cwd=bench.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for a in leaves
        ]
        codes = [p.wait(bench.timeout) for p in running]
    bare_s, bare_cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if any(codes):
        raise BenchError(f"bare fan-out: exit codes {codes}")
    return bare_s, sampler.result, bare_cpu


def fanout_rounds(
    bench: Bench, count: int, rounds: int, compare: Path | None = None, *, leaf_tools: str = "Read", bare_sandbox: bool = False
) -> FanOut:
    """P1b over `rounds` rounds that alternate which side runs first: medians of time and CPU, peaks of memory.

    One fan-out per side is one sample of a noisy figure: on a shared 2-core
    machine 16 bare claude -p took anywhere from 9.2 s to 12.9 s within an hour.
    """
    runs = [
        fanout(bench, count, 0.0, bare_first=i % 2 == 1, compare=compare, leaf_tools=leaf_tools, bare_sandbox=bare_sandbox)
        for i in range(max(1, rounds))
    ]

    def peaks(memories: list[TreeMemory]) -> TreeMemory:
        return TreeMemory(**{f.name: max(getattr(m, f.name) for m in memories) for f in fields(TreeMemory)})

    return FanOut(
        count,
        median([r.spawn_s for r in runs]),
        median([r.bare_s for r in runs]),
        peaks([r.spawn_memory for r in runs]),
        peaks([r.bare_memory for r in runs]),
        runs[0].commands,
        median([r.spawn_cpu_s for r in runs]),
        median([r.bare_cpu_s for r in runs]),
        round_ratios=[r.spawn_s / r.bare_s for r in runs],
        compare_s=median([r.compare_s for r in runs]),
        compare_cpu_s=median([r.compare_cpu_s for r in runs]),
        compare_rounds_s=[pair for r in runs for pair in r.compare_rounds_s],
        leaf_tools=leaf_tools,
        bare_sandbox=bare_sandbox,
    )

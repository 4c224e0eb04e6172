"""P10 (issue 37): the depth-3 chain of in-process agents against the CLI's own subagents."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mock_model import mock_task

from .commands import bare_argv
from .core import LEAF_STEPS, MIB, SPAWN, BenchError, Proc, Target, check_agent_result, fmt, median, short
from .memory import MemorySampler, TreeMemory
from .runs import Bench

TARGET_INPROCESS_RATIO = 1.2  # issue 37, P10


# Model turns of the in-process chain: root and middle 2 each (Agent, then answer), leaf 1.
INPROCESS_TURNS = 5


def inprocess_chain_task(prefix: str) -> str:
    """The depth-3 chain both P10 sides run: each level starts the next with the Agent tool.

    run_in_background false: in -p mode the CLI would launch the main thread's
    subagent in the background, answer, and take one more turn when it ends.
    """
    leaf = mock_task(f"{prefix} leaf", LEAF_STEPS)

    def level(name: str, child: str, answer: str) -> str:
        call = {"description": f"{name} delegates", "prompt": child, "subagent_type": "general-purpose", "run_in_background": False}
        return mock_task(f"{prefix} {name}", [{"tool": "Agent", "input": call}, {"text": answer}])

    return level("root", level("middle", leaf, "middle-result"), "root-result")


def chain_run(bench: Bench, argv: Sequence[str], env: Mapping[str, str], *, sample: bool) -> tuple[Proc, TreeMemory, int]:
    """One run to its end, and its model turns; sampled, also its process tree's peak memory (RSS only).

    A sampled run is never a timed one: every sample walks /proc for the
    tree, about a tenth of one CPU at 0.1 s, and it cost the side with more
    processes more (the chains came out 0.1-0.2 s slower sampled than not).
    """
    bench.mock.new_requests()
    started, t0 = time.time(), time.perf_counter()
    proc = subprocess.Popen(
        list(argv), env=dict(env), cwd=bench.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    memory = TreeMemory()
    if sample:
        with MemorySampler(lambda: [proc.pid], interval=0.1, pss=False) as sampler:
            out, err = proc.communicate(timeout=bench.timeout)
        memory = sampler.result
    else:
        out, err = proc.communicate(timeout=bench.timeout)
    done = Proc(proc.returncode, out, err, started, time.time(), time.perf_counter() - t0)
    time.sleep(0.05)
    turns = sum(1 for r in bench.mock.new_requests() if r.get("kind") == "main")
    return done, memory, turns


# Untimed runs of each P10 side with its memory sampled, after one unmeasured run each.
INPROCESS_MEMORY_RUNS = 2


def inprocess_chain_rounds(bench: Bench, rounds: int) -> dict[str, Any]:
    """P10: the depth-3 chain run with --placement inprocess (each level governed and
    recorded as an agent) against bare `claude -p --tools Agent,Read` with the same
    scripted steps, in rounds that alternate which side goes first. Memory is
    sampled in untimed runs before them (chain_run says why)."""
    spawn_argv = [sys.executable, str(SPAWN), "--task", inprocess_chain_task("bench p10"), "--tools", "Agent,Read",
                  "--placement", "inprocess", "--max-depth", "3"]  # fmt: skip
    bare = bare_argv(bench.cli, inprocess_chain_task("bench p10"), "Agent,Read")
    sides = {"spawn": spawn_argv, "bare": bare}
    seconds: dict[str, list[float]] = {"spawn": [], "bare": []}
    memory: dict[str, list[TreeMemory]] = {"spawn": [], "bare": []}

    def run(name: str, *, sample: bool) -> Proc:
        proc, mem, turns = chain_run(bench, sides[name], bench.env, sample=sample)
        check_agent_result(f"P10 {name} chain", proc, "root-result")
        if turns != INPROCESS_TURNS:
            raise BenchError(f"P10 {name} chain: {turns} model turns, expected {INPROCESS_TURNS}; stderr: {proc.stderr[-500:]}")
        if sample:
            memory[name].append(mem)
        return proc

    for argv in sides.values():  # once each, unmeasured: the first run of a CLI pays its cold caches, spawn.py's compiles its copy
        chain_run(bench, argv, bench.env, sample=False)
    for _ in range(INPROCESS_MEMORY_RUNS):
        for name in sides:
            run(name, sample=True)
    for index in range(max(1, rounds)):
        for name in list(sides) if index % 2 == 0 else list(reversed(sides)):
            seconds[name].append(run(name, sample=False).elapsed)
    ratio = median(seconds["spawn"]) / median(seconds["bare"])
    peak = {
        name: {"python_rss": max(m.peak_python_rss for m in mems), "cli_rss": max(m.peak_other_rss for m in mems)}
        for name, mems in memory.items()
    }
    print("\nP10: depth-3 chain of in-process agents (medians of interleaved rounds; peak RSS of the tree in untimed runs)")
    for name in sides:
        each = ", ".join(f"{x:.2f}" for x in seconds[name])
        print(f"  {name:<5} {fmt(median(seconds[name]), 's')}  (rounds {each}); "
              f"Python {peak[name]['python_rss'] / MIB:.0f} MiB, CLI {peak[name]['cli_rss'] / MIB:.0f} MiB")  # fmt: skip
    print(f"  spawn.py / claude -p: {fmt(ratio, 'x')} (target <= {TARGET_INPROCESS_RATIO}x)")
    print(f"  spawn: {short(spawn_argv)}\n  bare:  {short(bare)}")
    return {
        "rounds_s": seconds,
        "ratio": ratio,
        "peak_rss": peak,
        "target": Target("depth-3 in-process chain, spawn.py / claude -p", ratio, TARGET_INPROCESS_RATIO, "x", "P10", short(spawn_argv)),
    }

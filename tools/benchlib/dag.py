"""`spawn.py dag run`'s overhead: a 3-level graph of trivial agents against the same agents started by hand."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mock_model import mock_task

from .core import SPAWN, BenchError, fmt, median, run_process

# 3 levels, 8 tasks: the level each task is on, and what blocks it.
DAG_LEVELS: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = (
    (("a1", ()), ("a2", ())),
    (("b1", ("a1",)), ("b2", ("a1", "a2")), ("b3", ("a2",))),
    (("c1", ("b1", "b2")), ("c2", ("b2",)), ("c3", ("b3",))),
)


def dag_overhead(env: Mapping[str, str], workdir: Path, timeout: float, rounds: int) -> dict[str, Any]:
    """Wall time of `spawn.py dag run` for DAG_LEVELS against the same agents started by hand, level by level."""
    tasks = [
        {"id": tid, "task": mock_task(f"dag {tid}", [{"text": tid}]), "tools": [], "blockedBy": list(blockers)}
        for level in DAG_LEVELS
        for tid, blockers in level
    ]
    graph = workdir / "bench-dag.json"
    graph.write_text(json.dumps({"tasks": tasks}))
    dag_s: list[float] = []
    hand_s: list[float] = []
    for _ in range(rounds):
        proc = run_process([sys.executable, str(SPAWN), "dag", "run", str(graph)], env, timeout, workdir)
        if proc.returncode != 0:
            raise BenchError(f"dag run exited {proc.returncode}: {proc.stderr[-800:]}")
        dag_s.append(proc.elapsed)
        t0 = time.perf_counter()
        for level in DAG_LEVELS:
            running = [
                subprocess.Popen(
                    [sys.executable, str(SPAWN), "--task", mock_task(f"hand {tid}", [{"text": tid}]), "--tools", ""],
                    env=dict(env),
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for tid, _ in level
            ]
            if any(p.wait(timeout) != 0 for p in running):
                raise BenchError("an agent started by hand failed")
        hand_s.append(time.perf_counter() - t0)
    dag, hand = median(dag_s), median(hand_s)
    print(f"\ndag runner overhead (3 levels, 8 trivial agents, {rounds} round(s), medians):")
    print(f"  spawn.py dag run {fmt(dag, 's'):>10}   by hand in the ideal order {fmt(hand, 's'):>10}")
    print(f"  overhead {fmt(dag - hand, 's')} ({dag / hand:.2f}x)")
    return {"dag_s": dag_s, "by_hand_s": hand_s, "overhead_s": dag - hand, "ratio": dag / hand}

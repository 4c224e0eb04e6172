"""What every measurement shares: paths, targets, the error, running a process, checking a run, and the figures' rows and format."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tools/benchlib/core.py


SPAWN = ROOT / "spawn.py"


# Targets from the project's goals; (name, unit, target, compare "<=").
TARGET_CHAIN_RATIO = 1.2  # issue 14, P1: with --sandbox off at every level
# Issue 45, item 7: P1 in the default configuration, where every spawner below
# the root is sandboxed and spawns through its runner's broker (the sandbox's
# own start, bwrap and its proxy, is in it; the bare chain has none).
TARGET_SANDBOXED_CHAIN_RATIO = 1.35


TARGET_FANOUT_RATIO = 1.0  # issue 14, P1b


TARGET_BYTES_RATIO = 0.15  # issue 14, P2


TARGET_MEMORY_RATIO = 0.15  # issue 14, P6: Python side of the tree over bare


TARGET_WAIT_MS = 100.0


# Issue 32: regenerating spawn.py from a package must not slow it; this spawn.py
# over the --compare one, interleaved in the same rounds (P1 chain, P1b fan-out).
TARGET_COMPARE_RATIO = 1.05


MIB = 1024 * 1024


# Seconds the scripted model sleeps before the background agent's answer: far
# longer than `spawn.py wait`'s own start-up (~0.2 s), so wait is polling
# before the outcome is written and its start-up is not what gets measured.
WAIT_AGENT_SLEEP_S = 2.0


# A wait sample only counts if the marker appeared at least this long after
# the wait process was started (proof that wait was already polling).
WAIT_MIN_HEAD_START_S = 1.0


# P6: seconds each leaf's model "thinks", so that every agent of the fan-out
# is alive at once while memory is sampled (start-up of 32 CLIs on a small
# machine takes several seconds).
MEMORY_LEAF_SLEEP_S = 4.0


LEAF_TEXT = "leaf-result"


# Model turns of the depth-3 chain: root and middle 2 each (Bash, then answer), leaf 1.
CHAIN_TURNS = 5


LEAF_STEPS: list[dict[str, Any]] = [{"text": LEAF_TEXT}]


class BenchError(RuntimeError):
    """A run did not do what the benchmark needs (the figures would be meaningless)."""


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Proc:
    """One finished process and when it ran (wall clock, for matching the mock log)."""

    returncode: int
    stdout: str
    stderr: str
    started: float  # time.time() just before the exec
    ended: float  # time.time() just after the process was reaped
    elapsed: float  # perf_counter difference: the figure reported


def run_process(argv: Sequence[str], env: Mapping[str, str], timeout: float, cwd: Path) -> Proc:
    """Run argv to completion in its own process group; kill the group on timeout.

    subprocess.run(timeout=...) polls with sleeps of up to 50 ms, which would
    add noise to the figures; here the reap is a blocking waitpid and a timer
    thread enforces the timeout instead.
    """
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # one group to end if it hangs, never ours
    )
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, on_timeout)
    timer.start()
    try:
        out, err = proc.communicate()
    finally:
        timer.cancel()
    elapsed = time.perf_counter() - t0
    ended = time.time()
    if timed_out.is_set():
        raise BenchError(f"{shlex.join(argv)[:200]} timed out after {timeout:g} s; stderr: {err[-800:]}")
    return Proc(proc.returncode, out, err, started, ended, elapsed)


def last_json_line(text: str) -> dict[str, Any]:
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    raise BenchError(f"no JSON object in output: {text[-500:]!r}")


def check_agent_result(name: str, proc: Proc, expected: str) -> None:
    """Figures from a run that failed would be meaningless: stop with the reason."""
    if proc.returncode != 0:
        raise BenchError(f"{name} exited {proc.returncode}; stderr: {proc.stderr[-800:]}")
    data = last_json_line(proc.stdout)
    got = data.get("output", data.get("result"))
    if got != expected:
        raise BenchError(f"{name} answered {got!r}, expected {expected!r}; stdout: {proc.stdout[-500:]}")


def check_turns(what: str, main: Sequence[Mapping[str, Any]], expected: int) -> None:
    """A run asked the model exactly `expected` steps; a CLI's retry of a step it sent already is not a step.

    Otherwise the run explains itself: which step was asked twice, and by
    which CLI sessions (two sessions: an agent that ran twice), or never.
    """
    retried = [r for r in main if (r.get("retry") or 0) > 0]
    turns = len(main) - len(retried)
    if turns == expected:
        return
    asked: dict[tuple[Any, Any], list[str]] = {}
    for r in main:
        asked.setdefault((r.get("task_digest"), r.get("step_index")), []).append(f"{r.get('session')}/retry {r.get('retry')}")
    again = [f"{digest} step {index} by {', '.join(who)}" for (digest, index), who in asked.items() if len(who) > 1]
    raise BenchError(
        f"{what}: {turns} model turns ({len(retried)} retries besides), expected {expected}; "
        f"asked more than once: {'; '.join(again) or 'none'}; statuses: {sorted({str(r.get('status')) for r in main})}"
    )


@dataclass
class Target:
    """One row of issue #14's target table (id "P1", "P1b", ...; "" for older targets)."""

    name: str
    value: float
    limit: float
    unit: str
    id: str = ""
    command: str = ""
    """How the figure was measured (printed under the table)."""

    @property
    def measured(self) -> bool:
        return not math.isnan(self.value)

    @property
    def met(self) -> bool:
        """A row not measured in this run (a part skipped) is not a miss, nor one only reported (limit inf)."""
        return not self.measured or self.value <= self.limit

    @property
    def has_limit(self) -> bool:
        return not math.isinf(self.limit)

    def limit_text(self) -> str:
        return f"<= {fmt(self.limit, self.unit)}" if self.has_limit else "(reported)"


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):  # nothing measured
        return "-"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:.2f}x"


def table(rows: Sequence[Sequence[str]], header: Sequence[str], left: int = 1) -> str:
    """Columns before `left` are text (left-aligned), the rest figures."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join((c.ljust(w) if i < left else c.rjust(w)) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    return "\n".join(lines)


def short(argv: Sequence[str], limit: int = 160) -> str:
    """A command line for the table's footnotes: scripted tasks are long, so they are cut."""
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_target(target_id: str, what: str, rounds_s: Sequence[tuple[float, float]], command: str) -> Target:
    """This spawn.py against the --compare one (issue 32): the ratio of medians of (this, compare) wall times from interleaved rounds."""
    this, other = median([t for t, _ in rounds_s]), median([o for _, o in rounds_s])
    each = ", ".join(f"{t / o:.2f}x" for t, o in rounds_s)
    return Target(
        f"{what}, this spawn.py / --compare ({fmt(this, 's')} vs {fmt(other, 's')}; rounds {each or '-'})",
        this / other,
        TARGET_COMPARE_RATIO,
        "x",
        target_id,
        command,
    )

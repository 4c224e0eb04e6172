"""The interleaved rounds of P1, P1s, P2 and the start-up profile, and P3's `spawn.py wait` samples: the Bench and its series."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mock_model import Served, mock_task

from .clocks import MarkerClock, children_cpu
from .commands import Commands
from .core import (
    CHAIN_TURNS,
    LEAF_TEXT,
    SPAWN,
    WAIT_AGENT_SLEEP_S,
    BenchError,
    Proc,
    check_agent_result,
    check_turns,
    last_json_line,
    run_process,
)
from .schema_chain import SchemaChain, chain_segments, check_structured


@dataclass
class Sample:
    seconds: float
    main_requests: int = 0
    first_request_bytes: int | None = None
    first_request_parts: dict[str, int] = field(default_factory=dict)  # tools, system, messages
    to_first_request_s: float | None = None  # launch -> first model request logged
    after_last_request_s: float | None = None  # last model request logged -> exit


@dataclass
class Series:
    label: str
    samples: list[Sample] = field(default_factory=list)

    def values(self, get: Callable[[Sample], float | int | None]) -> list[float]:
        return [float(v) for v in (get(s) for s in self.samples) if v is not None]


def sample_from(proc: Proc, records: Sequence[Mapping[str, Any]]) -> Sample:
    main = [r for r in records if r.get("kind") == "main"]
    firsts = [r for r in main if r.get("first")]
    sample = Sample(seconds=proc.elapsed, main_requests=len(main))
    if main:
        times = [float(r["time"]) for r in main]
        sample.to_first_request_s = min(times) - proc.started
        sample.after_last_request_s = proc.ended - max(times)
    if firsts:
        # The outermost agent's first request comes first.
        first = min(firsts, key=lambda r: float(r["time"]))
        sample.first_request_bytes = int(first["bytes"])
        sample.first_request_parts = {k: int(first.get(f"{k}_bytes", 0)) for k in ("tools", "system", "messages")}
    return sample


@dataclass
class Bench:
    cli: Path
    env: dict[str, str]
    warm_env: dict[str, str]
    workdir: Path
    mock: Served
    timeout: float
    cmds: Commands
    series: dict[str, Series] = field(default_factory=dict)
    only_chains: bool = False
    """Rounds run the P1 chains only (--only-chains)."""
    schema_chains: list[SchemaChain] = field(default_factory=list)
    """P1s's chains, run in every round (schema_chain_steps)."""
    segments: dict[str, list[list[float]]] = field(default_factory=dict)
    """P1s: each run's wall time cut at its model requests (chain_segments), by series key."""

    def run(
        self,
        key: str,
        label: str,
        argv: Sequence[str],
        *,
        expected: str | None = None,
        env: Mapping[str, str] | None = None,
        turns: int | None = None,
    ) -> None:
        self.mock.new_requests()  # drop anything logged before this run
        proc = run_process(argv, env or self.env, self.timeout, self.workdir)
        # The mock logs a request after answering it; a moment lets the last line land.
        time.sleep(0.05)
        records = self.mock.new_requests()
        if expected is not None:
            check_agent_result(label, proc, expected)
        elif proc.returncode != 0:
            raise BenchError(f"{label} exited {proc.returncode}; stderr: {proc.stderr[-800:]}")
        sample = sample_from(proc, records)
        # A level that was refused or failed answers quickly and would flatter
        # the figures: insist on every scripted model turn having happened.
        if turns is not None and sample.main_requests != turns:
            raise BenchError(f"{label}: {sample.main_requests} model turns, expected {turns}; stdout: {proc.stdout[-500:]}")
        self.series.setdefault(key, Series(label)).samples.append(sample)

    def round(self, index: int) -> None:
        c = self.cmds
        steps: list[Callable[[], None]] = [
            lambda: self.run("spawn_chain", "spawn.py depth-3 chain", c.spawn_chain, expected="root-result", turns=CHAIN_TURNS),
            lambda: self.run("bare_chain", "claude -p depth-3 chain", c.bare_chain, expected="root-result", turns=CHAIN_TURNS),
            lambda: self.run("uv_chain", "uv run spawn.py depth-3 chain", c.uv_chain, expected="root-result", turns=CHAIN_TURNS),
        ]
        if c.compare_chain is not None:
            other = c.compare_chain
            # Beside this script's chain, so the reversed rounds alternate which of the two goes first.
            steps.insert(
                1, lambda: self.run("compare_chain", "--compare spawn.py depth-3 chain", other, expected="root-result", turns=CHAIN_TURNS)
            )
        steps += self.schema_chain_steps()
        steps += [] if self.only_chains else self.other_steps()
        for step in steps if index % 2 == 0 else reversed(steps):
            step()

    def run_schema_chain(self, chain: SchemaChain) -> None:
        """One P1s chain: checked like P1's (answer, 5 model turns), and cut into stages."""
        self.mock.new_requests()
        cpu = children_cpu()
        proc = run_process(chain.argv, self.env, self.timeout, self.workdir)
        cpu = children_cpu() - cpu  # the whole tree's: every process of it is reaped by then
        time.sleep(0.05)  # the mock logs a request after answering it
        records = self.mock.new_requests()
        check_structured(chain, proc)
        main = [r for r in records if r.get("kind") == "main"]
        check_turns(chain.label, main, CHAIN_TURNS)
        self.series.setdefault(chain.key, Series(chain.label)).samples.append(sample_from(proc, records))
        self.segments.setdefault(chain.key, []).append([*chain_segments(proc, main), cpu])

    def schema_chain_steps(self) -> list[Callable[[], None]]:
        return [functools.partial(self.run_schema_chain, chain) for chain in self.schema_chains]

    def schema_round(self, index: int) -> None:
        """A round of P1s alone (--only-schema-chain), reversed every other round like round()."""
        steps = self.schema_chain_steps()
        for step in steps if index % 2 == 0 else reversed(steps):
            step()

    def other_steps(self) -> list[Callable[[], None]]:
        """The rest of a round: start-up profile and P2's single agents."""
        c = self.cmds
        return [
            lambda: self.run(
                "spawn_chain_no_server",
                "  same as spawn.py chain, SPAWN_NO_FORKSERVER=1",
                c.spawn_chain,
                expected="root-result",
                turns=CHAIN_TURNS,
                env={**self.env, "SPAWN_NO_FORKSERVER": "1"},
            ),
            lambda: self.run("spawn_leaf", "spawn.py single agent (--tools Read)", c.spawn_leaf, expected=LEAF_TEXT, turns=1),
            lambda: self.run("bare_leaf", "claude -p single agent (defaults)", c.bare_leaf, expected=LEAF_TEXT, turns=1),
            lambda: self.run("bare_leaf_read", "claude -p single agent (--tools Read)", c.bare_leaf_read, expected=LEAF_TEXT, turns=1),
            lambda: self.run("python_start", "python -c pass", c.python_start),
            lambda: self.run("import_sdk", "python -c 'import claude_agent_sdk'", c.import_sdk),
            lambda: self.run("import_sdk_warm", "  same, warm private bytecode cache", c.import_sdk, env=self.warm_env),
            lambda: self.run("spawn_dry_run", "spawn.py --dry-run (no SDK)", c.spawn_dry_run),
            lambda: self.run("cli_version", "claude --version", c.cli_version),
        ]

    def warm_up(self) -> None:
        """First runs pay one-time costs (CLI config, page cache, bytecode): not measured."""
        c = self.cmds
        run_process(c.import_sdk, self.warm_env, self.timeout, self.workdir)
        run_process(["uv", "run", str(SPAWN), "--dry-run", "--task", "warm", "--tools", "Read"], self.env, self.timeout, self.workdir)
        # The --compare script's first run writes its own compiled copy (named for its path and bytes).
        for argv in (c.bare_leaf, c.spawn_leaf, *([c.compare_leaf] if c.compare_leaf else [])):
            proc = run_process(argv, self.env, self.timeout, self.workdir)
            check_agent_result("warm-up", proc, LEAF_TEXT)
        self.mock.new_requests()

    def wait_sample(self, index: int) -> dict[str, float]:
        """One `spawn.py wait` latency: .done marker mtime -> wait process reaped."""
        task = mock_task(f"bench wait sample {index}", [{"text": "waited", "sleep": WAIT_AGENT_SLEEP_S}])
        launch = run_process([sys.executable, str(SPAWN), "--task", task, "--tools", "Read", "--background"], self.env, 60, self.workdir)
        if launch.returncode != 0:
            raise BenchError(f"background launch exited {launch.returncode}: {launch.stderr[-800:]}")
        info = last_json_line(launch.stdout)
        agent_dir = Path(info["agent_dir"])
        session = agent_dir.parent.parent
        clock = MarkerClock(agent_dir)
        wait_started = time.time_ns()
        proc = subprocess.Popen(
            [sys.executable, str(SPAWN), "wait", str(info["id"]), "--session", str(session), "--timeout", str(self.timeout)],
            env=self.env,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # communicate() with no timeout ends in a blocking waitpid: the exit is
        # seen at once, unlike Popen.wait(timeout=...)'s sleep loop. wait has
        # its own --timeout, so this can't hang forever.
        out, err = proc.communicate()
        exited = time.time_ns()
        if proc.returncode != 0:
            raise BenchError(f"spawn.py wait exited {proc.returncode}: {err[-800:]}")
        marker = Path(info["done_marker"])
        marker_ns = marker.stat().st_mtime_ns
        outcome_ns = (agent_dir / "outcome.json").stat().st_mtime_ns
        self.wait_for_runner_exit(agent_dir)
        return {
            "latency_ms": (exited - marker_ns) / 1e6,
            "from_outcome_ms": (exited - outcome_ns) / 1e6,
            "from_created_ms": math.nan if clock.seen_ns is None else (exited - clock.seen_ns) / 1e6,
            "head_start_s": (marker_ns - wait_started) / 1e9,
            "wait_status_ok": float(last_json_line(out).get("status") == "done"),
        }

    def wait_for_runner_exit(self, agent_dir: Path) -> None:
        """Let the background runner finish before the next sample, so it doesn't compete for the CPU."""
        try:
            pid = int(json.loads((agent_dir / "meta.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return
        limit = time.monotonic() + 10
        while time.monotonic() < limit:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # gone (or not Linux: a short pause is all we lose)
            if state == "Z":
                return
            time.sleep(0.02)

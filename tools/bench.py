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
   model turns. Target: spawn/bare <= 1.2x (P1, below). When ``uv`` on
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
   through StructuredOutput. Both chains' wall time is also cut at the model
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

Run (the interpreter must have spawn.py's dependencies, as nox's bench has)::

    uv run tools/bench.py [--repeat 5] [--wait-samples 10] [--json out.json]
    uvx nox -s bench -- --json bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import itertools
import json
import math
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
sys.path.insert(0, str(ROOT))  # spawn.py and the scripted model are imported, not copied
sys.path.insert(0, str(ROOT / "tools"))

from bench_cost import BASELINE_REF, CostBenchError, p8_figures  # noqa: E402
from bench_cost import environment as bench_cost_environment  # noqa: E402
from mock_model import Served, ServeError, mock_task, serve, spawn_in_bash  # noqa: E402

import spawn  # noqa: E402

# Targets from the project's goals; (name, unit, target, compare "<=").
TARGET_CHAIN_RATIO = 1.2  # issue 14, P1
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


# ------------------------------------------------------------------ helpers --


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


# ------------------------------------------------------------- environment --


def bench_environment(base: Mapping[str, str], workdir: Path, url: str, pycache: str) -> dict[str, str]:
    """A user's shell pointed at the mock (bench_cost.environment), with uv's own cache and Python unbuffered."""
    env = bench_cost_environment(base, workdir, url)
    env["PYTHONUNBUFFERED"] = "1"
    # uv keeps its cache (the script's environment) under HOME: the real one,
    # or every `uv run spawn.py` would build the environment again.
    env["UV_CACHE_DIR"] = base.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    env["UV_PYTHON_INSTALL_DIR"] = base.get("UV_PYTHON_INSTALL_DIR") or str(Path.home() / ".local" / "share" / "uv" / "python")
    if pycache == "private":
        env.update(private_pycache(workdir))
    return env


@dataclass
class UvFound:
    """The uv the chains run: the binary, and the wrapper script PATH put in front of it, if any."""

    binary: str | None
    wrapper: str | None = None
    wrapper_s: float | None = None  # median `uv --version` through the wrapper
    binary_s: float | None = None  # the same, the binary itself

    def describe(self) -> str:
        if self.binary is None:
            return "uv: not on PATH (the uv chain fails)"
        if self.wrapper is None:
            return f"uv: {self.binary}"
        return (
            f"uv: {self.binary}, the binary behind {self.wrapper} on PATH (a wrapper script, "
            f"{fmt(1000 * (self.wrapper_s or math.nan), 'ms')} a call against {fmt(1000 * (self.binary_s or math.nan), 'ms')}); "
            "the chains run the binary, as a standalone install would"
        )


def find_uv(env: Mapping[str, str], workdir: Path) -> tuple[UvFound, dict[str, str]]:
    """The uv on PATH, and an environment whose `uv` is the binary itself.

    A version manager's shim (pyenv's, asdf's) is a shell script that runs a
    program of its own before uv: about 60 ms a call here, paid at every level
    of the uv chain and never by the bare chain. It is the machine's, not uv's
    or spawn.py's, so the chains run the binary it leads to (uv names itself
    to the commands it runs, in UV) and the wrapper's cost is printed beside.
    """
    found = shutil.which("uv", path=env.get("PATH"))
    if found is None:
        return UvFound(None), dict(env)
    with open(found, "rb") as fh:
        if fh.read(2) != b"#!":
            return UvFound(found), dict(env)
    proc = subprocess.run(
        [found, "run", "--no-project", "--quiet", "--", "printenv", "UV"],
        env=dict(env),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    binary = proc.stdout.strip()
    if proc.returncode != 0 or not binary or not os.access(binary, os.X_OK):
        return UvFound(found), dict(env)  # can't tell: measure what PATH gives
    bin_dir = workdir / "uv-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "uv").symlink_to(binary)

    def version_s(uv: str) -> float:
        secs = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([uv, "--version"], env=dict(env), capture_output=True, check=False, timeout=60)
            secs.append(time.perf_counter() - t)
        return median(secs)

    uv = UvFound(binary, found, version_s(found), version_s(binary))
    return uv, {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


def private_pycache(workdir: Path) -> dict[str, str]:
    """Bytecode cached in the temp dir: what a normal install sees after its first run.

    Without a cache (e.g. PYTHONDONTWRITEBYTECODE=1 inherited) every Python
    start compiles the SDK and its dependencies from source again. The prefix
    keeps the benchmark from writing into the caller's site-packages.
    """
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(workdir / "pycache")}


# ----------------------------------------------------------------- commands --


def spawn_with_uv(*args: str) -> str:
    """The same child started as users write it: `uv run spawn.py` (the source, whatever SPAWN_PY names)."""
    return "uv run " + shlex.join([str(SPAWN), *args])


def bare_argv(cli: Path, task: str, tools: str | None) -> list[str]:
    argv = [str(cli), "-p", task, "--output-format", "json"]
    if tools is not None:
        argv += ["--tools", tools, "--allowedTools", tools]
    return argv


@dataclass(frozen=True)
class Commands:
    """Every measured command line; built once so each round runs the same ones."""

    spawn_chain: list[str]
    uv_chain: list[str]
    bare_chain: list[str]
    spawn_leaf: list[str]
    bare_leaf: list[str]
    bare_leaf_read: list[str]
    python_start: list[str]
    import_sdk: list[str]
    spawn_dry_run: list[str]
    cli_version: list[str]
    compare_chain: list[str] | None = None
    """spawn_chain through the --compare script: its children follow it, as $SPAWN_PY names the script that started them."""
    compare_leaf: list[str] | None = None

    @classmethod
    def build(cls, cli: Path, compare: Path | None = None) -> Commands:
        py, spawn = sys.executable, str(SPAWN)
        # Same scripts on both sides: root and middle run one Bash command and
        # then answer, the leaf answers at once; 5 model turns in all. Root and
        # middle hold Read too: spawn.py refuses a child tools its parent lacks.
        s_leaf = mock_task("bench chain leaf", LEAF_STEPS)
        s_mid = mock_task("bench chain middle", [{"bash": spawn_in_bash("--task", s_leaf, "--tools", "Read")}, {"text": "middle-result"}])
        s_root = mock_task("bench chain root", [{"bash": spawn_in_bash("--task", s_mid, "--tools", "Bash,Read")}, {"text": "root-result"}])
        u_mid = mock_task("bench chain middle", [{"bash": spawn_with_uv("--task", s_leaf, "--tools", "Read")}, {"text": "middle-result"}])
        # The middle unsandboxed, so that uv itself starts every level: in a sandbox `uv` is spawn.py's
        # shim (uv can't open its read-only cache there), which runs "$SPAWN_PYTHON" "$SPAWN_PY" at once.
        u_spawn = spawn_with_uv("--task", u_mid, "--tools", "Bash,Read", "--sandbox", "off")
        u_root = mock_task("bench chain root", [{"bash": u_spawn}, {"text": "root-result"}])
        b_leaf = mock_task("bench chain leaf", LEAF_STEPS)
        b_mid = mock_task("bench chain middle", [{"bash": shlex.join(bare_argv(cli, b_leaf, "Read"))}, {"text": "middle-result"}])
        b_root = mock_task("bench chain root", [{"bash": shlex.join(bare_argv(cli, b_mid, "Bash,Read"))}, {"text": "root-result"}])
        # One task text for both single-agent runs, so request bytes compare like for like.
        leaf = mock_task("bench single leaf: answer briefly", LEAF_STEPS)
        return cls(
            spawn_chain=[py, spawn, "--task", s_root, "--tools", "Bash,Read", "--max-depth", "3"],
            uv_chain=["uv", "run", spawn, "--task", u_root, "--tools", "Bash,Read", "--max-depth", "3"],
            bare_chain=bare_argv(cli, b_root, "Bash,Read"),
            spawn_leaf=[py, spawn, "--task", leaf, "--tools", "Read"],
            bare_leaf=bare_argv(cli, leaf, None),  # the CLI's default tools and system prompt (P2)
            bare_leaf_read=bare_argv(cli, leaf, "Read"),  # the same tools as spawn_leaf (its time)
            python_start=[py, "-c", "pass"],
            import_sdk=[py, "-c", "import claude_agent_sdk"],
            spawn_dry_run=[py, spawn, "--dry-run", "--task", leaf, "--tools", "Read"],
            cli_version=[str(cli), "--version"],
            compare_chain=None if compare is None else [py, str(compare), "--task", s_root, "--tools", "Bash,Read", "--max-depth", "3"],
            compare_leaf=None if compare is None else [py, str(compare), "--task", leaf, "--tools", "Read"],
        )


# ------------------------------------------------------------- measurements --


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


def check_agent_result(name: str, proc: Proc, expected: str) -> None:
    """Figures from a run that failed would be meaningless: stop with the reason."""
    if proc.returncode != 0:
        raise BenchError(f"{name} exited {proc.returncode}; stderr: {proc.stderr[-800:]}")
    data = last_json_line(proc.stdout)
    got = data.get("output", data.get("result"))
    if got != expected:
        raise BenchError(f"{name} answered {got!r}, expected {expected!r}; stdout: {proc.stdout[-500:]}")


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


def psutil_clock_offset() -> float:
    """psutil's create_time minus time.time() for the same instant.

    create_time is the boot time plus the start in clock ticks; that boot time
    drifts from the wall clock (NTP steps, a suspended VM), by most of a second
    on some machines, so a create_time compared with time.time() needs this.
    """
    import psutil

    before = time.time()
    proc = subprocess.Popen(["sleep", "1"])
    after = time.time()
    try:
        return psutil.Process(proc.pid).create_time() - (before + after) / 2
    finally:
        proc.kill()
        proc.wait()


def mcp_samples(env: Mapping[str, str], workdir: Path, count: int, timeout: float) -> dict[str, Any]:
    """tools/mcp_server.py over stdio: spawn_agent -> the agent's process started, and agent_wait's latency.

    Start: from the spawn_agent call to the runner's create_time in meta.json (the
    kernel's start time, 10 ms resolution). Latency: the .done marker's mtime to
    agent_wait's result arriving, to compare with `spawn.py wait`'s.
    """
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=[str(SPAWN.parent / "tools" / "mcp_server.py"), "--python", sys.executable],
        env=dict(env),
        cwd=str(workdir),
    )
    starts: list[float] = []
    latencies: list[float] = []
    from_created: list[float] = []
    offset = psutil_clock_offset()

    async def run() -> None:
        async with Client(params, read_timeout_seconds=timeout) as client:
            for i in range(count + 1):  # the first is a warm-up
                task = mock_task(f"bench mcp sample {i}", [{"text": "waited", "sleep": WAIT_AGENT_SLEEP_S}])
                called = time.time()
                started = await client.call_tool("spawn_agent", {"task": task, "tools": ["Read"]})
                data = started.structured_content or {}
                if started.is_error or "agent_dir" not in data:
                    raise BenchError(f"spawn_agent failed: {started.content}")
                agent_dir = Path(str(data["agent_dir"]))
                clock = MarkerClock(agent_dir)
                waited = await client.call_tool("agent_wait", {"agent_ids": [data["agent_id"]], "timeout_s": 50})
                returned = time.time_ns()
                if waited.is_error or (waited.structured_content or {}).get("status") != "done":
                    raise BenchError(f"agent_wait: {waited.content}")
                if i:
                    meta = json.loads((agent_dir / "meta.json").read_text())
                    starts.append((float(meta["create_time"]) - offset - called) * 1000)
                    latencies.append((returned - (agent_dir / ".done").stat().st_mtime_ns) / 1e6)
                    if clock.seen_ns is not None:
                        from_created.append((returned - clock.seen_ns) / 1e6)

    asyncio.run(run())
    return {"spawn_to_process_ms": starts, "agent_wait_latency_ms": latencies, "agent_wait_from_created_ms": from_created}


# ----------------------------------------------------- fan-out and memory --


@dataclass
class TreeMemory:
    """Peak over time of the summed memory of a set of process trees, split by side.

    "python" is spawn.py's side: every Python process (runners, stand-ins, the
    fork server) and the guards, which wait as /bin/sh until they have work;
    "other" the rest (claude CLIs, their shells). PSS counts a
    page shared by n processes as 1/n in each, so pages a fork server shares
    with its children are counted once, as the kernel holds them; RSS counts
    them in every process.
    """

    peak_python_pss: int = 0
    peak_other_pss: int = 0
    peak_total_pss: int = 0
    peak_python_rss: int = 0
    peak_other_rss: int = 0
    samples: int = 0


class MemorySampler:
    """Samples the process trees under `roots` on a thread until stopped."""

    def __init__(self, roots: Callable[[], Sequence[int]], interval: float = 0.25, *, pss: bool = True) -> None:
        self.roots = roots
        self.interval = interval
        self.pss = pss
        """PSS as well as RSS: smaps, a walk of every mapping of every process (the CLIs' are large).
        Without it, RSS alone (statm), far cheaper; but each sample still walks /proc for the tree,
        so P10 samples in runs of their own (chain_run)."""
        self.result = TreeMemory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            procs: dict[int, psutil.Process] = {}
            for pid in self.roots():
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    procs[pid] = root
                    for child in root.children(recursive=True):
                        procs[child.pid] = child
            sums = {"python_pss": 0, "other_pss": 0, "python_rss": 0, "other_rss": 0}
            for proc in procs.values():
                with contextlib.suppress(psutil.Error):
                    side = "python" if proc.name().startswith("python") or "_guard" in proc.cmdline() else "other"
                    info = proc.memory_full_info() if self.pss else proc.memory_info()
                    sums[f"{side}_pss"] += int(getattr(info, "pss", info.rss))
                    sums[f"{side}_rss"] += int(info.rss)
            r = self.result
            r.samples += 1
            r.peak_python_pss = max(r.peak_python_pss, sums["python_pss"])
            r.peak_other_pss = max(r.peak_other_pss, sums["other_pss"])
            r.peak_total_pss = max(r.peak_total_pss, sums["python_pss"] + sums["other_pss"])
            r.peak_python_rss = max(r.peak_python_rss, sums["python_rss"])
            r.peak_other_rss = max(r.peak_other_rss, sums["other_rss"])
            self._stop.wait(self.interval)


def fanout_script(count: int, leaf_steps: Sequence[Mapping[str, Any]]) -> str:
    """A parent's Bash: start `count` leaves with --background at once, then `wait` for all of them."""
    leaf = shlex.quote(f"MOCK{json.dumps(list(leaf_steps))}MOCK")
    start = spawn_in_bash("--tools", "Read", "--background", "--print", "id")
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
) -> FanOut:
    """P1b (wall time) and P6 (memory): `count` leaves from one spawn.py parent, and `count` bare claude -p in parallel.

    Memory is sampled on both sides alike; PSS (P6's measure) only when asked:
    reading it walked every mapping of every process four times a second,
    about 1 s of CPU in a 10 s fan-out on 2 cores, beside the run being timed.
    bare_first runs the bare side first, so that rounds can alternate the order.
    compare runs the spawn.py side a second time through that script, between the other two.
    """
    steps: list[dict[str, Any]] = [{"text": LEAF_TEXT, **({"sleep": leaf_sleep} if leaf_sleep else {})}]
    root_task = mock_task(f"bench fan-out root {count}", [{"bash": fanout_script(count, steps)}, {"text": "root-result"}])

    def spawn_argv(script: Path) -> list[str]:
        return [sys.executable, str(script), "--task", root_task, "--tools", "Bash,Read", "--max-depth", "1"]

    def command(script: Path) -> str:
        task = f"'MOCK[Bash: {fanout_script(count, steps)}]MOCK'"
        return f"{shlex.join(spawn_argv(script)[:2])} --task {task} --tools Bash,Read --max-depth 1"

    leaves = [bare_argv(bench.cli, mock_task(f"bare fan-out leaf {i}", steps), "Read") for i in range(count)]
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


def fanout_rounds(bench: Bench, count: int, rounds: int, compare: Path | None = None) -> FanOut:
    """P1b over `rounds` rounds that alternate which side runs first: medians of time and CPU, peaks of memory.

    One fan-out per side is one sample of a noisy figure: on a shared 2-core
    machine 16 bare claude -p took anywhere from 9.2 s to 12.9 s within an hour.
    """
    runs = [fanout(bench, count, 0.0, bare_first=i % 2 == 1, compare=compare) for i in range(max(1, rounds))]

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
    )


# ------------------------------------------------------ P10: in-process chain --

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


def children_cpu() -> float:
    """CPU seconds of this process's reaped descendants. Every process of a spawn.py tree is
    reaped by its parent or by a subreaper of the tree, so a tree's whole CPU lands here when
    its root is reaped: every CLI, runner, fork server, launcher and guard."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ----------------------------------------------------------------- reporting --


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


def fanout_targets(fan: FanOut | None) -> list[Target]:
    if fan is None:
        return [Target("fan-out (skipped: --fanout 0)", math.nan, TARGET_FANOUT_RATIO, "x", "P1b")]
    spawn_rss, bare_rss = fan.spawn_memory.peak_python_rss / MIB, fan.bare_memory.peak_python_rss / MIB
    detail = f"Python side peak RSS: spawn.py {spawn_rss:.0f} MiB, bare {bare_rss:.0f} MiB"
    if fan.round_ratios:
        each = ", ".join(f"{r:.2f}x" for r in fan.round_ratios)
        detail = f"medians of {len(fan.round_ratios)} interleaved rounds, each {each}; {detail}"
    detail += f"; CPU {fan.spawn_cpu_s:.1f} s vs {fan.bare_cpu_s:.1f} s"
    if not math.isnan(fan.no_slots_s):
        detail += f"; with SPAWN_START_SLOTS=0 {fmt(fan.no_slots_s, 's')}"
    return [
        Target(
            f"{fan.count} background leaves + wait --all, wall time ({fmt(fan.spawn_s, 's')} vs {fmt(fan.bare_s, 's')}; {detail})",
            fan.spawn_s / fan.bare_s,
            TARGET_FANOUT_RATIO,
            "x",
            "P1b",
            "; ".join(fan.commands),
        )
    ]


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


def memory_targets(memory: Mapping[str, FanOut] | None) -> list[Target]:
    if not memory:
        return [Target("memory (skipped: --memory-agents 0)", math.nan, TARGET_MEMORY_RATIO, "x", "P6")]
    rows = []
    bare = next((m for m in memory.values() if not math.isnan(m.bare_s)), None)
    for label, m in memory.items():
        base = bare.bare_memory.peak_total_pss if bare else 0
        py = m.spawn_memory.peak_python_pss
        rows.append(
            Target(
                f"Python side of {m.count} concurrent agents / bare, PSS, {label} "
                f"({py / MIB:.0f} MiB Python, {m.spawn_memory.peak_other_pss / MIB:.0f} MiB CLIs; bare {base / MIB:.0f} MiB)",
                py / base if base else math.nan,
                # The issue's target is for the tree with its fork server; without one it is only reported.
                math.inf if "SPAWN_NO_FORKSERVER" in label else TARGET_MEMORY_RATIO,
                "x",
                "P6",
                "; ".join(m.commands),
            )
        )
    return rows


def report(
    bench: Bench,
    waits: Sequence[Mapping[str, float]],
    args: argparse.Namespace,
    total_s: float,
    *,
    fan: FanOut | None = None,
    memory: Mapping[str, FanOut] | None = None,
) -> dict[str, Any]:
    s = bench.series

    def med(key: str, get: Callable[[Sample], float | int | None] = lambda x: x.seconds) -> float:
        return median(s[key].values(get)) if key in s else float("nan")

    rows: list[list[str]] = []
    for series in s.values():
        secs = series.values(lambda x: x.seconds)
        first = series.values(lambda x: x.to_first_request_s)
        tail = series.values(lambda x: x.after_last_request_s)
        turns = series.values(lambda x: x.main_requests)
        rows.append(
            [
                series.label,
                str(len(secs)),
                fmt(median(secs), "s"),
                fmt(min(secs), "s"),
                fmt(max(secs), "s"),
                fmt(median(first), "s") if first else "",
                fmt(median(tail), "s") if tail else "",
                f"{median(turns):g}" if any(turns) else "",
            ]
        )
    print()
    print("Wall time (median of rounds; 'to 1st req' = launch -> first model request, 'after last' = last request -> exit)")
    print(table(rows, ["run", "n", "median", "min", "max", "to 1st req", "after last", "turns"]))

    spawn_bytes = med("spawn_leaf", lambda x: x.first_request_bytes)
    bare_bytes = med("bare_leaf", lambda x: x.first_request_bytes)

    def part_of(part: str) -> Callable[[Sample], float | int | None]:
        return lambda x: x.first_request_parts.get(part)

    parts = {key: {part: med(key, part_of(part)) for part in ("tools", "system", "messages")} for key in ("spawn_leaf", "bare_leaf")}
    dry = run_process(bench.cmds.spawn_dry_run, bench.env, bench.timeout, bench.workdir)
    briefing_bytes = len(str(last_json_line(dry.stdout).get("briefing", "")).encode())
    leaves = "spawn_leaf" in s  # not with --only-chains
    if leaves:
        print()
        print("First model request of a leaf agent (mock log: kind=main, first=true; JSON bytes of each part)")
        print(
            table(
                [
                    [
                        label,
                        fmt(total, "B"),
                        fmt(parts[key]["tools"], "B"),
                        fmt(parts[key]["system"], "B"),
                        brief,
                        fmt(parts[key]["messages"], "B"),
                    ]
                    for key, label, total, brief in (
                        ("spawn_leaf", "spawn.py --tools Read", spawn_bytes, fmt(briefing_bytes, "B")),
                        ("bare_leaf", "claude -p (default tools and prompt)", bare_bytes, ""),
                    )
                ],
                ["agent", "bytes", "tool definitions", "system prompt", "of which briefing", "messages"],
            )
        )

    lat = [w["latency_ms"] for w in waits]
    from_outcome = [w["from_outcome_ms"] for w in waits]
    head = [w["head_start_s"] for w in waits]
    print()
    print(f"spawn.py wait: .done marker mtime -> wait process exited ({len(lat)} samples)")
    if lat:
        wait_rows = [
            ["from .done marker", fmt(median(lat), "ms"), fmt(min(lat), "ms"), fmt(max(lat), "ms")],
            ["from outcome.json (commit)", fmt(median(from_outcome), "ms"), fmt(min(from_outcome), "ms"), fmt(max(from_outcome), "ms")],
        ]
        print(table(wait_rows, ["latency", "median", "min", "max"]))
        print(f"(wait was already running {min(head):.1f} s or more before each marker appeared)")

    chain_ratio = med("spawn_chain") / med("bare_chain")
    uv_chain_ratio = med("uv_chain") / med("bare_chain")
    # Time against a bare agent with the same tools: the CLI's defaults start
    # up slower, which would hide some of spawn.py's own cost.
    leaf_ratio = med("spawn_leaf") / med("bare_leaf_read")
    bytes_ratio = spawn_bytes / bare_bytes
    c = bench.cmds
    part_bytes = ", ".join(f"{k} {fmt(v, 'B')}" for k, v in parts["spawn_leaf"].items()) + f"; briefing {fmt(briefing_bytes, 'B')}"
    compare_chain: list[Target] = []
    compare_fan: list[Target] = []
    compared: dict[str, Any] | None = None
    if c.compare_chain is not None:
        chain_rounds = list(zip(s["spawn_chain"].values(lambda x: x.seconds), s["compare_chain"].values(lambda x: x.seconds), strict=True))
        compare_chain.append(compare_target("P1", "depth-3 chain", chain_rounds, f"--compare: {short(c.compare_chain)}"))
        compared = {"script": c.compare_chain[1], "chain_rounds_s": chain_rounds, "chain_ratio": compare_chain[0].value}
        if fan is not None:
            compare_fan.append(compare_target("P1b", f"{fan.count} background leaves + wait --all", fan.compare_rounds_s, ""))
            compared |= {"fanout_rounds_s": fan.compare_rounds_s, "fanout_ratio": compare_fan[0].value}
    # One list of rows, in the issue's order; P3, P5 and P7 come from waitperf_report.
    targets = [
        Target("depth-3 chain, every level `uv run spawn.py`", uv_chain_ratio, TARGET_CHAIN_RATIO, "x", "P1", short(c.uv_chain)),
        Target('depth-3 chain, every level "$SPAWN_PYTHON" "$SPAWN_PY"', chain_ratio, TARGET_CHAIN_RATIO, "x", "P1", short(c.spawn_chain)),
        *schema_chain_targets(bench),
        *compare_chain,
        *fanout_targets(fan),
        *compare_fan,
        Target(f"leaf first-request bytes ({part_bytes})", bytes_ratio, TARGET_BYTES_RATIO, "x", "P2", short(c.spawn_leaf)),
        *memory_targets(memory),
        Target("spawn.py wait latency, median (before #14)", median(lat), TARGET_WAIT_MS, "ms"),
    ]
    print()
    print("Ratios")
    print(f"  depth-3 chain    spawn.py / claude -p: {fmt(chain_ratio, 'x')}  (+{med('spawn_chain') - med('bare_chain'):.3f} s)")
    print(f"  depth-3 chain uv run spawn.py / claude -p: {fmt(uv_chain_ratio, 'x')}  (+{med('uv_chain') - med('bare_chain'):.3f} s)")
    if leaves:
        no_server = med("spawn_chain_no_server") / med("bare_chain")
        no_server_extra = med("spawn_chain_no_server") - med("bare_chain")
        print(f"  depth-3 chain, no fork server / claude -p: {fmt(no_server, 'x')}  (+{no_server_extra:.3f} s)")
        print(
            f"  single agent     spawn.py / claude -p, both --tools Read: {fmt(leaf_ratio, 'x')}  "
            f"(+{med('spawn_leaf') - med('bare_leaf_read'):.3f} s per level; claude -p with its default tools: "
            f"{med('bare_leaf'):.3f} s)"
        )
        print(f"  first request    spawn.py / claude -p: {fmt(bytes_ratio, 'x')}")
        print()
        print("Where a spawn.py level's extra time goes (medians; against claude -p with the same tools)")
        extra = med("spawn_leaf") - med("bare_leaf_read")
        startup = med("spawn_leaf", lambda x: x.to_first_request_s) - med("bare_leaf_read", lambda x: x.to_first_request_s)
        teardown = med("spawn_leaf", lambda x: x.after_last_request_s) - med("bare_leaf_read", lambda x: x.after_last_request_s)
        print(f"  extra wall time per level                 {extra:+.3f} s")
        print(f"    before the first model request          {startup:+.3f} s")
        print(f"    after the last model request            {teardown:+.3f} s")
        print(f"  python start-up                           {med('python_start'):.3f} s")
        print(f"  spawn.py start-up without the SDK         {med('spawn_dry_run'):.3f} s  (--dry-run)")
        print(f"  import claude_agent_sdk                   {med('import_sdk'):.3f} s  ({med('import_sdk_warm'):.3f} s with warm bytecode)")
        print(f"  claude CLI start                          {med('cli_version'):.3f} s  (--version)")
    if bench.env.get("PYTHONDONTWRITEBYTECODE") and args.pycache == "inherit":
        print("  note: PYTHONDONTWRITEBYTECODE is set: every Python start compiles the SDK from source (--pycache private: warm cache)")
    print_schema_chain(bench)
    print()
    print("Targets (issue #14; ratios against bare claude -p on the same scripted model, side by side in this run)")
    rows_out = [
        [t.id, t.name, fmt(t.value, t.unit), t.limit_text(), ("met" if t.met else "NOT met") if t.measured and t.has_limit else "-"]
        for t in targets
    ]
    print(table(rows_out, ["id", "target", "value", "limit", "verdict"], left=2))
    if not args.only_chains:
        print("(P3, P5, P7: under 'wait and status' below)")
    print("Commands:")
    for t in targets:
        if t.command:
            print(f"  {t.id or '-':<4} {t.command}")
    print(f"\n(total bench time {total_s:.0f} s, {args.repeat} rounds, {len(lat)} wait samples, pycache={args.pycache})")

    return {
        "repeat": args.repeat,
        "pycache": args.pycache,
        "python": sys.executable,
        "cli": str(bench.cli),
        "series": {
            k: {"label": v.label, "median_s": median(v.values(lambda x: x.seconds)), "samples": [vars(x) for x in v.samples]}
            for k, v in s.items()
        },
        "first_request_bytes": {"spawn": spawn_bytes, "bare": bare_bytes, "parts": parts, "briefing": briefing_bytes},
        "wait": {"median_ms": median(lat), "samples": list(waits)},
        "ratios": {"chain": chain_ratio, "single": leaf_ratio, "first_request_bytes": bytes_ratio},
        "targets": [{**vars(t), "limit": t.limit if t.has_limit else None, "met": t.met, "measured": t.measured} for t in targets],
        "fanout": None if fan is None else {**vars(fan), "spawn_memory": vars(fan.spawn_memory), "bare_memory": vars(fan.bare_memory)},
        "memory": {
            k: {**vars(m), "spawn_memory": vars(m.spawn_memory), "bare_memory": vars(m.bare_memory)} for k, m in (memory or {}).items()
        },
        "compare": compared,
        "total_s": total_s,
    }


# ---------------------------------------------- P1s: as users start a tree --

# Issue 35: P1 the way users start a tree. Every level is `uv run spawn.py
# ... --schema NAME`, against bare `claude -p --json-schema` given the schema
# as spawn.py gives it to the CLI, so both sides pay the CLI's structured
# output and spawn.py also its own validation. Every level answers through the
# StructuredOutput tool, which ends a CLI's run at once: 5 model turns, as P1.
SCHEMA_CHAIN_SCHEMA = "findings"  # a shipped schema, by name, as users give it
# The chain's wall time cut at the model requests the mock logs (in order:
# root, middle, leaf, middle, root), so the two sides compare stage by stage.
CHAIN_SEGMENTS = (
    "launch -> root's 1st request",
    "root's Bash -> middle's 1st request",
    "middle's Bash -> leaf's request",
    "leaf's answer -> middle's 2nd request",
    "middle's answer -> root's 2nd request",
    "root's answer -> exit",
)
CHAIN_CPU = "CPU of the whole tree (user + system)"  # after the stages in each run's row


def schema_answer(level: str) -> dict[str, Any]:
    """What a level of the schema chain answers (valid under SCHEMA_CHAIN_SCHEMA)."""
    return {"summary": f"{level}-result", "findings": []}


@dataclass(frozen=True)
class SchemaChain:
    """One side of P1s: the root's command line, and where its stdout carries the answer."""

    key: str
    label: str
    argv: list[str]
    answer_field: str
    """"output" in spawn.py's result, "structured_output" in claude -p's."""


def schema_chains(cli: Path, compare: Path | None) -> list[SchemaChain]:
    """P1s's chains: uv run spawn.py --schema at every level, bare claude -p --json-schema, and the --compare script's."""

    def uv_level(script: Path, task: str, tools: str, *extra: str) -> list[str]:
        # Unsandboxed like the bare side, so uv itself starts every level (in a sandbox `uv` is
        # spawn.py's shim), and a sandbox's start-up (bwrap, its proxy) is not counted as spawn.py's.
        argv = ["uv", "run", str(script), "--task", task, "--tools", tools, *extra, "--schema", SCHEMA_CHAIN_SCHEMA]
        return [*argv, "--sandbox", "off"]

    def chain(level: Callable[[str, str], list[str]], *root_extra: str) -> list[str]:
        leaf = mock_task("bench schema chain leaf", [{"structured": schema_answer("leaf")}])
        mid_steps: list[dict[str, Any]] = [{"bash": shlex.join(level(leaf, "Read"))}, {"structured": schema_answer("middle")}]
        mid = mock_task("bench schema chain middle", mid_steps)
        root_steps: list[dict[str, Any]] = [{"bash": shlex.join(level(mid, "Bash,Read"))}, {"structured": schema_answer("root")}]
        return [*level(mock_task("bench schema chain root", root_steps), "Bash,Read"), *root_extra]

    schema = spawn.schema_for_cli(json.loads((SPAWN.parent / "schemas" / f"{SCHEMA_CHAIN_SCHEMA}.json").read_text()))

    def bare(task: str, tools: str) -> list[str]:
        return [*bare_argv(cli, task, tools), "--json-schema", json.dumps(schema)]

    chains = [
        SchemaChain(
            "uv_schema_chain",
            "uv run spawn.py --schema depth-3 chain",
            chain(lambda task, tools: uv_level(SPAWN, task, tools), "--max-depth", "3"),
            "output",
        ),
        SchemaChain("bare_schema_chain", "claude -p --json-schema depth-3 chain", chain(bare), "structured_output"),
    ]
    if compare is not None:
        other = chain(lambda task, tools: uv_level(compare, task, tools), "--max-depth", "3")
        chains.insert(1, SchemaChain("compare_uv_schema_chain", "--compare: uv run spawn.py --schema chain", other, "output"))
    return chains


def check_structured(chain: SchemaChain, proc: Proc) -> None:
    """A chain counts only if the root exited 0 with the root's structured answer."""
    if proc.returncode != 0:
        raise BenchError(f"{chain.label} exited {proc.returncode}; stderr: {proc.stderr[-800:]}")
    got = last_json_line(proc.stdout).get(chain.answer_field)
    if got != schema_answer("root"):
        raise BenchError(f"{chain.label} answered {got!r}, expected {schema_answer('root')!r}; stdout: {proc.stdout[-500:]}")


def chain_segments(proc: Proc, main: Sequence[Mapping[str, Any]]) -> list[float]:
    """The run's wall time cut at its model requests (CHAIN_SEGMENTS), in seconds; a CLI's retry is not a cut."""
    times = sorted(float(r["time"]) for r in main if not (r.get("retry") or 0))
    marks = [proc.started, *times, proc.ended]
    return [b - a for a, b in itertools.pairwise(marks)]


def schema_chain_targets(bench: Bench) -> list[Target]:
    """P1s's row, and with --compare this spawn.py's chain against the other's."""
    s = bench.series
    if "uv_schema_chain" not in s or "bare_schema_chain" not in s:
        return [Target("depth-3 chain, every level `uv run spawn.py --schema` (not run)", math.nan, TARGET_CHAIN_RATIO, "x", "P1s")]
    this, bare = s["uv_schema_chain"].values(lambda x: x.seconds), s["bare_schema_chain"].values(lambda x: x.seconds)
    each = ", ".join(f"{t / b:.2f}x" for t, b in zip(this, bare, strict=True))
    chains = {c.key: c for c in bench.schema_chains}
    rows = [
        Target(
            f"depth-3 chain, every level `uv run spawn.py --schema {SCHEMA_CHAIN_SCHEMA}`, against `claude -p --json-schema` "
            f"({fmt(median(this), 's')} vs {fmt(median(bare), 's')}, +{median(this) - median(bare):.3f} s; rounds {each})",
            median(this) / median(bare),
            TARGET_CHAIN_RATIO,
            "x",
            "P1s",
            f"{short(chains['uv_schema_chain'].argv)}  vs  {short(chains['bare_schema_chain'].argv)}",
        )
    ]
    if "compare_uv_schema_chain" in s:
        rounds = list(zip(this, s["compare_uv_schema_chain"].values(lambda x: x.seconds), strict=True))
        rows.append(compare_target("P1s", "uv run --schema chain", rounds, f"--compare: {short(chains['compare_uv_schema_chain'].argv)}"))
    return rows


def print_schema_chain(bench: Bench) -> None:
    """Where P1s's time goes: each stage's median on each side, and the difference."""
    keys = [c.key for c in bench.schema_chains if c.key in bench.segments]
    if "bare_schema_chain" not in keys:
        return
    med = {k: [median([seg[i] for seg in bench.segments[k]]) for i in range(len(CHAIN_SEGMENTS) + 1)] for k in keys}
    rows = []
    for i, name in enumerate([*CHAIN_SEGMENTS, CHAIN_CPU]):
        rows.append(
            [
                name,
                *(fmt(med[k][i], "s") for k in keys),
                *(f"{med[k][i] - med['bare_schema_chain'][i]:+.3f} s" for k in keys if k != "bare_schema_chain"),
            ]
        )
    labels = {c.key: c.label.split(" depth-3")[0].split(" chain")[0] for c in bench.schema_chains}
    print()
    print("P1s: where the chain's time goes (medians of rounds; cut at the model requests the mock logs)")
    header = ["stage", *(labels[k] for k in keys), *(f"{labels[k]} - bare" for k in keys if k != "bare_schema_chain")]
    print(table(rows, header))


# ------------------------------------------------------------ dag overhead --

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


# ============================================ waitperf: issue 14, P3, P5, P7 ==
# Measurements of `wait` and `status` over synthetic sessions: records written
# with spawn.py's own helpers (this dev tool may import spawn), so no model or
# agent process is needed, except one `sleep` that stands in for live agents.

TARGET_P3_WAIT_MS = 20.0  # spawn.py wait: .done marker -> wait exited, median
TARGET_P3_MCP_MS = 5.0  # MCP agent_wait: .done marker -> result at the client, median
TARGET_P5_S = 1.0  # status / status --json over 10,000 records; wait over 1,000 done ids
TARGET_P7_CORE_PCT = 2.0  # CPU of `wait --all` over 1,000 live children, % of one core

# Before the CPU window opens, wait has this long to start and settle: its
# start-up and first look at every record are not what P7 measures.
P7_SETTLE_S = 3.0


class MarkerClock:
    """When a marker really appeared: a thread blocked on inotify stamps its IN_CREATE.

    A file's mtime comes from the kernel's coarse clock, which lags the real
    time by up to a tick (4.4 ms median measured here), so latencies from the
    mtime carry that lag; this stamp carries only the thread's wake-up delay.
    Linux only; elsewhere `seen_ns` stays None.
    """

    def __init__(self, directory: Path, name: str = ".done") -> None:
        self.name = name.encode()
        self.seen_ns: int | None = None
        self.fd = -1
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            self.fd = int(libc.inotify_init1(0o2000000))  # blocking, close-on-exec
            if self.fd >= 0 and libc.inotify_add_watch(self.fd, os.fsencode(directory), 0x100 | 0x80) < 0:
                os.close(self.fd)
                self.fd = -1
        self.thread = threading.Thread(target=self._run, daemon=True)
        if self.fd >= 0:
            self.thread.start()

    def _run(self) -> None:
        import struct

        with contextlib.suppress(OSError):
            while self.seen_ns is None:
                data = os.read(self.fd, 65536)
                now = time.time_ns()
                offset = 0
                while offset + 16 <= len(data):
                    length = struct.unpack_from("iIII", data, offset)[3]
                    if data[offset + 16 : offset + 16 + length].rstrip(b"\0") == self.name:
                        self.seen_ns = now
                    offset += 16 + length


@contextlib.contextmanager
def without_fsync() -> Iterator[None]:
    """Building 10,000 records with every fsync takes minutes; durability is not measured here."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def synthetic_session(root: Path, count: int, *, done: bool, pid: int) -> tuple[Path, list[str]]:
    """A session of one root agent and count-1 children, as spawn.py writes them.

    done: every agent has a committed outcome (and marker, and ledger line);
    else none has, and each has a fresh heartbeat, its process being pid
    (alive for as long as the caller keeps it so).
    """
    session = root / f"{'done' if done else 'live'}-{count}"
    (session / spawn.AGENTS_DIR).mkdir(parents=True)
    create_time = import_psutil().Process(pid).create_time()
    now = spawn.utc_now_iso()
    ids = ["a0-000000", *(f"a1-{i:06x}" for i in range(1, count))]
    with without_fsync():
        for agent_id in ids:
            d = session / spawn.AGENTS_DIR / agent_id
            d.mkdir()
            meta = spawn.AgentMeta(
                id=agent_id,
                parent_id=None if agent_id == ids[0] else ids[0],
                depth=0 if agent_id == ids[0] else 1,
                max_depth=3,
                pid=pid,
                create_time=create_time,
                pgid=pid,
                trace_id="1" * 32,
                span_id="2" * 16,
                traceparent=f"00-{'1' * 32}-{'2' * 16}-01",
                task=f"synthetic {agent_id}",
                tools=["Read"],
                disallowed_tools=[],
                model="sonnet",
                cwd=str(root),
                started_at=now,
                session=str(session),
                system_prompt="",
                background=True,
                pid_namespace=spawn.own_pid_namespace(),
            )
            spawn.write_meta(d, meta, [])
            if done:
                outcome = spawn.Outcome(
                    id=agent_id, status="done", reason="", exit_code=0, ended_at=now, duration_s=1.0, text="ok", cost_usd=0.001
                )
                spawn.commit_outcome(d, outcome, [])
            else:
                write_heartbeat(d, pid, create_time)
    return session, ids


def write_heartbeat(agent_dir: Path, pid: int, create_time: float) -> None:
    beat = spawn.Heartbeat(cli_pid=pid, cli_create_time=create_time, cli_pgid=pid, updated_at=time.time(), interval_s=spawn.HEARTBEAT_S)
    spawn.write_json_atomic(agent_dir / spawn.HEARTBEAT, spawn.record_to_json(beat))


def import_psutil() -> Any:
    import psutil

    return psutil


def p5_figures(env: Mapping[str, str], workdir: Path, timeout: float, *, records: int, wait_ids: int, rounds: int) -> dict[str, Any]:
    """P5: status, status --json over `records` done agents; wait over `wait_ids` done ids."""
    holder = subprocess.Popen(["sleep", "3600"])
    try:
        session, _ = synthetic_session(workdir / "p5-status", records, done=True, pid=holder.pid)
        wait_session, ids = synthetic_session(workdir / "p5-wait", wait_ids, done=True, pid=holder.pid)
    finally:
        holder.kill()
        holder.wait()
    py, spawn_py = sys.executable, str(SPAWN)
    # status keeps a cache of finished agents' rows (spawn.STATUS_CACHE): status_first
    # is the first status of a session (each round without the cache), taking the
    # rows the committers indexed (spawn.STATUS_INDEX); the next two are every later
    # one. status_records is a first status with the index lost too: every record read.
    commands = {
        "status_first": [py, spawn_py, "status", str(session)],
        "status": [py, spawn_py, "status", str(session)],
        "status_json": [py, spawn_py, "status", "--json", str(session)],
        "wait_done": [py, spawn_py, "wait", "--session", str(wait_session), "--all", *ids],
        "status_records": [py, spawn_py, "status", str(session)],
    }
    # The index takes only rows whose records settled (spawn.STATUS_CACHE_SETTLE_S) ago,
    # as it would for a session that finished a moment before.
    settled = max(f.stat().st_mtime for f in (session / spawn.AGENTS_DIR).glob(f"*/{spawn.OUTCOME}")) + spawn.STATUS_CACHE_SETTLE_S
    time.sleep(max(0.0, settled + 0.1 - time.time()))
    figures: dict[str, Any] = {}
    for key, argv in commands.items():
        secs = []
        for _ in range(rounds):
            if key in ("status_first", "status_records"):
                (session / spawn.STATUS_CACHE).unlink(missing_ok=True)
            if key == "status_records":
                (session / spawn.STATUS_INDEX).unlink(missing_ok=True)
            proc = run_process(argv, env, timeout, workdir)
            if proc.returncode != 0:
                raise BenchError(f"{key} exited {proc.returncode}: {proc.stderr[-800:]}")
            secs.append(proc.elapsed)
        shown = [*argv[:6], f"... ({len(ids)} ids)"] if key == "wait_done" else argv
        figures[key] = {"median_s": median(secs), "samples": secs, "command": shlex.join(shown)}
    return figures


def p7_figures(env: Mapping[str, str], workdir: Path, children: int, window_s: float, beats: bool) -> dict[str, Any]:
    """P7: CPU of `wait --all` over `children` live agents that never finish, during window_s.

    The children are records whose process is one `sleep` (alive, so wait
    must keep checking them); with beats, their heartbeats are refreshed
    every HEARTBEAT_S as live agents' are, spread evenly over the period. The window opens P7_SETTLE_S after
    wait starts; its start-up CPU is reported beside it.
    """
    psutil = import_psutil()
    holder = subprocess.Popen(["sleep", "3600"])
    stop = threading.Event()
    waiter: subprocess.Popen[bytes] | None = None
    try:
        session, ids = synthetic_session(workdir / "p7", children + 1, done=False, pid=holder.pid)
        create_time = psutil.Process(holder.pid).create_time()
        agents = [session / spawn.AGENTS_DIR / i for i in ids[1:]]

        def beat() -> None:
            # Spread over the period, as independent agents' beats are (no burst to coalesce).
            while not stop.is_set():
                for d in agents:
                    if stop.wait(spawn.HEARTBEAT_S / len(agents)):
                        return
                    write_heartbeat(d, holder.pid, create_time)

        if beats:
            threading.Thread(target=beat, daemon=True).start()
        argv = [
            sys.executable,
            str(SPAWN),
            "wait",
            "--session",
            str(session),
            "--all",
            "--timeout",
            str(P7_SETTLE_S + window_s + 30),
            *ids[1:],
        ]
        waiter = subprocess.Popen(
            argv, env=dict(env), cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        proc = psutil.Process(waiter.pid)
        time.sleep(P7_SETTLE_S)
        if waiter.poll() is not None:
            raise BenchError(
                f"wait over live children exited {waiter.returncode}: {waiter.stderr.read().decode()[-800:] if waiter.stderr else ''}"
            )
        start = proc.cpu_times()
        time.sleep(window_s)
        end = proc.cpu_times()
        if waiter.poll() is not None:
            raise BenchError(f"wait over live children exited {waiter.returncode} inside the window")
        used = (end.user + end.system) - (start.user + start.system)
        return {
            "cpu_s": used,
            "core_pct": 100 * used / window_s,
            "startup_cpu_s": start.user + start.system,
            "window_s": window_s,
            "children": children,
            "heartbeats": beats,
            "command": shlex.join([*argv[:8], f"... ({children} ids)"]),
        }
    finally:
        stop.set()
        if waiter is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(waiter.pid, signal.SIGKILL)
            waiter.wait()
        holder.kill()
        holder.wait()


def waitperf_report(
    env: Mapping[str, str], workdir: Path, args: argparse.Namespace, waits: Sequence[Mapping[str, float]], mcp: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Run P5 and P7, then print P3, P5 and P7 against their targets (issue 14)."""
    summary: dict[str, Any] = {}
    if args.status_records:
        print(f"P5: status over {args.status_records:,} records, wait over {args.wait_ids:,} done ids ...", flush=True)
        summary["p5"] = p5_figures(env, workdir, args.timeout, records=args.status_records, wait_ids=args.wait_ids, rounds=args.p5_rounds)
    if args.idle_children:
        print(f"P7: wait --all over {args.idle_children:,} live children, {args.idle_window:g} s window ...", flush=True)
        summary["p7"] = p7_figures(env, workdir, args.idle_children, args.idle_window, not args.idle_no_heartbeats)
    # P3 is timed from the marker's creation as an inotify watcher in this process saw it; the
    # figure from its mtime (the coarse clock, up to a tick early) is printed beside it.
    lat = [w["latency_ms"] for w in waits]
    seen = [w["from_created_ms"] for w in waits if not math.isnan(w.get("from_created_ms", math.nan))]
    targets = [Target("P3 spawn.py wait: .done created -> wait exited, median", median(seen), TARGET_P3_WAIT_MS, "ms")]
    if mcp is not None:
        mcp_seen = mcp.get("agent_wait_from_created_ms", [])
        targets.append(Target("P3 MCP agent_wait: .done created -> result at client, median", median(mcp_seen), TARGET_P3_MCP_MS, "ms"))
    if "p5" in summary:
        p5 = summary["p5"]
        targets += [
            Target(f"P5 first status over {args.status_records:,} records (no cache)", p5["status_first"]["median_s"], TARGET_P5_S, "s"),
            Target(f"P5 status over {args.status_records:,} records", p5["status"]["median_s"], TARGET_P5_S, "s"),
            Target(f"P5 status --json over {args.status_records:,} records", p5["status_json"]["median_s"], TARGET_P5_S, "s"),
            Target(f"P5 wait over {args.wait_ids:,} done ids", p5["wait_done"]["median_s"], TARGET_P5_S, "s"),
        ]
    if "p7" in summary:
        targets.append(
            Target(f"P7 wait --all over {args.idle_children:,} live children, CPU", summary["p7"]["core_pct"], TARGET_P7_CORE_PCT, "%")
        )
    print()
    print("wait and status (issue 14: P3, P5, P7)")
    for t in targets:
        verdict = "met" if t.met else "NOT met"
        value = f"{t.value:.2f} %" if t.unit == "%" else fmt(t.value, t.unit)
        limit = f"{t.limit:.2f} %" if t.unit == "%" else fmt(t.limit, t.unit)
        print(f"  {t.name:<58} {value:>10}  target <= {limit:<9} {verdict}")
    mtime_figures = f"spawn.py wait {fmt(median(lat), 'ms')}"
    if mcp is not None:
        mtime_figures += f", MCP agent_wait {fmt(median(mcp['agent_wait_latency_ms']), 'ms')}"
    print(f"  P3 from the .done marker's mtime instead (coarse clock): {mtime_figures}")
    if "status_records" in summary.get("p5", {}):
        lost = summary["p5"]["status_records"]["median_s"]
        print(f"  P5 first status with its index lost too (every record read): {fmt(lost, 's')}")
    for key, figure in summary.get("p5", {}).items():
        print(f"  {key}: {figure['command']}")
    if "p7" in summary:
        p7 = summary["p7"]
        print(f"  P7: {p7['cpu_s']:.3f} s CPU in {p7['window_s']:g} s (start-up before the window: {p7['startup_cpu_s']:.3f} s)")
        print(f"  P7: {p7['command']}")
    summary["targets"] = [{**vars(t), "met": t.met} for t in targets]
    return summary


def add_waitperf_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status-records", type=int, default=10_000, metavar="N", help="P5: agent records in the status session (0 skips P5)")
    p.add_argument("--wait-ids", type=int, default=1_000, metavar="N", help="P5: done ids one wait is given (default 1000)")
    p.add_argument("--p5-rounds", type=int, default=3, metavar="N", help="P5: runs of each command, median reported (default 3)")
    p.add_argument("--idle-children", type=int, default=1_000, metavar="N", help="P7: live children wait --all watches (0 skips P7)")
    p.add_argument("--idle-window", type=float, default=10.0, metavar="S", help="P7: seconds of CPU measured (default 10)")
    p.add_argument("--idle-no-heartbeats", action="store_true", help="P7: children never refresh their heartbeats")
    p.add_argument("--only-waitperf", action="store_true", help="only P3 (wait samples, MCP), P5 and P7: skip the chain rounds and dag")


# ======================================================== end of waitperf ==


# --------------------------------------------------------------- P8: cost --


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cost-leaves",
        type=int,
        default=16,
        metavar="N",
        help="P8: leaves of the fan-out priced (default 16; 0 skips)",
    )
    p.add_argument(
        "--cost-baseline",
        default=BASELINE_REF,
        metavar="REF_OR_PATH",
        help=f"P8: the spawn.py whose layout is the baseline, a path or a git revision (default {BASELINE_REF})",
    )


def cost_summary(args: argparse.Namespace, bench: Bench) -> dict[str, Any] | None:
    """P8 (tools/bench_cost.py, docs/prompt-cache.md): the trees' input cost with the prompt cache modelled."""
    if args.cost_leaves <= 0 or args.only_waitperf or args.only_chains:
        return None
    print(f"P8: input cost of a {args.cost_leaves}-leaf fan-out and the depth-3 chain, three ways ...", flush=True)
    timeout = max(args.timeout, 300.0)
    return p8_figures(
        bench.cli, bench.env, bench.workdir, bench.mock, timeout=timeout, leaves=args.cost_leaves, baseline=args.cost_baseline
    )


# --------------------------------------------------------------------- main --


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=5, metavar="N", help="interleaved rounds of the timed runs (default 5)")
    p.add_argument("--wait-samples", type=int, default=10, metavar="N", help="spawn.py wait latency samples (default 10)")
    p.add_argument(
        "--mcp-samples", type=int, default=7, metavar="N", help="tools/mcp_server.py samples, if mcp is installed (default 7; 0 skips)"
    )
    p.add_argument("--json", metavar="FILE", help="also write a JSON summary to FILE")
    p.add_argument("--gateway-rounds", type=int, default=5, metavar="N", help="P11's interleaved rounds (default 5; 0 skips)")
    p.add_argument("--only-gateway", action="store_true", help="P11 only: time to first byte through the gateway / direct")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="limit for any one run (default 120)")
    p.add_argument(
        "--pycache",
        choices=["inherit", "private"],
        default="inherit",
        help="'inherit' the caller's bytecode settings, or use a warm 'private' cache in the temp dir (as after a normal install)",
    )
    p.add_argument("--dag-rounds", type=int, default=1, metavar="N", help="rounds of the dag runner overhead figure (default 1; 0 skips)")
    p.add_argument("--fanout", type=int, default=16, metavar="N", help="P1b: background leaves from one parent (default 16; 0 skips)")
    p.add_argument(
        "--fanout-rounds", type=int, default=3, metavar="N", help="P1b: interleaved rounds of both sides, medians reported (default 3)"
    )
    p.add_argument(
        "--memory-agents", type=int, default=32, metavar="N", help="P6: concurrent agents whose memory is summed (default 32; 0 skips)"
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="SPAWN_PY",
        help="also run P1's chain and P1b's fan-out through this other copy of spawn.py (with schemas/ beside it), "
        "in the same interleaved rounds, and hold this/that to <= 1.05x; with --only-chains it takes minutes",
    )
    p.add_argument(
        "--only-chains",
        action="store_true",
        help="only P1's chains and P1b's fan-out: skip the start-up profile, P2, P3 wait samples, MCP, P5, P6, P7 and dag",
    )
    p.add_argument(
        "--inprocess-rounds", type=int, default=9, metavar="N", help="P10: interleaved rounds of the in-process chain (default 9; 0 skips)"
    )
    p.add_argument("--only-inprocess", action="store_true", help="only P10: the in-process chain against native subagents")
    p.add_argument(
        "--only-schema-chain",
        action="store_true",
        help="only P1s: the depth-3 chain with every level `uv run spawn.py --schema`, against claude -p --json-schema (and --compare's)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (sessions, mock log) and print its path")
    p.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    add_cost_args(p)
    add_waitperf_args(p)
    args = p.parse_args(argv)
    if args.repeat < 1 or args.wait_samples < 0:
        p.error("--repeat must be >= 1 and --wait-samples >= 0")
    if args.only_chains and args.only_waitperf:
        p.error("--only-chains and --only-waitperf measure nothing in common: give one")
    if args.compare is not None:
        args.compare = args.compare.resolve()  # the runs' working directory is the temp dir
        if not args.compare.is_file():
            p.error(f"--compare {args.compare}: no such file; give the path of another spawn.py")
    if args.only_chains:
        args.wait_samples = args.mcp_samples = args.memory_agents = args.dag_rounds = args.status_records = args.idle_children = 0
    return args


def measure_all(
    args: argparse.Namespace, bench: Bench, uv: UvFound, *, env: dict[str, str], warm_env: dict[str, str], started: float
) -> dict[str, Any]:
    """Every measurement but P10, as main() ran them before P10 had a function of its own."""
    workdir = bench.workdir
    if not args.only_waitperf:
        bench.warm_up()
        schema_chain_warm_up(bench, args.compare)
    for i in range(0 if args.only_waitperf else args.repeat):
        print(f"round {i + 1}/{args.repeat} ...", flush=True)
        bench.round(i)
    if args.wait_samples:
        print(f"wait latency: {args.wait_samples} samples ...", flush=True)
    samples = [bench.wait_sample(i) for i in range(args.wait_samples)]
    # A sample where wait started too late would time its start-up, not its latency.
    waits = [w for w in samples if w["head_start_s"] >= WAIT_MIN_HEAD_START_S and w["wait_status_ok"]]
    if len(waits) < len(samples):
        print(f"dropped {len(samples) - len(waits)} wait sample(s): wait not polling early enough, or agent not done")
    mcp = None
    if args.mcp_samples and importlib.util.find_spec("mcp") is not None:
        print(f"MCP server: {args.mcp_samples} samples ...", flush=True)
        mcp = mcp_samples(env, workdir, args.mcp_samples, args.timeout)
    fan = None
    memory: dict[str, FanOut] = {}
    if args.fanout > 0 and not args.only_waitperf:
        print(f"fan-out: {args.fanout} background leaves vs {args.fanout} bare claude -p ...", flush=True)
        fan = fanout_rounds(bench, args.fanout, args.fanout_rounds, args.compare)
        if not args.only_chains:
            # The start slots' saving, side by side: every CLI start-up at once.
            fan.no_slots_s = fanout(bench, args.fanout, 0.0, {**bench.env, "SPAWN_START_SLOTS": "0"}, bare=False).spawn_s
    if args.memory_agents > 0 and not args.only_waitperf:
        # The leaves sleep, so all of them are alive at once when memory peaks.
        print(f"memory: {args.memory_agents} concurrent agents, with and without the fork server ...", flush=True)
        memory["with fork server"] = fanout(bench, args.memory_agents, MEMORY_LEAF_SLEEP_S, pss=True)
        no_server = {**bench.env, "SPAWN_NO_FORKSERVER": "1"}
        memory["SPAWN_NO_FORKSERVER=1"] = fanout(bench, args.memory_agents, MEMORY_LEAF_SLEEP_S, no_server, bare=False, pss=True)
    summary = {"targets": []} if args.only_waitperf else report(bench, waits, args, time.monotonic() - started, fan=fan, memory=memory)
    summary["uv"] = asdict(uv)
    if (p8 := cost_summary(args, bench)) is not None:
        summary["p8"] = p8
        summary["targets"] += p8["targets"]
    summary["schema_chain_segments"] = {"stages": [*CHAIN_SEGMENTS, CHAIN_CPU], **bench.segments}
    if args.dag_rounds > 0 and not args.only_waitperf:
        summary["dag"] = dag_overhead(warm_env, workdir, args.timeout, args.dag_rounds)
    if mcp is not None:
        spawn_wait = median([w["latency_ms"] for w in waits]) if waits else math.nan
        to_process, mcp_wait = median(mcp["spawn_to_process_ms"]), median(mcp["agent_wait_latency_ms"])
        print("\nMCP server (tools/mcp_server.py over stdio), medians")
        print(f"  spawn_agent -> agent process started     {fmt(to_process, 'ms')}")
        print(f"  agent_wait: .done -> result at client    {fmt(mcp_wait, 'ms')}  (spawn.py wait: {fmt(spawn_wait, 'ms')})")
        summary["mcp"] = {**mcp, "median_spawn_to_process_ms": to_process, "median_agent_wait_ms": mcp_wait}
    if not args.only_chains:
        summary["waitperf"] = waitperf_report(env, workdir, args, waits, mcp)
        summary["targets"] += summary["waitperf"]["targets"]
    return summary


# P11: time to first byte through the tree's gateway over direct to the scripted
# model, with GATEWAY_STREAMS concurrent streams of GATEWAY_TOKENS output tokens
# spread over GATEWAY_STREAM_S each, the two sides interleaved round by round.
GATEWAY_STREAMS = 16
GATEWAY_TOKENS = 20_000
GATEWAY_STREAM_S = 2.0
TARGET_GATEWAY_RATIO = 1.05
GATEWAY_CPU_AIM = 0.05  # of a core, while streaming
GATEWAY_RSS_AIM_MB = 60.0


def first_byte_s(url: str, key: str, task: str) -> float:
    """Seconds to the first body byte of one streamed /v1/messages answer; the rest is read and dropped."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"model": "claude-sonnet-5-5", "max_tokens": 32000, "stream": True, "tools": [{"name": "Bash"}],
                       "messages": [{"role": "user", "content": task}]})  # fmt: skip
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)
    started = time.monotonic()
    conn.request("POST", "/v1/messages", body=body, headers={"content-type": "application/json", "x-api-key": key})
    response = conn.getresponse()
    response.read(1)
    first = time.monotonic() - started
    while response.read(1 << 16):
        pass
    conn.close()
    return first


def stream_into(results: list[float], url: str, key: str, task: str) -> None:
    results.append(first_byte_s(url, key, task))


def gateway_rounds(mock_url: str, workdir: Path, rounds: int, streams: int = GATEWAY_STREAMS) -> Target:
    """P11: a gateway (spawn.py _gateway) for a session without a budget, and streams through it and direct, interleaved."""
    import psutil

    session = workdir / "p11-session"
    (session / "agents").mkdir(parents=True, exist_ok=True)
    agent_key = spawn.mint_credential(session, "a0-bench")
    env = {**os.environ, "ANTHROPIC_BASE_URL": mock_url, "ANTHROPIC_API_KEY": "sk-ant-bench-0000000000000000"}
    gateway = subprocess.Popen(
        [sys.executable, str(SPAWN), "_gateway", str(session)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert gateway.stdin is not None and gateway.stdout is not None
    gateway.stdin.write(json.dumps({"credential": {"ANTHROPIC_API_KEY": env["ANTHROPIC_API_KEY"]}, "upstream": mock_url}).encode() + b"\n")
    gateway.stdin.close()
    url = gateway.stdout.readline().decode().strip()
    task = mock_task("p11", [{"text": "stream", "filler": GATEWAY_TOKENS, "stream_s": GATEWAY_STREAM_S}])
    sides: dict[str, list[float]] = {"gateway": [], "direct": []}
    # The first call through a new gateway pays its one-time set-up (a tree's first call, once): not measured.
    first_byte_s(url, agent_key, mock_task("p11-warm", [{"text": "warm"}]))
    process = psutil.Process(gateway.pid)
    cpu_before, rss_peak, busy_s = process.cpu_times(), 0, 0.0
    try:
        for n in range(rounds):
            for side in ("gateway", "direct") if n % 2 == 0 else ("direct", "gateway"):
                target, key = (url, agent_key) if side == "gateway" else (mock_url, env["ANTHROPIC_API_KEY"])
                results: list[float] = []
                threads = [threading.Thread(target=stream_into, args=(results, target, key, task)) for _ in range(streams)]
                started = time.monotonic()
                for thread in threads:
                    thread.start()
                while any(t.is_alive() for t in threads):
                    rss_peak = max(rss_peak, process.memory_info().rss) if side == "gateway" else rss_peak
                    time.sleep(0.05)
                if side == "gateway":
                    busy_s += time.monotonic() - started
                sides[side].append(median(results))
        cpu_after = process.cpu_times()
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)
    cpu_share = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / busy_s if busy_s else math.nan
    ratio = median(sides["gateway"]) / median(sides["direct"])
    print(
        f"P11: {streams} streams of {GATEWAY_TOKENS} tokens over {GATEWAY_STREAM_S:g} s; time to first byte, medians of {rounds} rounds: "
        f"gateway {fmt(median(sides['gateway']) * 1000, 'ms')}, direct {fmt(median(sides['direct']) * 1000, 'ms')}; "
        f"gateway CPU {cpu_share:.1%} of a core while streaming (aim < {GATEWAY_CPU_AIM:.0%}), "
        f"peak RSS {rss_peak / 1e6:.1f} MB (aim < {GATEWAY_RSS_AIM_MB:g} MB)",
        flush=True,
    )
    return Target("time to first byte, through the gateway / direct", ratio, TARGET_GATEWAY_RATIO, "x", "P11", "bench --only-gateway")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only_schema_chain:
        return schema_chain_main(args)
    try:
        cli = spawn.find_cli({})  # the bundled CLI, as the spawned agents use it (SPAWN_CLI is not passed on)
    except spawn.UsageError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="spawn-bench-"))
    started = time.monotonic()
    try:
        with serve(workdir) as mock:
            uv, env = find_uv(bench_environment(os.environ, workdir, mock.url, args.pycache), workdir)
            warm_env = {**env, **private_pycache(workdir)}
            commands = Commands.build(cli, args.compare)
            bench = Bench(cli, env, warm_env, workdir, mock, args.timeout, commands, only_chains=args.only_chains)
            bench.schema_chains = schema_chains(cli, args.compare)
            print(f"spawn.py bench: {sys.executable}, CLI {cli}, mock {mock.url}", flush=True)
            print(uv.describe(), flush=True)
            if args.compare is not None:
                print(f"--compare: {args.compare} against {SPAWN}", flush=True)
            only = args.only_inprocess or args.only_gateway
            summary = {"targets": []} if only else measure_all(args, bench, uv, env=env, warm_env=warm_env, started=started)
            if args.gateway_rounds > 0 and not args.only_inprocess:
                p11 = gateway_rounds(mock.url, workdir, args.gateway_rounds)
                summary["targets"].append({**vars(p11), "met": p11.met})
            if args.inprocess_rounds > 0 and not args.only_waitperf and not args.only_chains and not args.only_gateway:
                print(f"P10: in-process chain, {args.inprocess_rounds} rounds ...", flush=True)
                p10 = inprocess_chain_rounds(bench, args.inprocess_rounds)
                target = p10.pop("target")
                summary["p10"] = p10
                summary["targets"].append({**vars(target), "met": target.met})
    except (BenchError, ServeError, CostBenchError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if args.check and not all(t["met"] for t in summary["targets"]):
        return 1
    return 0


def schema_chain_warm_up(bench: Bench, compare: Path | None) -> None:
    """uv's environment for each script, and its compiled copy (made by a run from source): one-time costs, not measured."""
    for script in (SPAWN, *([compare] if compare else [])):
        argv = ["uv", "run", str(script), "--task", mock_task("warm", LEAF_STEPS), "--tools", "Read", "--schema", SCHEMA_CHAIN_SCHEMA]
        run_process(argv, bench.env, bench.timeout, bench.workdir)
    bench.mock.new_requests()


def schema_chain_main(args: argparse.Namespace) -> int:
    """--only-schema-chain: P1s's interleaved rounds and its report, nothing else."""
    try:
        cli = spawn.find_cli({})
    except spawn.UsageError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="spawn-bench-"))
    started = time.monotonic()
    try:
        with serve(workdir) as mock:
            uv, env = find_uv(bench_environment(os.environ, workdir, mock.url, args.pycache), workdir)
            bench = Bench(cli, env, {**env, **private_pycache(workdir)}, workdir, mock, args.timeout, Commands.build(cli, args.compare))
            bench.schema_chains = schema_chains(cli, args.compare)
            print(f"spawn.py bench, P1s only: {sys.executable}, CLI {cli}, mock {mock.url}", flush=True)
            print(uv.describe(), flush=True)
            print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs", flush=True)
            schema_chain_warm_up(bench, args.compare)
            for i in range(args.repeat):
                print(f"round {i + 1}/{args.repeat} ...", flush=True)
                bench.schema_round(i)
            print_schema_chain(bench)
            targets = schema_chain_targets(bench)
            print()
            print(
                table(
                    [[t.id, t.name, fmt(t.value, t.unit), t.limit_text(), "met" if t.met else "NOT met"] for t in targets],
                    ["id", "target", "value", "limit", "verdict"],
                    left=2,
                )
            )
            print("Commands:")
            for t in targets:
                print(f"  {t.id:<4} {t.command}")
            print(f"\n(total {time.monotonic() - started:.0f} s, {args.repeat} rounds, load now {os.getloadavg()[0]:.2f})")
            summary = {
                "series": {
                    k: {"label": v.label, "median_s": median(v.values(lambda x: x.seconds)), "samples": [vars(x) for x in v.samples]}
                    for k, v in bench.series.items()
                },
                "schema_chain_segments": {"stages": [*CHAIN_SEGMENTS, CHAIN_CPU], **bench.segments},
                "targets": [{**vars(t), "met": t.met} for t in targets],
                "uv": asdict(uv),
            }
    except (BenchError, ServeError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if args.check and not all(t.met for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())

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
"""P8: what a tree's input costs at list prices, with the prompt cache modelled.

The scripted model (tools/mock_model.py) keeps the Messages API's prompt
cache, so a tree's agents pay what the API would charge them: full price for
plain input, a tenth for what they read from the cache, 1.25 times for what
they write to it (2 times for a 1-hour entry). This measures, from the
agents' own recorded usage (each spawn.py agent's transcript; for bare
``claude -p``, the usage the model answered, which is what the CLI records):

- the 16-leaf fan-out (one spawn.py parent starting its leaves with
  ``--background``, then ``wait --all``), run through this spawn.py, through
  the baseline spawn.py (the layout that put each agent's id, deadline and
  budget in its system prompt), and as 16 bare ``claude -p`` with the same
  tools, task and model, all at once;
- the depth-3 chain (spawn.py root -> child -> grandchild), the same three ways.

For each: how many leaves read the shared head (tools and system prompt)
from the cache on their first request, the input cost of every agent's first
request, and of all their requests. Targets (fan-out): at least 12 of 16
leaves read the head; the tree's first-request input cost is at most half the
baseline's. docs/prompt-cache.md explains how to read the table.

Run alone (few rounds; the interpreter needs spawn.py's dependencies)::

    python tools/bench_cost.py [--leaves 16] [--baseline REF_OR_PATH] [--json out.json]

``--start-slots 0 --gateway`` runs the spawn.py trees with every CLI start-up at
once and through the tree's gateway, whose stagger (SPAWN_GATEWAY_STAGGER_S) is
then what lets the leaves read the head.

``tools/bench.py`` runs it as P8 (``--cost-leaves 0`` skips it there).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from mock_model import Served, mock_task, serve, spawn_in_bash  # noqa: E402

import spawn  # noqa: E402

# The last commit whose agents carry their own facts (id, deadline, time
# left, budget) in the system prompt: the baseline layout, taken from git
# when no other spawn.py is given.
BASELINE_REF = "69401ab"
TARGET_LEAVES_READING = 12 / 16  # share of the fan-out's leaves that read the shared head
TARGET_FIRST_COST_RATIO = 0.5  # tree's first-request input cost, this layout over the baseline
ONE_HOUR_WRITE_FACTOR = 2.0  # a 1-hour cache write costs twice the input price (5-minute: CACHE_WRITE_FACTOR)
LEAF_TOOLS = "Read"
LEAF_STEPS: list[dict[str, Any]] = [{"text": "leaf-result"}]
FAKE_API_KEY = "bench-not-a-real-key"


class CostBenchError(RuntimeError):
    """A run did not do what P8 needs (its figures would be meaningless)."""


# ------------------------------------------------------------------ pricing --


def _count(usage: Mapping[str, Any], key: str) -> float:
    value = usage.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


def input_usd(model: str, usage: Mapping[str, Any]) -> float:
    """The input side of one turn at list price: plain, read from and written to the cache."""
    split = usage.get("cache_creation")
    one_hour = _count(split, "ephemeral_1h_input_tokens") if isinstance(split, Mapping) else 0.0
    written = _count(usage, "cache_creation_input_tokens")
    tokens = (
        _count(usage, "input_tokens")
        + spawn.CACHE_READ_FACTOR * _count(usage, "cache_read_input_tokens")
        + spawn.CACHE_WRITE_FACTOR * max(0.0, written - one_hour)
        + ONE_HOUR_WRITE_FACTOR * one_hour
    )
    return tokens * spawn.price_per_mtok(model)[0] / 1e6


@dataclass
class Agent:
    """One agent's model turns, oldest first: (model, usage)."""

    id: str
    depth: int
    turns: list[tuple[str, dict[str, Any]]]
    head_tokens: int = 0
    """Tokens of its tools and system prompt (the mock's count), 0 when unknown."""

    @property
    def reads_head(self) -> bool:
        """Its first request read at least its whole head from the cache."""
        first = self.turns[0][1] if self.turns else {}
        return self.head_tokens > 0 and _count(first, "cache_read_input_tokens") >= self.head_tokens


@dataclass
class TreeCost:
    """P8's figures for one way of running a tree."""

    label: str
    command: str
    agents: int = 0
    leaves: int = 0
    leaves_reading_head: int = 0
    first_input_usd: float = 0.0
    """Every agent's first request, input side."""
    leaf_first_input_usd: float = 0.0
    input_usd: float = 0.0
    """Every request of every agent, input side."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Tree totals: input, cache read, cache write."""


def tree_cost(label: str, command: str, agents: Sequence[Agent], leaf_depth: int) -> TreeCost:
    cost = TreeCost(label, command, agents=len(agents))
    totals = {"input": 0, "cache read": 0, "cache write": 0}
    for agent in agents:
        leaf = agent.depth == leaf_depth
        first = input_usd(*agent.turns[0]) if agent.turns else 0.0
        cost.first_input_usd += first
        cost.input_usd += sum(input_usd(model, usage) for model, usage in agent.turns)
        for _, usage in agent.turns:
            totals["input"] += int(_count(usage, "input_tokens"))
            totals["cache read"] += int(_count(usage, "cache_read_input_tokens"))
            totals["cache write"] += int(_count(usage, "cache_creation_input_tokens"))
        if leaf:
            cost.leaves += 1
            cost.leaves_reading_head += agent.reads_head
            cost.leaf_first_input_usd += first
    cost.tokens = totals
    return cost


# ------------------------------------------------------------------ running --


def environment(base: Mapping[str, str], workdir: Path, url: str) -> dict[str, str]:
    """A user's shell pointed at the mock: private HOME and session root, nothing inherited that steers spawn.py or the CLI."""
    env = {k: v for k, v in base.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE")) and k != "TRACEPARENT"}
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        SPAWN_SESSION_ROOT=str(workdir / "sessions"),
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY=FAKE_API_KEY,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


def run(argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float) -> dict[str, Any]:
    """Run a tree's root to its end; its last JSON line (spawn.py's result, claude -p's)."""
    try:
        proc = subprocess.run(list(argv), env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CostBenchError(f"{shlex.join(argv)[:200]} timed out after {timeout:g} s") from exc
    for line in reversed(proc.stdout.splitlines()):
        if line.strip().startswith("{"):
            data = json.loads(line)
            if proc.returncode == 0 and isinstance(data, dict):
                return data
    raise CostBenchError(f"{shlex.join(argv)[:200]} exited {proc.returncode}: {proc.stderr[-800:]}")


def is_leaf_request(record: Mapping[str, Any]) -> bool:
    """In P8's trees only the leaves have no Bash (the CLI adds tools of its own to the list)."""
    return "Bash" not in (record.get("tools") or [])


def heads(records: Sequence[Mapping[str, Any]]) -> dict[bool, int]:
    """Head tokens of leaves (True) and of the others, from the mock's first main requests."""
    found: dict[bool, list[int]] = {}
    for r in records:
        if r.get("kind") == "main" and r.get("first") and r.get("status") == 200:
            found.setdefault(is_leaf_request(r), []).append(int(r.get("head_tokens") or 0))
    return {leaf: int(statistics.median(sizes)) for leaf, sizes in found.items()}


def session_agents(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[Agent]:
    """The agents of the session a spawn.py root ran in, with their transcripts' turns."""
    session = Path(str(result["agent_dir"])).parent.parent
    head = heads(records)
    agents = []
    for agent_dir in sorted((session / "agents").iterdir()):
        meta = json.loads((agent_dir / "meta.json").read_text())
        turns = spawn.transcript_turns(agent_dir, str(meta.get("model", "")))
        size = head.get("Bash" not in meta.get("tools", []), 0)
        agents.append(Agent(str(meta["id"]), int(meta.get("depth", 0)), turns, size))
    return agents


def request_agents(records: Sequence[Mapping[str, Any]], leaf_depth: int) -> list[Agent]:
    """Bare claude -p agents, from the mock's log: one per CLI session; leaves at leaf_depth, the others at 0."""
    by_session: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "main" and r.get("status") == 200 and isinstance(r.get("usage"), dict):
            by_session.setdefault(str(r.get("session")), []).append(r)
    agents = []
    for session, asked in by_session.items():
        asked.sort(key=lambda r: float(r["time"]))
        turns = [(str(r.get("model")), dict(r["usage"])) for r in asked]
        depth = leaf_depth if is_leaf_request(asked[0]) else 0
        agents.append(Agent(session, depth, turns, int(asked[0].get("head_tokens") or 0)))
    return agents


@dataclass
class Runner:
    """Runs P8's trees against one scripted model."""

    cli: Path
    env: dict[str, str]
    workdir: Path
    mock: Served
    timeout: float
    model: str = ""
    """The model spawn.py's agents ran, given to bare claude -p too (prices differ by model)."""
    spawn_env: dict[str, str] = field(default_factory=dict)
    """Set for the spawn.py trees only (both scripts): SPAWN_START_SLOTS, SPAWN_GATEWAY."""

    def fanout_task(self, leaves: int) -> str:
        leaf = shlex.quote(f"MOCK{json.dumps(LEAF_STEPS)}MOCK")
        start = spawn_in_bash("--tools", LEAF_TOOLS, "--background", "--print", "id")
        script = (
            f'd=$(mktemp -d); for i in $(seq {leaves}); do {start} --task "fan-out leaf $i "{leaf} > "$d/$i" & done; wait; '
            f'{spawn_in_bash("wait", "--all")} $(cat "$d"/*) > /dev/null'
        )
        return mock_task(f"cost fan-out root {leaves}", [{"bash": script}, {"text": "root-result"}])

    def chain_task(self) -> str:
        leaf = mock_task("cost chain leaf", LEAF_STEPS)
        middle = mock_task("cost chain middle", [{"bash": spawn_in_bash("--task", leaf, "--tools", LEAF_TOOLS)}, {"text": "middle-result"}])
        return mock_task(
            "cost chain root", [{"bash": spawn_in_bash("--task", middle, "--tools", f"Bash,{LEAF_TOOLS}")}, {"text": "root-result"}]
        )

    def spawn_tree(self, label: str, script: Path, task: str, max_depth: int, leaf_depth: int) -> TreeCost:
        argv = [sys.executable, str(script), "--task", task, "--tools", f"Bash,{LEAF_TOOLS}", "--max-depth", str(max_depth)]
        self.mock.new_requests()
        result = run(argv, {**self.env, **self.spawn_env}, self.workdir, self.timeout)
        records = self.mock.new_requests()
        agents = session_agents(result, records)
        self.model = self.model or next((m for a in agents for m, _ in a.turns), "")
        if any(not a.turns for a in agents):
            raise CostBenchError(f"{label}: an agent made no model turn: {[a.id for a in agents if not a.turns]}")
        settings = "".join(f"{k}={v} " for k, v in sorted(self.spawn_env.items()))
        command = f"{settings}{shlex.join(argv[:2])} --task '<tree script>' --tools Bash,{LEAF_TOOLS} --max-depth {max_depth}"
        return tree_cost(label, command, agents, leaf_depth)

    def bare(self, *task: str) -> list[str]:
        argv = [str(self.cli), "-p", *task, "--output-format", "json", "--tools", LEAF_TOOLS, "--allowedTools", LEAF_TOOLS]
        return argv + (["--model", self.model] if self.model else [])

    def bare_fanout(self, leaves: int) -> TreeCost:
        """`leaves` bare claude -p at once: nothing staggers them, as a script starting them in a loop wouldn't."""
        argvs = [self.bare(mock_task(f"fan-out leaf {i + 1}", LEAF_STEPS)) for i in range(leaves)]
        self.mock.new_requests()
        running = [
            subprocess.Popen(a, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for a in argvs
        ]
        codes = [p.wait(self.timeout) for p in running]
        for p in running:
            if p.stderr is not None:
                p.stderr.close()
        if any(codes):
            raise CostBenchError(f"bare fan-out: exit codes {codes}")
        agents = request_agents(self.mock.new_requests(), 1)
        return tree_cost(f"{leaves} x bare claude -p", f"{leaves} x {shlex.join(argvs[0][:2])} ... --tools {LEAF_TOOLS} at once", agents, 1)

    def bare_chain(self) -> TreeCost:
        leaf = mock_task("cost chain leaf", LEAF_STEPS)
        middle = mock_task("cost chain middle", [{"bash": shlex.join(self.bare(leaf))}, {"text": "middle-result"}])
        root = mock_task("cost chain root", [{"bash": shlex.join(self.bare_with_bash(middle))}, {"text": "root-result"}])
        self.mock.new_requests()
        run(self.bare_with_bash(root), self.env, self.workdir, self.timeout)
        agents = request_agents(self.mock.new_requests(), 2)
        return tree_cost("bare claude -p chain", "claude -p ... (root and middle with Bash,Read; leaf Read)", agents, 2)

    def bare_with_bash(self, task: str) -> list[str]:
        argv = self.bare(task)
        for flag in ("--tools", "--allowedTools"):
            argv[argv.index(flag) + 1] = f"Bash,{LEAF_TOOLS}"
        return argv


# ---------------------------------------------------------------- P8 itself --


def baseline_script(given: str, workdir: Path) -> Path:
    """The baseline spawn.py: a file, or spawn.py at a git revision of this checkout (with schemas/ beside it)."""
    path = Path(given)
    if path.is_file():
        return path.resolve()
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{given}:spawn.py"], capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        raise CostBenchError(
            f"no spawn.py at {given!r} in git ({shown.stderr.strip()[:200]}); give the path of an older spawn.py as the baseline"
        )
    script = workdir / "baseline" / "spawn.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(shown.stdout)
    shutil.copytree(ROOT / "schemas", script.parent / "schemas", dirs_exist_ok=True)
    return script


@dataclass
class P8:
    """P8's figures: the fan-out and the chain, each this spawn.py, the baseline, bare claude -p."""

    leaves: int
    fanout: list[TreeCost]
    chain: list[TreeCost]
    baseline: str

    @property
    def leaves_reading_share(self) -> float:
        this = self.fanout[0]
        return this.leaves_reading_head / this.leaves if this.leaves else float("nan")

    def first_cost_ratio(self, trees: Sequence[TreeCost]) -> float:
        return trees[0].first_input_usd / trees[1].first_input_usd if trees[1].first_input_usd else float("nan")

    def targets(self) -> list[tuple[str, float, float, bool]]:
        """(what, value, limit, met) of P8's two targets; the share of leaves is >=, the ratio <=."""
        share, ratio = self.leaves_reading_share, self.first_cost_ratio(self.fanout)
        return [
            (
                f"{self.leaves}-leaf fan-out: leaves reading the shared head, share",
                share,
                TARGET_LEAVES_READING,
                share >= TARGET_LEAVES_READING,
            ),
            (
                f"{self.leaves}-leaf fan-out: first-request input cost, this / baseline",
                ratio,
                TARGET_FIRST_COST_RATIO,
                ratio <= TARGET_FIRST_COST_RATIO,
            ),
        ]


def measure(runner: Runner, leaves: int, baseline: Path, label: str) -> P8:
    """Each tree three ways; the cache's clock jumps past every TTL between runs, so each starts cold."""
    trees: list[TreeCost] = []

    def cold() -> None:
        runner.mock.advance_clock(2 * 3600)

    for what, script in (("this spawn.py", SPAWN), (f"baseline spawn.py ({label})", baseline)):
        cold()
        trees.append(runner.spawn_tree(f"{what}: fan-out", script, runner.fanout_task(leaves), 1, 1))
    cold()
    trees.append(runner.bare_fanout(leaves))
    chain: list[TreeCost] = []
    for what, script in (("this spawn.py", SPAWN), (f"baseline spawn.py ({label})", baseline)):
        cold()
        chain.append(runner.spawn_tree(f"{what}: depth-3 chain", script, runner.chain_task(), 3, 2))
    cold()
    chain.append(runner.bare_chain())
    return P8(leaves, trees, chain, label)


def usd(value: float) -> str:
    return f"${value:.6f}"


def report(p8: P8) -> dict[str, Any]:
    """Print P8's table and targets; the JSON summary."""
    print(f"\nP8: input cost at list prices, from the agents' recorded usage (prompt cache modelled; baseline {p8.baseline})")
    header = ["tree", "leaves reading head", "first requests", "of which leaves", "all requests", "tokens in / read / write"]
    rows = []
    for tree in [*p8.fanout, *p8.chain]:
        tokens = " / ".join(f"{tree.tokens.get(k, 0):,}" for k in ("input", "cache read", "cache write"))
        reading = f"{tree.leaves_reading_head}/{tree.leaves}"
        rows.append([tree.label, reading, usd(tree.first_input_usd), usd(tree.leaf_first_input_usd), usd(tree.input_usd), tokens])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print(f"chain first-request input cost, this / baseline: {p8.first_cost_ratio(p8.chain):.2f}x")
    for what, value, limit, met in p8.targets():
        sign = ">=" if "share" in what else "<="
        print(f"P8  {what}: {value:.2f} (target {sign} {limit:.2f}): {'met' if met else 'NOT met'}")
    print("Commands:")
    for tree in [*p8.fanout, *p8.chain]:
        print(f"  {tree.label}: {tree.command}")
    return {
        "leaves": p8.leaves,
        "baseline": p8.baseline,
        "fanout": [asdict(t) for t in p8.fanout],
        "chain": [asdict(t) for t in p8.chain],
        "chain_first_cost_ratio": p8.first_cost_ratio(p8.chain),
        "targets": [{"id": "P8", "name": w, "value": v, "limit": lim, "met": m, "measured": True} for w, v, lim, m in p8.targets()],
    }


def spawn_settings(start_slots: int | None, gateway: bool) -> dict[str, str]:
    """The environment the spawn.py trees run with: start slots (None: spawn.py's default) and the tree's gateway."""
    return {
        **({"SPAWN_START_SLOTS": str(start_slots)} if start_slots is not None else {}),
        **({"SPAWN_GATEWAY": "1"} if gateway else {}),
    }


def p8_figures(
    cli: Path,
    env: Mapping[str, str],
    workdir: Path,
    mock: Served,
    *,
    timeout: float,
    leaves: int,
    baseline: str,
    start_slots: int | None = None,
    gateway: bool = False,
) -> dict[str, Any]:
    """P8 against a running scripted model (tools/bench.py's), printed; the JSON summary."""
    runner = Runner(cli, dict(env), workdir, mock, timeout, spawn_env=spawn_settings(start_slots, gateway))
    summary = report(measure(runner, leaves, baseline_script(baseline, workdir), baseline))
    return {**summary, "settings": runner.spawn_env}


def add_setting_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """--start-slots and --gateway (bench.py: --cost-start-slots, --cost-gateway)."""
    p.add_argument(
        f"--{prefix}start-slots",
        type=int,
        default=None,
        metavar="N",
        help="P8: SPAWN_START_SLOTS for the spawn.py trees (default: spawn.py's own; 0: every CLI start-up at once)",
    )
    p.add_argument(
        f"--{prefix}gateway",
        action="store_true",
        help="P8: run the spawn.py trees through the tree's gateway (SPAWN_GATEWAY=1), which staggers calls sharing a head",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--leaves", type=int, default=16, metavar="N", help="leaves of the fan-out (default 16)")
    parser.add_argument(
        "--baseline",
        default=BASELINE_REF,
        metavar="REF_OR_PATH",
        help=f"the baseline spawn.py: a path, or a git revision (default {BASELINE_REF})",
    )
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="limit for any one tree (default 300)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (sessions, mock log) and print its path")
    add_setting_args(parser)
    args = parser.parse_args(argv)
    if args.leaves < 1:
        parser.error("--leaves must be >= 1")
    try:
        cli = spawn.find_cli({})
    except spawn.UsageError as exc:
        print(f"bench_cost: error: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="spawn-bench-cost-"))
    try:
        with serve(workdir) as mock:
            env = environment(os.environ, workdir, mock.url)
            summary = p8_figures(
                cli,
                env,
                workdir,
                mock,
                timeout=args.timeout,
                leaves=args.leaves,
                baseline=args.baseline,
                start_slots=args.start_slots,
                gateway=args.gateway,
            )
    except CostBenchError as exc:
        print(f"bench_cost: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bench's command line (tools/bench.py is its entry): arguments, the order of the measurements, and --only-schema-chain."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench_cost import BASELINE_REF, CostBenchError, add_setting_args, p8_figures
from mock_model import ServeError, mock_task, serve

import spawn

from .commands import Commands
from .core import LEAF_STEPS, MEMORY_LEAF_SLEEP_S, SPAWN, WAIT_MIN_HEAD_START_S, BenchError, fmt, median, run_process, table
from .dag import dag_overhead
from .environment import UvFound, bench_environment, find_uv, private_pycache
from .fanout import FanOut, fanout, fanout_rounds
from .gateway import gateway_rounds
from .inprocess import inprocess_chain_rounds
from .mcp_wait import mcp_samples
from .report import print_schema_chain, report, schema_chain_targets, series_json
from .runs import Bench
from .schema_chain import CHAIN_CPU, CHAIN_SEGMENTS, SCHEMA_CHAIN_SCHEMA, schema_chains
from .waitperf import add_waitperf_args, waitperf_report


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
    add_setting_args(p, "cost-")
    p.add_argument("--only-cost", action="store_true", help="only P8: the input cost of the fan-out and the chain, three ways")


def cost_summary(args: argparse.Namespace, bench: Bench) -> dict[str, Any] | None:
    """P8 (tools/bench_cost.py, docs/prompt-cache.md): the trees' input cost with the prompt cache modelled."""
    if args.cost_leaves <= 0 or args.only_waitperf or args.only_chains:
        return None
    print(f"P8: input cost of a {args.cost_leaves}-leaf fan-out and the depth-3 chain, three ways ...", flush=True)
    timeout = max(args.timeout, 300.0)
    return p8_figures(
        bench.cli,
        bench.env,
        bench.workdir,
        bench.mock,
        timeout=timeout,
        leaves=args.cost_leaves,
        baseline=args.cost_baseline,
        start_slots=args.cost_start_slots,
        gateway=args.cost_gateway,
    )


def parse_args(argv: Sequence[str] | None, description: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
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
        "--fanout-tools",
        default="Read",
        metavar="TOOLS",
        help="P1b: the leaves' tools on both sides (default Read); with Bash, spawn.py's leaves run sandboxed (--sandbox auto)",
    )
    p.add_argument(
        "--fanout-bare-sandbox",
        action="store_true",
        help="P1b: the bare leaves run with Claude Code's sandbox on too (with --fanout-tools Bash: its start on both sides)",
    )
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
    if args.only_cost and any((args.only_chains, args.only_waitperf, args.only_gateway, args.only_inprocess)):
        p.error("--only-cost measures P8 alone: give no other --only-* option")
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
        fan = fanout_rounds(
            bench, args.fanout, args.fanout_rounds, args.compare, leaf_tools=args.fanout_tools, bare_sandbox=args.fanout_bare_sandbox
        )
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


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """The whole bench; description is the --help text's first paragraph (tools/bench.py's docstring)."""
    args = parse_args(argv, description)
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
            only = args.only_inprocess or args.only_gateway or args.only_cost
            summary = {"targets": []} if only else measure_all(args, bench, uv, env=env, warm_env=warm_env, started=started)
            if args.only_cost and (p8 := cost_summary(args, bench)) is not None:
                summary = {"p8": p8, "targets": p8["targets"]}
            if args.gateway_rounds > 0 and not args.only_inprocess and not args.only_chains and not args.only_cost:
                p11 = gateway_rounds(mock.url, workdir, args.gateway_rounds)
                summary["targets"].append({**vars(p11), "met": p11.met})
            if args.inprocess_rounds > 0 and not (args.only_waitperf or args.only_chains or args.only_gateway or args.only_cost):
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
                "series": series_json(bench.series),
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

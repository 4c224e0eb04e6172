"""Issue 14's P3, P5 and P7: `wait` and `status` over synthetic sessions.

Records are written with spawn.py's own helpers (this dev tool may import spawn), so no
model or agent process is needed, except one `sleep` that stands in for live agents."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import spawn

from .core import SPAWN, BenchError, Target, fmt, median, run_process

TARGET_P3_WAIT_MS = 20.0  # spawn.py wait: .done marker -> wait exited, median


TARGET_P3_MCP_MS = 5.0  # MCP agent_wait: .done marker -> result at the client, median


TARGET_P5_S = 1.0  # status / status --json over 10,000 records; wait over 1,000 done ids


TARGET_P7_CORE_PCT = 2.0  # CPU of `wait --all` over 1,000 live children, % of one core


# Before the CPU window opens, wait has this long to start and settle: its
# start-up and first look at every record are not what P7 measures.
P7_SETTLE_S = 3.0


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

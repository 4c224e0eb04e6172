"""The printed tables and the JSON summary of the rounds: wall times, first-request bytes, wait latency, ratios and issue 14's targets."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .core import (
    MIB,
    TARGET_BYTES_RATIO,
    TARGET_CHAIN_RATIO,
    TARGET_FANOUT_RATIO,
    TARGET_MEMORY_RATIO,
    TARGET_SANDBOXED_CHAIN_RATIO,
    TARGET_WAIT_MS,
    Target,
    compare_target,
    fmt,
    last_json_line,
    median,
    run_process,
    short,
    table,
)
from .fanout import FanOut
from .runs import Bench, Sample, Series
from .schema_chain import CHAIN_CPU, CHAIN_SEGMENTS, SCHEMA_CHAIN_SCHEMA


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
            f"{fan.count} background leaves (--tools {fan.leaf_tools}{'; bare ones sandboxed too' if fan.bare_sandbox else ''})"
            " + wait --all, wall time "
            f"({fmt(fan.spawn_s, 's')} vs {fmt(fan.bare_s, 's')}; {detail})",
            fan.spawn_s / fan.bare_s,
            TARGET_FANOUT_RATIO,
            "x",
            "P1b",
            "; ".join(fan.commands),
        )
    ]


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
                # The target is for the tree with its fork server; without one it is only reported.
                math.inf if "SPAWN_NO_FORKSERVER" in label else TARGET_MEMORY_RATIO,
                "x",
                "P6",
                "; ".join(m.commands),
            )
        )
    return rows


def seconds(sample: Sample) -> float:
    return sample.seconds


def series_median(bench: Bench, key: str, get: Callable[[Sample], float | int | None] = seconds) -> float:
    """The median of one figure of a series; NaN for a series this run skipped."""
    return median(bench.series[key].values(get)) if key in bench.series else float("nan")


def print_wall_times(series: Mapping[str, Series]) -> None:
    rows: list[list[str]] = []
    for one in series.values():
        secs = one.values(seconds)
        first = one.values(lambda x: x.to_first_request_s)
        tail = one.values(lambda x: x.after_last_request_s)
        turns = one.values(lambda x: x.main_requests)
        rows.append(
            [
                one.label,
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


@dataclass
class FirstRequest:
    """P2: a leaf's first model request on each side, in JSON bytes, whole and by part, and spawn.py's briefing."""

    spawn_bytes: float
    bare_bytes: float
    parts: dict[str, dict[str, float]]
    """By series key ("spawn_leaf", "bare_leaf"): tools, system and messages."""
    briefing_bytes: int


def first_request(bench: Bench) -> FirstRequest:
    def part_of(part: str) -> Callable[[Sample], float | int | None]:
        return lambda x: x.first_request_parts.get(part)

    keys, names = ("spawn_leaf", "bare_leaf"), ("tools", "system", "messages")
    parts = {key: {part: series_median(bench, key, part_of(part)) for part in names} for key in keys}
    dry = run_process(bench.cmds.spawn_dry_run, bench.env, bench.timeout, bench.workdir)
    return FirstRequest(
        series_median(bench, "spawn_leaf", lambda x: x.first_request_bytes),
        series_median(bench, "bare_leaf", lambda x: x.first_request_bytes),
        parts,
        len(str(last_json_line(dry.stdout).get("briefing", "")).encode()),
    )


def print_first_request(first: FirstRequest) -> None:
    print()
    print("First model request of a leaf agent (mock log: kind=main, first=true; JSON bytes of each part)")
    parts = first.parts
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
                    ("spawn_leaf", "spawn.py --tools Read", first.spawn_bytes, fmt(first.briefing_bytes, "B")),
                    ("bare_leaf", "claude -p (default tools and prompt)", first.bare_bytes, ""),
                )
            ],
            ["agent", "bytes", "tool definitions", "system prompt", "of which briefing", "messages"],
        )
    )


def print_wait_latency(waits: Sequence[Mapping[str, float]]) -> None:
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


def compare_targets(bench: Bench, fan: FanOut | None) -> tuple[list[Target], list[Target], dict[str, Any] | None]:
    """--compare's rows (issue 32): P1's chain and P1b's fan-out, this spawn.py over the other; and their JSON."""
    c, s = bench.cmds, bench.series
    if c.compare_chain is None:
        return [], [], None
    chain_rounds = list(zip(s["spawn_chain"].values(seconds), s["compare_chain"].values(seconds), strict=True))
    chain = [compare_target("P1", "depth-3 chain", chain_rounds, f"--compare: {short(c.compare_chain)}")]
    compared: dict[str, Any] = {"script": c.compare_chain[1], "chain_rounds_s": chain_rounds, "chain_ratio": chain[0].value}
    if fan is None:
        return chain, [], compared
    fanned = [compare_target("P1b", f"{fan.count} background leaves + wait --all", fan.compare_rounds_s, "")]
    compared |= {"fanout_rounds_s": fan.compare_rounds_s, "fanout_ratio": fanned[0].value}
    return chain, fanned, compared


def print_ratios(bench: Bench, first: FirstRequest) -> None:
    """Each side's ratio to bare claude -p, and with the single agents, where a level's extra time goes."""

    def med(key: str, get: Callable[[Sample], float | int | None] = seconds) -> float:
        return series_median(bench, key, get)

    print()
    print("Ratios")
    chain, uv, bare = med("spawn_chain"), med("uv_chain"), med("bare_chain")
    print(f"  depth-3 chain    spawn.py / claude -p: {fmt(chain / bare, 'x')}  (+{chain - bare:.3f} s)")
    print(f"  depth-3 chain uv run spawn.py / claude -p: {fmt(uv / bare, 'x')}  (+{uv - bare:.3f} s)")
    if "spawn_leaf" not in bench.series:  # --only-chains
        return
    no_server = med("spawn_chain_no_server") / med("bare_chain")
    no_server_extra = med("spawn_chain_no_server") - med("bare_chain")
    print(f"  depth-3 chain, no fork server / claude -p: {fmt(no_server, 'x')}  (+{no_server_extra:.3f} s)")
    print(
        f"  single agent     spawn.py / claude -p, both --tools Read: {fmt(med('spawn_leaf') / med('bare_leaf_read'), 'x')}  "
        f"(+{med('spawn_leaf') - med('bare_leaf_read'):.3f} s per level; claude -p with its default tools: "
        f"{med('bare_leaf'):.3f} s)"
    )
    print(f"  first request    spawn.py / claude -p: {fmt(first.spawn_bytes / first.bare_bytes, 'x')}")
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


def print_targets(targets: Sequence[Target], *, only_chains: bool) -> None:
    print()
    print("Targets (issue #14; ratios against bare claude -p on the same scripted model, side by side in this run)")
    rows_out = [
        [t.id, t.name, fmt(t.value, t.unit), t.limit_text(), ("met" if t.met else "NOT met") if t.measured and t.has_limit else "-"]
        for t in targets
    ]
    print(table(rows_out, ["id", "target", "value", "limit", "verdict"], left=2))
    if not only_chains:
        print("(P3, P5, P7: under 'wait and status' below)")
    print("Commands:")
    for t in targets:
        if t.command:
            print(f"  {t.id or '-':<4} {t.command}")


def series_json(series: Mapping[str, Series]) -> dict[str, Any]:
    return {
        key: {"label": one.label, "median_s": median(one.values(seconds)), "samples": [vars(x) for x in one.samples]}
        for key, one in series.items()
    }


def fanout_json(fan: FanOut) -> dict[str, Any]:
    return {**vars(fan), "spawn_memory": vars(fan.spawn_memory), "bare_memory": vars(fan.bare_memory)}


def report(
    bench: Bench,
    waits: Sequence[Mapping[str, float]],
    args: argparse.Namespace,
    total_s: float,
    *,
    fan: FanOut | None = None,
    memory: Mapping[str, FanOut] | None = None,
) -> dict[str, Any]:
    """Print the rounds' tables, ratios and targets; the JSON summary's part of them."""
    print_wall_times(bench.series)
    first = first_request(bench)
    if "spawn_leaf" in bench.series:  # not with --only-chains
        print_first_request(first)
    print_wait_latency(waits)
    lat = [w["latency_ms"] for w in waits]
    chain_ratio = series_median(bench, "spawn_chain") / series_median(bench, "bare_chain")
    uv_chain_ratio = series_median(bench, "uv_chain") / series_median(bench, "bare_chain")
    # Time against a bare agent with the same tools: the CLI's defaults start
    # up slower, which would hide some of spawn.py's own cost.
    leaf_ratio = series_median(bench, "spawn_leaf") / series_median(bench, "bare_leaf_read")
    bytes_ratio = first.spawn_bytes / first.bare_bytes
    c = bench.cmds
    part_bytes = ", ".join(f"{k} {fmt(v, 'B')}" for k, v in first.parts["spawn_leaf"].items())
    part_bytes += f"; briefing {fmt(first.briefing_bytes, 'B')}"
    compare_chain, compare_fan, compared = compare_targets(bench, fan)
    # One list of rows, in the order; P3, P5 and P7 come from waitperf_report.
    targets = [
        Target(
            "depth-3 chain, every level `uv run spawn.py`, --sandbox off", uv_chain_ratio, TARGET_CHAIN_RATIO, "x", "P1", short(c.uv_chain)
        ),
        Target(
            'depth-3 chain, every level "$SPAWN_PYTHON" "$SPAWN_PY", default sandbox (the middle brokered)',
            chain_ratio,
            TARGET_SANDBOXED_CHAIN_RATIO,
            "x",
            "P1",
            short(c.spawn_chain),
        ),
        *schema_chain_targets(bench),
        *compare_chain,
        *fanout_targets(fan),
        *compare_fan,
        Target(f"leaf first-request bytes ({part_bytes})", bytes_ratio, TARGET_BYTES_RATIO, "x", "P2", short(c.spawn_leaf)),
        *memory_targets(memory),
        Target("spawn.py wait latency, median (before #14)", median(lat), TARGET_WAIT_MS, "ms"),
    ]
    print_ratios(bench, first)
    if bench.env.get("PYTHONDONTWRITEBYTECODE") and args.pycache == "inherit":
        print("  note: PYTHONDONTWRITEBYTECODE is set: every Python start compiles the SDK from source (--pycache private: warm cache)")
    print_schema_chain(bench)
    print_targets(targets, only_chains=args.only_chains)
    print(f"\n(total bench time {total_s:.0f} s, {args.repeat} rounds, {len(lat)} wait samples, pycache={args.pycache})")
    return {
        "repeat": args.repeat,
        "pycache": args.pycache,
        "python": sys.executable,
        "cli": str(bench.cli),
        "series": series_json(bench.series),
        "first_request_bytes": {
            "spawn": first.spawn_bytes,
            "bare": first.bare_bytes,
            "parts": first.parts,
            "briefing": first.briefing_bytes,
        },
        "wait": {"median_ms": median(lat), "samples": list(waits)},
        "ratios": {"chain": chain_ratio, "single": leaf_ratio, "first_request_bytes": bytes_ratio},
        "targets": [{**vars(t), "limit": t.limit if t.has_limit else None, "met": t.met, "measured": t.measured} for t in targets],
        "fanout": None if fan is None else fanout_json(fan),
        "memory": {k: fanout_json(m) for k, m in (memory or {}).items()},
        "compare": compared,
        "total_s": total_s,
    }


def schema_chain_targets(bench: Bench) -> list[Target]:
    """P1s's rows, --sandbox off at every level and the default sandbox, and with --compare this spawn.py's chain against the other's."""
    s = bench.series
    if "uv_schema_chain" not in s or "bare_schema_chain" not in s:
        return [Target("depth-3 chain, every level `uv run spawn.py --schema` (not run)", math.nan, TARGET_CHAIN_RATIO, "x", "P1s")]
    bare = s["bare_schema_chain"].values(seconds)
    chains = {c.key: c for c in bench.schema_chains}
    rows = []
    for key, config, limit in (
        ("uv_schema_chain", "--sandbox off at every level", TARGET_CHAIN_RATIO),
        ("sandboxed_schema_chain", "default sandbox (the middle spawns through its broker)", TARGET_SANDBOXED_CHAIN_RATIO),
        ("budget_schema_chain", "--sandbox off, `--max-budget-usd 5` at the root (every call through its gateway)", math.inf),
    ):
        if key not in s:
            continue
        this = s[key].values(seconds)
        each = ", ".join(f"{t / b:.2f}x" for t, b in zip(this, bare, strict=True))
        rows.append(
            Target(
                f"depth-3 chain, every level `uv run spawn.py --schema {SCHEMA_CHAIN_SCHEMA}`, {config}, against `claude -p "
                f"--json-schema` ({fmt(median(this), 's')} vs {fmt(median(bare), 's')}, "
                f"+{median(this) - median(bare):.3f} s; rounds {each})",
                median(this) / median(bare),
                limit,
                "x",
                "P1s",
                f"{short(chains[key].argv)}  vs  {short(chains['bare_schema_chain'].argv)}",
            )
        )
    if "compare_uv_schema_chain" in s:
        this = s["uv_schema_chain"].values(seconds)
        rounds = list(zip(this, s["compare_uv_schema_chain"].values(seconds), strict=True))
        rows.append(compare_target("P1s", "uv run --schema chain", rounds, f"--compare: {short(chains['compare_uv_schema_chain'].argv)}"))
    if "compare_budget_schema_chain" in s and "budget_schema_chain" in s:
        rounds = list(zip(s["budget_schema_chain"].values(seconds), s["compare_budget_schema_chain"].values(seconds), strict=True))
        argv = short(chains["compare_budget_schema_chain"].argv)
        rows.append(compare_target("P1s", "uv run --schema --max-budget-usd chain", rounds, f"--compare: {argv}"))
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

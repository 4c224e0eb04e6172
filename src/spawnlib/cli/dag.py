"""Task graphs and workflows: `dag run`, `dag validate`, estimates, plan/build/run-all and their state file."""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .. import __version__
from ..core.constants import (
    ASK_POLL_S,
    CACHE_READ_FACTOR,
    CACHE_WRITE_FACTOR,
    DEFAULT_MODEL,
    DEFAULT_TOOLS,
    EDIT_TOOLS,
    ENV_AGENT_ID,
    ENV_DEPTH,
    ENV_MODEL_TIERS,
    ENV_SESSION,
    FANOUT_HEAD_TOKENS,
    HEAD_NEUTRAL_OPTIONS,
    KNOWN_TOOLS,
    OUTCOME,
    PERMISSION_KINDS,
    PROJECT_DIR,
    RECORD_MAX_BYTES,
    TRANSCRIPT,
)
from ..core.embedded import builtin_files, builtin_label
from ..core.errors import ExitCode, RefusedError, SpawnError, StateError, UsageError, close_match
from ..core.output import emit, note
from ..core.pure import (
    estimate_agent,
    parse_json,
    parse_model_tiers,
    price_per_mtok,
    resolve_model,
    secret_values,
    truncate_for_stdout,
    utc_now_iso,
)
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Outcome, Status, record_to_json
from ..core.settings import wait_polls
from ..policy.agents import parse_reference
from ..policy.channel import send_answer
from ..run.resolving import Plan, choose_definition, load_schema, min_known, plan_run, positive, register
from ..run.runner import drop_refusal, record_refusal
from ..run.running import child_environment
from ..session.protocol import (
    AGENTS_DIR,
    agent_history,
    append_jsonl,
    asks_dir,
    bounded_yaml_loader,
    fsync_dir,
    latest_session,
    load_input,
    load_meta,
    pending_asks,
    read_input,
    read_json,
    read_outcome,
    read_text,
    write_file_atomic,
)
from ..supervise.commit import commit_outcome
from ..supervise.fast_start import compiled_script
from ..supervise.supervisor import ancestry_context, own_identity, unregister_runner
from .options import build_run_parser
from .verbs import kill_agent, wait_for_outcomes

# ------------------------------------------------ task graphs and workflows --
# `dag run FILE` registers itself as an agent node ("dag") and starts every
# task as a background child of that node, through spawn.py's own CLI, so
# limits, asks, status, kill and the timeline apply to tasks as to any agent.
# The pure part (parse, check, levels, templating) is testable without processes.

DAG_TASK_KEYS = frozenset({"id", "task", "blockedBy", "retries"})
DAG_FLAG_OPTIONS = frozenset({"task", "task_file", "background", "dry_run", "session", "output", "help", "version", "traceback"})
DAG_VAR = re.compile(r"\{\{\s*var\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
DAGS_DIR = "dags"  # journals: SESSION/dags/<runner id>.jsonl
DAG_POLL_S = 0.05  # how often the runner looks for new outcomes
ON_FAIL = ("ask", "skip", "abort")  # --on-fail: what is done with a task that failed once its retries are used


@dataclass
class DagTask:
    """One resolved task of a graph: its prompt, its blockers and its spawn options."""

    id: str
    task: str
    blocked_by: list[str]
    options: dict[str, Any]
    retries: int | None = None
    """How many times a failed run of it is started again before --on-fail applies; None: --retries, else 0."""


def spawn_option_names(parser: argparse.ArgumentParser | None = None) -> set[str]:
    """Option names a DAG may set: every run flag's dest except the ones the runner owns."""
    return {a.dest for a in (parser or build_run_parser())._actions} - DAG_FLAG_OPTIONS


DagPath = tuple[str | int, ...]
"""Where in a graph document: ("tasks", 2, "blockedBy", 0) is task #3's first blocker."""


class DagProblems(UsageError):
    """Every problem of a graph file at once (exit 2), one `spawn: error: FILE:LINE: ...` line each.

    main() prints `spawn: error: ` before the message; the lines after the
    first carry their own, so a file with four problems takes one run to see them.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\nspawn: error: ".join(self.problems))


def meant(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '': an aside inside a problem's sentence."""
    match = close_match(word, choices)
    return f" (did you mean {match!r}?)" if match else ""


def document_lines(text: str) -> dict[DagPath, int]:
    """The 1-based line of every mapping, key and sequence item of a YAML (or JSON) document, by its path.

    Composed again, after load_input took the data, by the same bounded
    loader: JSON is YAML too, so one walk gives lines for both. A document
    the composer refuses gives no lines (load_input has said why already).
    """
    import yaml

    loader = bounded_yaml_loader()(text)
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        return {}
    finally:
        loader.dispose()
    lines: dict[DagPath, int] = {}
    seen: set[int] = set()

    def walk(node: Any, path: DagPath) -> None:
        if node is None or id(node) in seen:
            return  # an alias: its anchor's lines stand; walked once, however often it is named
        seen.add(id(node))
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[(*path, key.value)] = key.start_mark.line + 1
                    walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for n, item in enumerate(node.value):
                walk(item, (*path, n))

    walk(root, ())  # nested at most JSON_MAX_DEPTH deep: the loader refused deeper
    return lines


def undefined_vars(value: Any, variables: Mapping[str, str]) -> list[str]:
    """Names of the {{var.x}} in value (every string in it) that variables lacks, in order, once each."""
    if isinstance(value, str):
        return list(dict.fromkeys(m.group(1) for m in DAG_VAR.finditer(value) if m.group(1) not in variables))
    if isinstance(value, list | dict):
        parts = value.values() if isinstance(value, dict) else value
        return list(dict.fromkeys(name for v in parts for name in undefined_vars(v, variables)))
    return []


def fill_vars(value: Any, variables: Mapping[str, str]) -> Any:
    """{{var.x}} replaced in every string of value; an undefined one stays (undefined_vars reports it)."""
    if isinstance(value, str):
        return DAG_VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill_vars(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: fill_vars(v, variables) for k, v in value.items()}
    return value


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the blockedBy graph as [a, b, ..., a], or None."""
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = 1
        stack.append(node)
        for nxt in edges.get(node, ()):
            if color.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in color and (found := visit(nxt)):
                return found
        stack.pop()
        color[node] = 2
        return None

    for node in edges:
        if node not in color and (found := visit(node)):
            return found
    return None


def dag_levels(tasks: Sequence[DagTask]) -> list[list[str]]:
    """Tasks grouped by level: a task's level is one more than its deepest blocker's."""
    level: dict[str, int] = {}
    by_id = {t.id: t for t in tasks}

    def depth(tid: str) -> int:
        if tid not in level:
            level[tid] = 1 + max((depth(b) for b in by_id[tid].blocked_by), default=-1)
        return level[tid]

    out: list[list[str]] = [[] for _ in range(1 + max((depth(t.id) for t in tasks), default=-1))]
    for t in tasks:
        out[level[t.id]].append(t.id)
    return out


def retries_ok(value: Any) -> bool:
    """Is a `retries:` value usable: absent, or a whole number >= 0?"""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


OptionCheck = Callable[[str, Any, Mapping[str, Any]], str | None]
"""(option, value, the task's options) -> what starting the task would refuse about it, or None."""


class DagChecker:
    """Resolves a graph document's tasks and collects every problem, each at its line, instead of stopping at the first."""

    def __init__(
        self, source: str, lines: Mapping[DagPath, int], variables: Mapping[str, str], check_option: OptionCheck | None = None
    ) -> None:
        self.source, self.lines, self.variables, self.check_option = source, lines, variables, check_option
        self.problems: list[tuple[int, str]] = []  # (line, text): reported in the file's order
        self.parser = build_run_parser()
        self.allowed = spawn_option_names(self.parser)

    def problem(self, where: DagPath, what: str) -> None:
        """Note a problem at where's line (or its nearest enclosing node's)."""
        line = next((self.lines[where[:n]] for n in range(len(where), -1, -1) if where[:n] in self.lines), None)
        self.problems.append((line or 0, f"{self.source}:{line}: {what}" if line else f"{self.source}: {what}"))

    def filled(self, value: Any, where: DagPath, name: str) -> Any:
        for var in undefined_vars(value, self.variables):
            self.problem(where, f"{name}: undefined variable {{{{var.{var}}}}}; define it under 'vars:' or pass --var {var}=VALUE")
        return fill_vars(value, self.variables)

    def options(self, raw: Mapping[str, Any], where: DagPath, name: str) -> dict[str, Any]:
        """A task's (or the defaults') spawn options, vars filled; unknown ones reported with the closest name."""
        opts: dict[str, Any] = {}
        for key, value in raw.items():
            if key in DAG_TASK_KEYS:
                continue
            opt = str(key).replace("-", "_")
            if opt not in self.allowed:
                near = meant(opt, self.allowed).replace("_", "-") if "-" in str(key) else meant(opt, self.allowed)
                self.problem((*where, key), f"{name}: unknown option {key!r}{near}; use spawn.py's flag names (spawn.py --help)")
                continue
            opts[opt] = self.filled(value, (*where, key), name)
        if not retries_ok(raw.get("retries")):
            self.problem((*where, "retries"), f"{name}: 'retries:' must be a whole number >= 0, got {raw.get('retries')!r}")
        return opts

    def flags_parse(self, task: DagTask, where: DagPath, own: Iterable[str]) -> None:
        """Report option values spawn.py's own parser refuses (a word for --max-turns, ...), as it would at the
        start, at the line of the task's own option that the parser refuses alone (else the task's)."""
        try:
            self.parser.parse_args(dag_argv(task, task.task))
        except UsageError as exc:
            culprit = next((key for key in own if not self.parses(task, str(key))), None)
            self.problem(where if culprit is None else (*where, culprit), f"task {task.id!r}: {exc.message}")

    def parses(self, task: DagTask, key: str) -> bool:
        opt = key.replace("-", "_")
        try:
            self.parser.parse_args(dag_argv(DagTask(task.id, task.task, [], {opt: task.options.get(opt)}), task.task))
        except UsageError:
            return False
        return True

    def semantics(self, raw: Mapping[str, Any], options: Mapping[str, Any], where: DagPath, name: str) -> None:
        """What starting the task would refuse about each option set here (check_option), at that option's line."""
        if self.check_option is None:
            return
        for key in raw:
            opt = str(key).replace("-", "_")
            if key in DAG_TASK_KEYS or opt not in options:
                continue
            why = self.check_option(opt, options[opt], options)
            if why is not None:
                self.problem((*where, key), f"{name}: {why}")

    def task(self, raw: Any, n: int, base: Mapping[str, Any], seen: Mapping[str, int]) -> DagTask | None:
        """Task #n+1 resolved, or None when it has no usable id; its other problems are noted."""
        where: DagPath = ("tasks", n)
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
            at = (*where, "id") if isinstance(raw, dict) and "id" in raw else where
            self.problem(at, f"task #{n + 1} needs an 'id:' string; add 'id: NAME'")
            return None
        name = f"task {raw['id']!r}"
        if raw["id"] in seen:
            self.problem((*where, "id"), f"{name}: duplicate id (task #{seen[raw['id']] + 1} has it too); give each task its own id")
            return None
        prompt = raw.get("task")
        if not isinstance(prompt, str) or not prompt.strip():
            self.problem(where, f"{name}: needs a 'task:' prompt; add 'task: TEXT'")
            prompt = ""
        blocked = raw.get("blockedBy") or []
        blocked = [blocked] if isinstance(blocked, str) else blocked
        if not isinstance(blocked, list) or not all(isinstance(b, str) for b in blocked):
            self.problem((*where, "blockedBy"), f"{name}: 'blockedBy:' must be a list of task ids")
            blocked = []
        before = len(self.problems)
        task = DagTask(raw["id"], self.filled(prompt, (*where, "task"), name), list(blocked), {**base, **self.options(raw, where, name)})
        task.retries = raw.get("retries") if retries_ok(raw.get("retries")) else None
        if len(self.problems) == before:
            self.flags_parse(task, where, [k for k in raw if k not in DAG_TASK_KEYS])
        if len(self.problems) == before:
            self.semantics(raw, task.options, where, name)
        return task

    def graph(self, tasks: Sequence[DagTask], index: Mapping[str, int]) -> None:
        """Unknown ids in blockedBy, each at its line, and a cycle at the entry that closes it."""
        ids = set(index)
        for t in tasks:
            for i, b in enumerate(t.blocked_by):
                if b not in ids:
                    where = ("tasks", index[t.id], "blockedBy", i)
                    self.problem(where, f"task {t.id!r}: unknown id {b!r} in blockedBy{meant(b, ids)}; use one of the tasks' ids")
        cycle = find_cycle({t.id: [b for b in t.blocked_by if b in ids] for t in tasks})
        if cycle:
            first = next(t for t in tasks if t.id == cycle[0])
            where = ("tasks", index[first.id], "blockedBy", first.blocked_by.index(cycle[1]))
            self.problem(where, f"cycle in blockedBy: {' -> '.join(cycle)}; remove one of these blockedBy entries")


def parse_dag(
    data: Any, cli_vars: Mapping[str, str], source: str, lines: Mapping[DagPath, int] | None = None, check_option: OptionCheck | None = None
) -> list[DagTask]:
    """Check a DAG document and resolve its tasks; DagProblems lists every problem, each at its line (lines: document_lines).

    check_option (option_problem) adds what needs the machine: agents, schemas and models that exist.
    """
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise DagProblems([f"{source}: expected a mapping with a non-empty 'tasks:' list; add 'tasks:' with '- id: NAME' and 'task: TEXT'"])
    raw_vars = data.get("vars") or {}
    check = DagChecker(source, lines or {}, {}, check_option)
    if not isinstance(raw_vars, dict):
        check.problem(("vars",), "'vars:' must be a mapping of names to values")
        raw_vars = {}
    check.variables = {**{str(k): str(v) for k, v in raw_vars.items()}, **cli_vars}
    top = ("tasks", "defaults", "vars")
    for key in data:
        if key not in top:
            check.problem((key,), f"unknown top-level key {key!r}{meant(str(key), top)}; use tasks, defaults, vars")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        check.problem(("defaults",), "'defaults:' must be a mapping of spawn options")
        defaults = {}
    base = check.options(defaults, ("defaults",), "defaults")
    if len(check.problems) == 0:
        check.semantics(defaults, base, ("defaults",), "defaults")
    default_retries = defaults.get("retries") if retries_ok(defaults.get("retries")) else None
    tasks: list[DagTask] = []
    index: dict[str, int] = {}
    for n, raw in enumerate(data["tasks"]):
        task = check.task(raw, n, base, index)
        if task is not None:
            task.retries = default_retries if task.retries is None else task.retries
            tasks.append(task)
            index[task.id] = n
    check.graph(tasks, index)
    if check.problems:
        raise DagProblems([text for _, text in sorted(check.problems, key=lambda p: p[0])])
    return tasks


def dag_estimate(tasks: Sequence[DagTask], history: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """Projected cost (every task runs once) and critical-path time (blockers end before a task starts)."""
    per_task: dict[str, dict[str, Any]] = {}
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    by_id = {t.id: t for t in tasks}
    for level in dag_levels(tasks):
        for tid in level:
            t = by_id[tid]
            model = str(t.options.get("model") or DEFAULT_MODEL)
            cost, seconds, basis = estimate_agent(model, history)
            per_task[tid] = {"model": model, "cost_usd": round(cost, 6), "seconds": round(seconds, 3), "basis": basis}
            prior = via[tid] = max(t.blocked_by, key=lambda b: finish[b], default=None)
            finish[tid] = seconds + (finish[prior] if prior is not None else 0.0)
    cache = fanout_cache(tasks, per_task)
    last: str | None = max(finish, key=lambda k: finish[k])
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = via[last]
    return {
        "tasks": len(tasks),
        "cost_usd": round(sum(e["cost_usd"] for e in per_task.values()), 6),
        "critical_path_s": round(max(finish.values()), 3),
        "critical_path": path[::-1],
        "per_task": per_task,
        "cache": cache,
    }


def fanout_cache(tasks: Sequence[DagTask], per_task: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Price each level's fan-outs with the prompt cache: tasks with the same model and
    head-shaping options send the same tools and system prompt, so the first writes that
    head and the others read it. Lowers the readers' default estimates in per_task."""
    by_id = {t.id: t for t in tasks}
    groups: dict[tuple[int, str], list[str]] = {}
    for n, level in enumerate(dag_levels(tasks)):
        for tid in level:
            shaping = {k: v for k, v in by_id[tid].options.items() if k not in HEAD_NEUTRAL_OPTIONS}
            groups.setdefault((n, json.dumps({**shaping, "model": per_task[tid]["model"]}, sort_keys=True)), []).append(tid)
    saved, shared = 0.0, 0
    for writer, *readers in groups.values():
        if not readers or not str(per_task[writer]["basis"]).startswith("default"):
            continue
        shared += 1
        each = FANOUT_HEAD_TOKENS * (CACHE_WRITE_FACTOR - CACHE_READ_FACTOR) * price_per_mtok(per_task[writer]["model"])[0] / 1e6
        per_task[writer]["cache"] = "writes the head its siblings read"
        for reader in readers:
            per_task[reader]["cost_usd"] = round(max(0.0, per_task[reader]["cost_usd"] - each), 6)
            per_task[reader]["cache"] = f"reads the head {writer} writes"
            saved += each
    return {"shared_heads": shared, "head_tokens": FANOUT_HEAD_TOKENS, "saved_usd": round(saved, 6)}


def dag_argv(t: DagTask, prompt: str) -> list[str]:
    """The spawn.py flags that start task t with the given prompt."""
    argv = ["--task", prompt, "--topic", t.id]
    for key, value in t.options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif key in PERMISSION_KINDS:
            argv += [x for rule in ([value] if isinstance(value, str) else value) for x in (flag, str(rule))]
        elif isinstance(value, list):
            argv += [flag, ",".join(map(str, value))]
        else:
            argv += [flag, value if isinstance(value, str) else json.dumps(value)]
    return argv


def dag_prompt(t: DagTask, results: Mapping[str, Mapping[str, Any]]) -> str:
    """The task's prompt with its blockers' outputs appended, each under its id."""
    if not t.blocked_by:
        return t.task
    parts = [t.task, "", "Outputs of the tasks this one was blocked by:"]
    for b in t.blocked_by:
        out = results[b].get("output")
        if results[b].get("status") != "done":  # skipped by choice: say so rather than print null
            out = f"(no output: {results[b].get('reason')})"
        parts += ["", f"## {b}", out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)]
    return "\n".join(parts)


def dag_vars(items: Sequence[str]) -> dict[str, str]:
    """--var KEY=VALUE values by key."""
    variables = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--var {item!r}: expected KEY=VALUE")
        variables[key] = value
    return variables


def read_dag_text(path: str) -> str:
    try:
        return read_input(path)
    except OSError as exc:
        raise UsageError(f"can't read DAG file {path}: {exc.strerror}") from None


def option_problem(opt: str, value: Any, options: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """What starting a task would refuse about one option's value that the flag parser can't see: an
    agent, schema or model that doesn't exist. Found before any task starts, so no task is paid for first."""
    try:
        if opt == "model" and isinstance(value, str) and value != "inherit":
            resolve_model(value, parse_model_tiers(environ.get(ENV_MODEL_TIERS)), "model")
        elif opt == "schema" and isinstance(value, str | dict | list):
            load_schema(value if isinstance(value, str) else json.dumps(value))
        elif opt == "agent" and isinstance(value, str) and value != "auto" and parse_reference(value) is None:
            # A node reference (a2a:URL, command:EXE) names no definition: its executor checks it when it starts.
            cwd = Path(str(options.get("cwd") or ".")).expanduser()
            choose_definition(value, "", cwd, environ)
    except UsageError as exc:
        return exc.message
    return None


def dag_from_text(text: str, source: str, variables: Mapping[str, str], environ: Mapping[str, str] | None = None) -> list[DagTask]:
    """A graph file's text checked and resolved: every problem at once, each at its line (DagProblems).

    With environ, also the agents, schemas and models the tasks name (option_problem).
    """
    data = load_input(text, source, "JSON" if source.endswith(".json") else "YAML")
    check = None if environ is None else (lambda opt, value, options: option_problem(opt, value, options, environ))
    return parse_dag(data, variables, source, document_lines(text), check)


def load_dag_file(path: str, cli_vars: Sequence[str], text: str | None = None, environ: Mapping[str, str] | None = None) -> list[DagTask]:
    """The tasks of the DAG file at path, or of text (a built-in workflow) named path."""
    return dag_from_text(read_dag_text(path) if text is None else text, path, dag_vars(cli_vars), environ)


def journal_path(session: Path, runner_id: str) -> Path:
    return session / DAGS_DIR / f"{runner_id}.jsonl"


def read_journal(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise StateError(f"can't read DAG journal {path}: {exc.strerror}") from None
    records = []
    for line in lines:
        try:
            records.append(parse_json(line))
        except ValueError:
            continue  # a runner SIGKILLed mid-append leaves at most one torn last line
    return records


def journal_state(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each task in a journal: its state ("started", "done", "failed", "skipped")."""
    state: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("event") == "task" and isinstance(r.get("task"), str):
            state[r["task"]] = dict(r)
    return state


class DagStopped(Exception):
    """SIGTERM/SIGHUP reached the runner: end every running task."""


def start_dag_task(t: DagTask, prompt: str, runner: AgentMeta, runner_dir: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Launch one task as a background child of the runner's node; its launcher's JSON, or an error."""
    env = {**environ, **child_environment(runner, runner_dir, environ)}
    proc = subprocess.run(
        [sys.executable, str(compiled_script()), *dag_argv(t, prompt), "--background"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=runner.cwd,
    )
    try:
        data = cast(dict[str, Any], parse_json(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        data = {}
    if proc.returncode != ExitCode.OK or "agent_dir" not in data:
        reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"launcher exited {proc.returncode}"
        return {"status": data.get("status") or Status.FAILED.value, "reason": reason, "agent_id": data.get("id")}
    return data


def went_on_without(result: Mapping[str, Any]) -> bool:
    """Does a finished blocker let its dependents start: done, or skipped by choice after it failed?"""
    return result.get("status") == "done" or bool(result.get("skipped_by"))


def run_dag(
    tasks: Sequence[DagTask],
    runner_dir: Path,
    journal: Path,
    *,
    done_before: Mapping[str, Mapping[str, Any]],
    max_concurrent: int | None,
    on_fail: str | None,
    environ: Mapping[str, str],
    on_idle: Callable[[], None] | None = None,
    choose: Callable[[DagTask, Mapping[str, Any]], str] | None = None,
    go_on: Callable[[DagTask], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Schedule tasks as their blockers finish; journal every state change. Results by task id.

    A task that did not end done is started again while it has retries left.
    Then on_fail decides: None is the graph's rule (its dependents are skipped,
    the rest goes on); "skip" skips it and starts its dependents anyway;
    "abort" kills what runs and skips the rest; "ask" lets choose() return
    retry, skip or abort. go_on(task), if given, is asked before a task whose
    blockers all ended: False declines it, and the run stops there.
    """
    run = DagRun(tasks, runner_dir, journal, done_before, environ, rules=DagRules(max_concurrent, on_fail, on_idle, choose, go_on))

    def on_signal(signum: int, _frame: Any) -> None:
        raise DagStopped(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while len(run.results) < len(tasks):
            for t in tasks:
                run.consider(t)
            if run.running:
                run.collect()
    except DagStopped as stopped:
        note(f"dag: {stopped}: ending {len(run.running)} running task(s)")
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        run.stopped()
        for s, handler in old.items():
            signal.signal(s, handler)
    return run.results


@dataclass
class DagRules:
    """How a run goes on (run_dag's keyword arguments, see there)."""

    max_concurrent: int | None = None
    on_fail: str | None = None
    on_idle: Callable[[], None] | None = None
    choose: Callable[[DagTask, Mapping[str, Any]], str] | None = None
    go_on: Callable[[DagTask], bool] | None = None


class DagRun:
    """run_dag's state: the results so far, the tasks running, the attempts; and each step it takes (see there)."""

    def __init__(
        self,
        tasks: Sequence[DagTask],
        runner_dir: Path,
        journal: Path,
        done_before: Mapping[str, Mapping[str, Any]],
        environ: Mapping[str, str],
        *,
        rules: DagRules,
    ) -> None:
        self.tasks, self.runner_dir, self.journal, self.environ = tasks, runner_dir, journal, environ
        self.runner = load_meta(runner_dir)
        self.secrets = secret_values(environ)
        self.by_id = {t.id: t for t in tasks}
        self.results: dict[str, dict[str, Any]] = {k: dict(v) for k, v in done_before.items()}
        self.running: dict[str, Path] = {}
        # Attempts count across resumes (the journal has every start); retries are per runner.
        self.attempts: dict[str, int] = {t.id: 0 for t in tasks}
        for r in read_journal(journal):
            if r.get("event") == "task" and r.get("status") == "started" and r.get("task") in self.attempts:
                self.attempts[r["task"]] += 1
        self.retried: dict[str, int] = {t.id: 0 for t in tasks}
        self.stop: dict[str, str] = {}  # set by an abort or a decline: why nothing more starts
        self.rules = rules

    def record(self, tid: str, **fields: Any) -> None:
        entry = {"event": "task", "task": tid, "time": utc_now_iso(), **fields}
        append_jsonl(self.journal, entry, self.secrets)
        if fields["status"] != "started":
            self.results[tid] = {k: v for k, v in fields.items() if k != "agent_dir"}

    def ended(self, tid: str, d: Path, outcome: Mapping[str, Any], **why: str) -> None:
        """Record a task's agent outcome; why (reason, aborted_by) overrides a failure's own reason."""
        if outcome.get("status") == Status.DONE:
            out, _ = truncate_for_stdout(outcome.get("output"), d / OUTCOME)
            self.record(tid, status="done", agent_id=d.name, output=out, outcome=str(d / OUTCOME), attempt=self.attempts[tid])
        else:
            fields = {"reason": outcome.get("reason") or "", **why}
            self.record(tid, status=outcome.get("status") or "failed", agent_id=d.name, attempt=self.attempts[tid], **fields)

    def decide(self, t: DagTask) -> tuple[str, str]:
        """(retry|skip|abort|fail, who chose) for a task that did not end done; fail is the graph's rule."""
        if self.retried[t.id] < (t.retries or 0):
            return "retry", f"retries: {t.retries}"
        if self.rules.on_fail == "ask" and self.rules.choose is not None:
            return self.rules.choose(t, self.results[t.id]), "terminal"
        if self.rules.on_fail in ("skip", "abort"):
            return self.rules.on_fail, f"--on-fail {self.rules.on_fail}"
        return "fail", "the graph"

    def failed(self, t: DagTask) -> None:
        """The last record of t is a failure: retry it, skip it, abort the run, or let it stand."""
        result = self.results[t.id]
        choice, by = self.decide(t)
        if choice == "fail":
            return
        append_jsonl(
            self.journal,
            {"event": "decision", "task": t.id, "time": utc_now_iso(), "choice": choice, "by": by, "attempt": self.attempts[t.id]},
            self.secrets,
        )
        if choice == "retry":
            self.retried[t.id] += 1
            del self.results[t.id]  # pending again: the next pass starts it
        elif choice == "skip":
            why = f"{result['status']} ({result.get('reason') or 'no reason'}); skipped by {by}, its dependents go on"
            self.record(t.id, status="skipped", agent_id=result.get("agent_id"), reason=why, skipped_by=by, attempt=self.attempts[t.id])
        else:
            self.stop["reason"] = f"aborted by {by}: {t.id} {result['status']}"
            for tid, d in list(self.running.items()):
                kill_agent(d, self.secrets)  # a sibling that ended meanwhile keeps its own outcome
                del self.running[tid]
                self.ended(tid, d, read_outcome(d) or {"status": "killed"}, reason=self.stop["reason"], aborted_by=t.id)

    def consider(self, t: DagTask) -> None:
        """One pass's look at a task: skip it, leave it waiting, or start it."""
        results, running, stop = self.results, self.running, self.stop
        if t.id in results or t.id in running:
            return
        if stop:
            self.record(t.id, status="skipped", reason=stop["reason"])
            return
        bad = [b for b in t.blocked_by if b in results and not went_on_without(results[b])]
        if bad:
            self.record(t.id, status="skipped", reason=f"blocked by {bad[0]}, which {results[bad[0]]['status']}")
            return
        if any(b not in results for b in t.blocked_by) or (
            self.rules.max_concurrent is not None and len(running) >= self.rules.max_concurrent
        ):
            return
        if self.rules.go_on is not None and t.blocked_by and not self.rules.go_on(t):
            stop["reason"] = f"declined at the terminal: not going on to {t.id}"
            self.record(t.id, status="skipped", reason=stop["reason"], declined_by="terminal")
            return
        self.attempts[t.id] += 1
        launched = start_dag_task(t, dag_prompt(t, results), self.runner, self.runner_dir, self.environ)
        if "agent_dir" in launched:
            running[t.id] = Path(launched["agent_dir"])
            self.record(t.id, status="started", agent_id=launched["id"], agent_dir=launched["agent_dir"], attempt=self.attempts[t.id])
        else:
            status, agent_id, reason = launched["status"], launched.get("agent_id"), launched["reason"]
            self.record(t.id, status=status, agent_id=agent_id, reason=reason, attempt=self.attempts[t.id])
            self.failed(t)

    def collect(self) -> None:
        """Wait for any running task to end (or for on_idle's period) and record what ended."""
        running = self.running
        timeout = None if self.rules.on_idle is None else ASK_POLL_S * 5
        waited = wait_for_outcomes(list(running.values()), "any", timeout, self.secrets, polls=wait_polls(self.environ))
        if self.rules.on_idle is not None:
            self.rules.on_idle()
        for tid, d in list(running.items()):
            if tid not in running:
                continue  # ended by an abort earlier in this pass
            outcome = waited.outcomes.get(d) if d in waited.outcomes else None
            if outcome is None and d in waited.stale:
                kill_agent(d, self.secrets)
                outcome = read_outcome(d)
            if outcome is None:
                continue
            del running[tid]
            self.ended(tid, d, outcome)
            if self.results[tid]["status"] != "done":
                self.failed(self.by_id[tid])

    def stopped(self) -> None:
        """The run ends: what still runs is killed, what never started is skipped."""
        for tid, d in self.running.items():
            kill_agent(d, self.secrets)  # a stopped runner leaves no task behind
            outcome = read_outcome(d) or {}
            status = outcome.get("status") or "killed"
            self.record(tid, status=status, agent_id=d.name, reason="the DAG runner was stopped", attempt=self.attempts[tid])
        for t in self.tasks:
            if t.id not in self.results:
                self.record(t.id, status="skipped", reason="the DAG runner was stopped")


def register_dag_runner(
    what: str, topic: str, args: argparse.Namespace, environ: Mapping[str, str], first: AgentMeta | None = None
) -> tuple[Path, Plan]:
    """Register the runner as an agent node: tasks are its children, so kill, status and limits reach them.

    A resume passes the first run's runner (first): its limits are derived
    again as any spawn's are, from the caller, and then narrowed to that
    runner's tools, max depth, rules, deadline span and budget. The resume's
    own flags narrow further; nothing widens them.
    """
    argv = ["--task", what, "--topic", topic, "--tools", ",".join(sorted(KNOWN_TOOLS) if first is None else first.tools)]
    timeout, budget = args.timeout, args.max_budget_usd
    if first is not None:
        argv += ["--max-depth", str(first.max_depth)]
        argv += [x for kind in ("deny", "ask") for rule in first.permissions.get(kind, []) for x in (f"--{kind}", rule)]
        timeout = min_known(timeout, None if first.deadline is None else max(first.deadline - first.create_time, 1.0))
        budget = min_known(budget, first.max_budget_usd)
    for flag, value in (("--timeout", timeout), ("--max-budget-usd", budget), ("--session", args.session)):
        argv += [flag, str(value)] if value is not None else []
    plan = plan_run(build_run_parser().parse_args(argv), environ, ancestry_context())
    plan.meta.agent = "dag"
    if plan.refusal is not None and not plan.new_session and (dropped := drop_refusal(plan)) is not None:
        raise RefusedError(f"refused: {plan.refusal}; {dropped[2]}'s runner records it in {dropped[0]}")
    runner_dir = register(plan, own_identity(), environ)
    if plan.refusal is not None:
        record_refusal(runner_dir, plan)
        raise RefusedError(f"refused: {plan.refusal}; recorded in {runner_dir}")
    return runner_dir, plan


def finish_runner(runner_dir: Path, plan: Plan, results: Mapping[str, Mapping[str, Any]], started: float, journal: Path) -> int:
    """Commit the runner's outcome, print the one JSON object, return the exit code."""
    statuses = {r["status"] for r in results.values()}
    # A task killed because another failed (an abort) makes a failed run, not a killed one.
    killed = any(r["status"] == "killed" and not r.get("aborted_by") for r in results.values())
    status = Status.DONE if statuses <= {"done"} else Status.KILLED if killed else Status.FAILED
    report = {"status": status.value, "tasks": {k: dict(v) for k, v in results.items()}}
    failed = sorted(k for k, r in results.items() if r["status"] != "done")
    reason = "every task done" if not failed else f"not done: {', '.join(failed)}"
    outcome = Outcome(
        id=plan.meta.id,
        status=status,
        reason=reason,
        exit_code=EXIT_FOR_STATUS[status],
        ended_at=utc_now_iso(),
        duration_s=round(time.time() - started, 3),
        output=report,
    )
    commit_outcome(runner_dir, outcome, plan.secrets)
    unregister_runner(plan.meta.pid, plan.meta.create_time)
    emit({**report, "runner_id": plan.meta.id, "session": plan.meta.session, "journal": str(journal)})
    return EXIT_FOR_STATUS[status]


def cmd_estimate(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """estimate DAGFILE: what a graph would cost and how long its critical path is, running nothing."""
    tasks = load_dag_file(args.file, args.var or [], environ=environ)
    history: dict[str, list[tuple[float, float]]] = {}
    session = None
    if args.session:
        # A session directory, or a session root whose latest session is meant.
        given = Path(args.session).expanduser().resolve()
        session = given if (given / AGENTS_DIR).is_dir() else latest_session(given)
        if session is None:
            raise UsageError(f"no session under {given}; pass a session directory or drop --session for the defaults")
        history, _ = agent_history(session)
    report = {"file": args.file, "session": str(session) if session else None, **dag_estimate(tasks, history)}
    if not args.text:
        emit(report)
        return ExitCode.OK
    saved = report["cache"]["saved_usd"]
    print(
        f"{report['tasks']} tasks, about ${report['cost_usd']:.4f}"
        + (f" (fan-outs reading their shared head from the cache: -${saved:.4f})" if saved else "")
        + f"; critical path {report['critical_path_s']:.0f} s: "
        + " -> ".join(report["critical_path"])
    )
    return ExitCode.OK


def at_terminal() -> bool:
    """Is a person at stdin to answer questions? Without one nothing may wait for an answer."""
    return sys.stdin is not None and sys.stdin.isatty()


def failure_policy(on_fail: str | None, fail_fast: bool, default: str | None) -> str | None:
    """--on-fail as given (--fail-fast is abort), else default; ask needs a person at a terminal."""
    if fail_fast and on_fail not in (None, "abort"):
        raise UsageError(f"--fail-fast and --on-fail {on_fail} disagree; pass one of them")
    policy = "abort" if fail_fast else on_fail or default
    if policy == "ask" and not at_terminal():
        raise UsageError("--on-fail ask needs a terminal on stdin; in scripts use --on-fail skip|abort and retries (--retries N)")
    return policy


def apply_retries(tasks: Sequence[DagTask], retries: int | None) -> None:
    """--retries N for every task whose file sets no retries:."""
    if retries is not None and retries < 0:
        raise UsageError(f"--retries must be a whole number >= 0, got {retries}")
    for t in tasks:
        t.retries = (retries or 0) if t.retries is None else t.retries


def ask_failure_at_terminal(t: DagTask, result: Mapping[str, Any]) -> str:
    """retry, skip or abort, as the person at the terminal chooses; anything else (or end of input) aborts."""
    reason = str(result.get("reason") or "no reason")[:300]
    print(f"? {t.id} {result['status']}: {reason}. Retry, skip or abort? (r/s/A) ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline().strip().lower()
    return {"r": "retry", "retry": "retry", "s": "skip", "skip": "skip"}.get(reply, "abort")


def go_on_at_terminal(t: DagTask) -> bool:
    """run-all between phases: may the next phase start? Enter is yes; end of input is no."""
    print(f"? {', '.join(t.blocked_by)} done. Go on to {t.id}? (Y/n) ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline()
    return bool(reply) and reply.strip().lower() in ("", "y", "yes")


def cmd_dag(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.action == "resume":
        return resume_dag(args, environ)
    text = read_dag_text(args.file)
    variables = dag_vars(args.var or [])
    tasks = dag_from_text(text, args.file, variables, environ)
    levels = dag_levels(tasks)
    if args.action == "validate":
        emit({"valid": True, "file": args.file, "tasks": len(tasks), "levels": len(levels)})
        return ExitCode.OK
    if args.action == "show" or args.dry_run:
        apply_retries(tasks, args.retries)
        resolved = [
            {"id": t.id, "blockedBy": t.blocked_by, "task": t.task, "retries": t.retries, "argv": dag_argv(t, t.task)} for t in tasks
        ]
        emit({"levels": levels, **({"tasks": resolved} if args.dry_run else {})})
        return ExitCode.OK
    positive("--max-concurrent", args.max_concurrent, integer=True)
    apply_retries(tasks, args.retries)
    on_fail = failure_policy(args.on_fail, args.fail_fast, None)
    started = time.time()
    graph_file = str(Path(args.file).resolve())
    runner_dir, plan = register_dag_runner(f"dag run {graph_file}", f"dag {Path(args.file).stem}", args, environ)
    give_default_tools(tasks, plan)
    journal = journal_path(Path(plan.meta.session), plan.meta.id)
    journal.parent.mkdir(exist_ok=True)
    graph: dict[str, Any] = {"event": "graph", "time": utc_now_iso(), "runner_id": plan.meta.id, "file": graph_file}
    graph.update(sha256=hashlib.sha256(text.encode()).hexdigest(), vars=variables)
    graph.update(max_concurrent=args.max_concurrent, fail_fast=on_fail == "abort", on_fail=on_fail)
    graph["tasks"] = [record_to_json(t) for t in tasks]
    append_jsonl(journal, graph, plan.secrets)
    note(f"dag {plan.meta.id}: {len(tasks)} tasks in {len(levels)} levels; journal {journal}")
    results = run_dag(
        tasks, runner_dir, journal, done_before={}, max_concurrent=args.max_concurrent, on_fail=on_fail, environ=environ,
        choose=ask_failure_at_terminal,
    )  # fmt: skip
    return finish_runner(runner_dir, plan, results, started, journal)


def give_default_tools(tasks: Sequence[DagTask], plan: Plan) -> None:
    """A task with no tools gets what a plain spawn here would, not the runner's wide set."""
    for t in tasks:
        if "tools" not in t.options and "agent" not in t.options:
            t.options["tools"] = list(plan.inherited.tools or DEFAULT_TOOLS)


def first_runner_of(session: Path, journal: Path) -> tuple[AgentMeta, dict[str, Any], list[dict[str, Any]]]:
    """The `dag run` runner that wrote this journal, its graph line, and the journal's lines.

    The runner's own meta.json names the graph file it ran ("dag run FILE");
    the journal's first line must name the same one, with the hash of its
    text. Anything else in the journal is believed only as far as
    done_in_journal checks it. A StateError says why this journal is not one.
    """
    try:
        first = load_meta(session / AGENTS_DIR / journal.stem)
    except (OSError, SpawnError):
        raise StateError(f"{journal.name} is not named after a runner of this session") from None
    ran = Path(first.cwd, first.task.removeprefix("dag run ")).resolve() if first.task.startswith("dag run ") else None
    if first.agent != "dag" or ran is None:
        raise StateError(f"{journal.name}'s runner {first.id} is not a 'dag run' (workflow verbs are run again, not resumed)")
    records = read_journal(journal)
    graph = records[0] if records and records[0].get("event") == "graph" else {}
    if graph.get("runner_id") != first.id or not isinstance(graph.get("file"), str) or Path(graph["file"]) != ran:
        raise StateError(f"{journal.name}'s first line is not the graph line its runner {first.id} wrote for {ran}")
    if not isinstance(graph.get("sha256"), str):
        raise StateError(f"{journal.name} records no hash of {ran} (an older spawn.py wrote it); start it anew: 'spawn.py dag run {ran}'")
    return first, graph, records


def resumable_journal(session: Path) -> tuple[Path, AgentMeta, dict[str, Any], list[dict[str, Any]]]:
    """The newest journal of the session that a `dag run` runner wrote; others are noted and passed over."""
    journals = sorted((session / DAGS_DIR).glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    for journal in journals:
        try:
            return (journal, *first_runner_of(session, journal))
        except StateError as exc:
            note(f"dag resume: passed over {journal}: {exc.message}")
    raise UsageError(f"no DAG journal of a 'dag run' in {session / DAGS_DIR}; pass the session directory of a 'dag run'")


def done_in_journal(
    session: Path, records: Sequence[Mapping[str, Any]], ids: AbstractSet[str], secrets_: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Tasks already done, by id: the journal says which agent ran a task; that agent's own records say whether it is done.

    A line naming a task the graph lacks is ignored, and said so. A task
    counts as done only when its agent is in this session, was started for
    that task by a DAG runner, and has a done outcome: a forged "done" with an
    output of its choosing reruns the task instead. An agent of a task
    still running (its runner died) is ended, to be started again.
    """
    done: dict[str, dict[str, Any]] = {}
    for tid, last in journal_state(records).items():
        if tid not in ids:
            note(f"dag resume: journal lines for task {tid[:80]!r} ignored: the graph file has no such task")
            continue
        agent_id = last.get("agent_id")
        if last.get("status") not in ("done", "started") or not isinstance(agent_id, str) or Path(agent_id).name != agent_id:
            continue
        d = session / AGENTS_DIR / agent_id
        try:
            meta = load_meta(d)
            parent = meta.parent_id if meta.parent_id is not None and Path(meta.parent_id).name == meta.parent_id else None
            ours = meta.topic == tid and parent is not None and load_meta(session / AGENTS_DIR / parent).agent == "dag"
            outcome = read_outcome(d) if ours else None
        except (OSError, SpawnError):
            ours, outcome = False, None
        if not ours:
            note(f"dag resume: task {tid!r}: the journal's agent {agent_id[:80]!r} did not run it; it runs again")
        elif outcome is None:
            kill_agent(d, secrets_)  # still running, orphaned: end it before starting it again
        elif outcome.get("status") == Status.DONE:
            out, _ = truncate_for_stdout(outcome.get("output"), d / OUTCOME)
            done[tid] = {"status": "done", "agent_id": d.name, "output": out, "outcome": str(d / OUTCOME)}
    return done


def resume_dag(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Run the graph file's tasks that are not done, under the first run's limits; the journal says only what is done."""
    session = Path(args.file).expanduser().resolve()
    journal, first, graph, records = resumable_journal(session)
    text = read_dag_text(graph["file"])
    if (now := hashlib.sha256(text.encode()).hexdigest()) != graph["sha256"]:
        raise UsageError(
            f"{graph['file']} changed since the first run (sha256 {graph['sha256'][:12]} then, {now[:12]} now); "
            f"restore it, or start it anew with 'spawn.py dag run {graph['file']}'"
        )
    recorded_vars: dict[str, Any] = graph["vars"] if isinstance(graph.get("vars"), dict) else {}
    tasks = dag_from_text(text, graph["file"], {**{str(k): str(v) for k, v in recorded_vars.items()}, **dag_vars(args.var or [])})
    positive("--max-concurrent", args.max_concurrent, integer=True)
    apply_retries(tasks, args.retries)
    recorded = graph.get("on_fail") if graph.get("on_fail") in ON_FAIL else ("abort" if graph.get("fail_fast") is True else None)
    if recorded == "ask" and not at_terminal():
        recorded = "abort"  # asked at a terminal then, none now: nothing may wait for an answer
    on_fail = failure_policy(args.on_fail, args.fail_fast, recorded)
    first_concurrent = graph.get("max_concurrent")
    max_concurrent = args.max_concurrent or (first_concurrent if type(first_concurrent) is int and first_concurrent > 0 else None)
    done = done_in_journal(session, records, {t.id for t in tasks}, secret_values(environ))
    env = {**environ, ENV_SESSION: str(session), ENV_DEPTH: environ.get(ENV_DEPTH, "-1")}
    if Path(environ.get(ENV_SESSION, "")) != session:
        env[ENV_DEPTH] = "-1"
        env.pop(ENV_AGENT_ID, None)
    args.session = None
    started = time.time()
    runner_dir, plan = register_dag_runner(f"dag resume {graph['file']}", "dag-resume", args, env, first)
    give_default_tools(tasks, plan)
    append_jsonl(journal, {"event": "resume", "time": utc_now_iso(), "runner_id": plan.meta.id}, plan.secrets)
    for tid, r in done.items():
        append_jsonl(journal, {"event": "task", "task": tid, "time": utc_now_iso(), **r}, plan.secrets)
    note(f"dag resume {plan.meta.id}: {len(done)} of {len(tasks)} tasks already done")
    results = run_dag(
        tasks, runner_dir, journal, done_before=done, max_concurrent=max_concurrent, on_fail=on_fail, environ=environ,
        choose=ask_failure_at_terminal,
    )  # fmt: skip
    return finish_runner(runner_dir, plan, results, started, journal)


# Plan, build and explore: phases of one workflow DAG, sharing a state file.
WORKFLOWS_DIR = PROJECT_DIR / "workflows"
DEFAULT_STATE_FILE = ".spawn-state.json"
DEFAULT_ROTATE_MB = 10.0  # a state file past this is rotated to .1, .2, ...
PHASES = ("plan", "build", "explore")
WORKFLOW_FOR = {"plan": "plan-build", "build": "plan-build", "explore": "plan-build-explore"}
WORKFLOW_FOR.update({"run-plan-build": "plan-build", "run-all": "plan-build-explore"})


class DeclinedError(SpawnError):
    """A person (or the ask timeout) declined an action build asked about (exit 4)."""

    exit_code = ExitCode.REFUSED


def state_file_path(value: str) -> Path:
    """--state-file made absolute without resolving its last component, so a link there is seen, not followed."""
    path = Path(value).expanduser()
    return path.parent.resolve() / path.name


def open_state_nofollow(path: Path, flags: int) -> int:
    """os.open of the state file or its lock, refusing a symbolic link in their place.

    Anything that can write the project (an agent, a checkout) can plant
    a link there; followed, `plan` would rewrite, `state show` print and
    `state clear` delete whatever file it points to, outside the project.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(
                f"state file {path} is a symbolic link, which spawn.py does not follow; remove the link, or pass --state-file PATH"
            ) from None
        raise


@contextlib.contextmanager
def state_lock(path: Path) -> Iterator[None]:
    """Exclusive lock for a read-modify-write of the state file.

    The lock lives on a sidecar that is never renamed: the state file itself
    is replaced on every write, so a lock on it would guard a dead inode.
    """
    import fcntl

    try:
        fd = open_state_nofollow(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except StateError:
        raise
    except OSError as exc:
        raise StateError(f"can't lock state file {path}: {exc.strerror}; pass --state-file PATH in a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state(path: Path) -> dict[str, Any]:
    """The state file's content; {} when absent. Corrupt is a StateError, and the file is left as it is."""
    try:
        # The state file is replaced by rename, never written in place: refusing a link here, and
        # renaming over the name (which replaces a link planted since), never reaches its target.
        with os.fdopen(open_state_nofollow(path, os.O_RDONLY), "rb") as f:
            data = parse_json(f.read(RECORD_MAX_BYTES + 1))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"state file {path} is corrupt ({exc}); it was not changed: fix it, or move it away") from None
    if not isinstance(data, dict):
        raise StateError(f"state file {path} is corrupt (not a JSON object); it was not changed: fix it, or move it away")
    return data


def rotate_state(path: Path) -> None:
    """path -> path.1, path.1 -> path.2, ...: nothing is lost."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    for i in range(n, 1, -1):
        os.replace(path.with_name(f"{path.name}.{i - 1}"), path.with_name(f"{path.name}.{i}"))
    os.replace(path, path.with_name(f"{path.name}.1"))


def update_state(path: Path, change: Callable[[dict[str, Any]], None], rotate_mb: float = DEFAULT_ROTATE_MB) -> dict[str, Any]:
    """Read, change and write the state file under its lock: temp file, fsync, rename."""
    with state_lock(path):
        data = read_state(path)
        change(data)
        if path.exists() and path.stat().st_size > rotate_mb * 1024 * 1024:
            rotate_state(path)
            data["history"] = data.get("history", [])[-1:]  # the rest is in .1
        write_file_atomic(path, (json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n").encode())
        fsync_dir(path.parent)
    return data


def plan_markdown(output: Any) -> str:
    """A plan output (schemas/plan.json, or text) as markdown."""
    if not isinstance(output, dict):
        return str(output or "")
    lines = [f"# {output.get('goal', 'Plan')}", ""]
    for n, raw in enumerate(output.get("steps") or [], 1):
        step = raw if isinstance(raw, dict) else {"title": str(raw)}
        files = f" ({', '.join(step['files'])})" if step.get("files") else ""
        lines.append(f"{n}. {step.get('title', '')}{files}")
        if step.get("detail"):
            lines.append(f"   {step['detail']}")
    lines += [f"- risk: {r}" for r in output.get("risks") or []]
    return "\n".join(lines)


def written_files(transcript: Path) -> set[str]:
    """Paths the agent gave to Write (which creates files), as given and as base names."""
    found: set[str] = set()
    with contextlib.suppress(OSError, SpawnError):
        for m in re.finditer(r'"name": ?"Write", ?"input": ?\{"file_path": ?"([^"]+)"', read_text(transcript)):
            found |= {m.group(1), os.path.basename(m.group(1))}
    return found


def phase_results(phase: str, output: Any, written: AbstractSet[str] = frozenset()) -> Any:
    """What a phase's output adds to the state file's results; written: the paths build created."""
    if phase == "plan":
        return plan_markdown(output)
    data = output if isinstance(output, dict) else {"summary": output}
    if phase == "build":
        changed = [str(c) for c in data.get("files_changed") or []]
        created = [c for c in changed if c in written]
        return {"filesCreated": created, "filesModified": [c for c in changed if c not in written]}
    return {"findings": data.get("findings") or [], "recommendations": data.get("open_questions") or data.get("recommendations") or []}


def workflow_file(verb: str) -> tuple[str, str | None]:
    """The verb's workflow: workflows/NAME.yaml beside the script, else the built-in one (name, text)."""
    name = f"{WORKFLOW_FOR[verb]}.yaml"
    path = WORKFLOWS_DIR / name
    builtin = builtin_files("workflows")
    if path.is_file() or name not in builtin:
        return str(path), None
    return builtin_label(f"workflows/{name}"), builtin[name]


def workflow_tasks(verb: str, args: argparse.Namespace, state: Mapping[str, Any]) -> list[DagTask]:
    """The shipped workflow's tasks for a verb: one phase alone, or the whole chain."""
    path, text = workflow_file(verb)
    tasks = load_dag_file(path, [f"task={args.task or state.get('taskDescription', '')}"], text)
    if verb in PHASES:
        (t,) = [t for t in tasks if t.id == verb]
        t.blocked_by = []
        results = state.get("results") or {}
        if verb == "build":
            if not results.get("plan"):
                raise UsageError(f"no plan in {args.state_file}; run 'spawn.py plan TASK' first")
            t.task += f"\n\n## plan\n{results['plan']}"
        if verb == "explore":
            t.task += f"\n\n{args.task}" if args.task else ""
            t.task += "\nDepth: " + (
                "list files and structure only." if args.depth == "shallow" else "full analysis: dependencies, patterns, metrics."
            )
        if verb == "plan" and args.prd:
            t.task += "\nAlso write a short PRD (problem, users, requirements, success criteria) as the plan's first step."
        tasks = [t]
    return tasks


def declined_asks(session: Path, agent_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Asks of these agents that were answered no (by a person, `deny`, or the timeout)."""
    ids, found = set(agent_ids), []
    for answer in sorted(asks_dir(session).glob("q-*.answer.json")):
        with contextlib.suppress(FileNotFoundError, SpawnError):
            ask = read_json(answer.with_name(answer.name.replace(".answer", "")))
            if ask.get("agent_id") in ids and read_json(answer).get("verdict") == "deny":
                found.append(ask)
    return found


def ask_question(tool: str, what: str, cwd: str, rule: str = "") -> str:
    """The question a person at the terminal sees for one of build's asks; paths relative to cwd."""
    what = what[len(cwd) + 1 :] if what.startswith(cwd.rstrip("/") + "/") else what
    if tool in EDIT_TOOLS and (size := re.search(r"\((lines>\d+)\)$", rule)):
        return f"? Refactor {what} (changes {size.group(1).replace('>', ' > ')})? (Y/n) "
    if tool == "Write":
        return f"? Create file {what}? (Y/n) "
    if tool == "Bash":
        return f"? Run '{what}' (deletes or moves files)? (Y/n) "
    return f"? Change {what} (a dependency manifest)? (Y/n) " if tool in EDIT_TOOLS else f"? Allow {tool} {what}? (Y/n) "


def answer_at_terminal(session: Path) -> None:
    """Put each pending ask of the session to the person at the terminal; the first answer wins."""
    for ask in pending_asks(session):
        # The question goes to stderr: stdout carries only the one JSON result.
        question = ask_question(str(ask.get("tool")), str(ask.get("input")), os.getcwd(), str(ask.get("rule") or ""))
        print(question, end="", file=sys.stderr, flush=True)
        reply = sys.stdin.readline().strip().lower() or ("y" if not sys.stdin.closed else "n")
        with contextlib.suppress(StateError):  # its agent stopped waiting meanwhile
            send_answer(session, str(ask["id"]), "approve" if reply in ("", "y", "yes") else "deny", "terminal", None)


def cmd_workflow(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """plan, build, explore, run-plan-build, run-all: run the phases, record them in the state file."""
    state_path = state_file_path(args.state_file)
    verb = args.verb
    state = read_state(state_path)  # a corrupt file stops us before anything starts
    if verb == "build" and args.dry_run:
        plan = (state.get("results") or {}).get("plan")
        if not plan:
            raise UsageError(f"no plan in {state_path}; run 'spawn.py plan TASK' first")
        steps = [line for line in plan.splitlines() if re.match(r"\d+\. ", line)]
        emit({"dry_run": True, "steps": steps, "files": sorted(set(re.findall(r"\(([^)]*)\)$", "\n".join(steps), re.M)))})
        return ExitCode.OK
    tasks = workflow_tasks(verb, args, state)
    apply_retries(tasks, args.retries)
    interactive = at_terminal()
    on_fail = failure_policy(args.on_fail, False, "ask" if interactive else "abort")
    now = utc_now_iso()
    params = {k: v for k, v in vars(args).items() if k not in ("traceback", "verb") and v is not None}

    def begin(data: dict[str, Any]) -> None:
        data["metadata"] = {"agentName": verb, "spawnVersion": __version__, "invocationTimestamp": now, "parameters": params}
        data.update(phase=tasks[0].id, status="running")
        data["taskDescription"] = args.task or data.get("taskDescription") or ""
        data.setdefault("results", {})
        data.setdefault("errors", [])
        data.setdefault("artifacts", {})
        data.setdefault("history", [])

    update_state(state_path, begin, args.rotate_mb)
    args.session = args.timeout = args.max_budget_usd = None
    started = time.time()
    runner_dir, plan = register_dag_runner(f"{verb} {args.task or ''}".strip(), verb, args, environ)
    session = Path(plan.meta.session)
    journal = journal_path(session, plan.meta.id)
    journal.parent.mkdir(exist_ok=True)
    graph: dict[str, Any] = {
        "event": "graph",
        "time": utc_now_iso(),
        "runner_id": plan.meta.id,
        "file": workflow_file(verb)[0],
    }
    graph.update(max_concurrent=1, fail_fast=on_fail == "abort", on_fail=on_fail, tasks=[record_to_json(t) for t in tasks])
    append_jsonl(journal, graph, plan.secrets)
    if args.verbose:
        note(f"{verb}: phases {' -> '.join(t.id for t in tasks)}; session {session}")
    results = run_dag(
        tasks, runner_dir, journal, done_before={}, max_concurrent=1, on_fail=on_fail, environ=environ,
        on_idle=(lambda: answer_at_terminal(session)) if interactive else None,
        choose=ask_failure_at_terminal,
        # run-all at a terminal asks before each phase after the first; nobody to ask otherwise.
        go_on=go_on_at_terminal if interactive and verb == "run-all" else None,
    )  # fmt: skip
    declined = declined_asks(session, [r["agent_id"] for r in results.values() if r.get("agent_id")])
    declined += [{"tool": "go on", "input": f"to {tid} (at the terminal)"} for tid, r in results.items() if r.get("declined_by")]

    def finish(data: dict[str, Any]) -> None:
        for tid, r in results.items():
            data["artifacts"][tid] = {"session": str(session), "agent_id": r.get("agent_id"), "journal": str(journal)}
            if r["status"] == "done":
                key = "exploration" if tid == "explore" else tid
                written = written_files(Path(r["outcome"]).with_name(TRANSCRIPT))
                data["results"][key] = phase_results(tid, read_json(Path(r["outcome"])).get("output"), written)
                data["phase"] = tid
            elif r["status"] != "skipped" or r.get("skipped_by"):
                data["errors"].append({"phase": tid, "time": utc_now_iso(), "message": r.get("reason", "")})
                data["phase"] = tid
            entry = {"phase": tid, "status": r["status"], "time": utc_now_iso()}
            data["history"].append({**entry, "attempt": r["attempt"]} if r.get("attempt") else entry)
        ok = all(r["status"] == "done" for r in results.values())
        data["status"] = "declined" if declined else "success" if ok else "error"

    saved = update_state(state_path, finish, args.rotate_mb)
    code = finish_runner(runner_dir, plan, results, started, journal)
    if args.verbose:
        note(f"{verb}: {saved['status']}; state in {state_path}")
    if declined:
        raise DeclinedError(f"declined: {declined[0]['tool']} {declined[0]['input']}; the state is saved in {state_path}")
    return code


def cmd_state(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    path = state_file_path(args.state_file)
    if args.action == "show":
        emit(read_state(path))
        return ExitCode.OK
    with state_lock(path):
        try:
            os.close(open_state_nofollow(path, os.O_RDONLY | os.O_NONBLOCK))  # refuses a link: never delete its target
            existed = True
        except FileNotFoundError:
            existed = False
        path.unlink(missing_ok=True)
    emit({"cleared": str(path), "existed": existed})
    return ExitCode.OK

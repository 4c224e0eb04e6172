"""The runner: run_agent takes one agent to its one committed outcome; background launches, refusal
records, and the settling of its descendants.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ..core.constants import (
    DROP_BOX_POLL_S,
    DROPPED_REFUSAL_MAX_BYTES,
    DROPPED_REFUSALS_MAX,
    ENV_AGENT_ID,
    ENV_OTLP_ENDPOINTS,
    ENV_SESSION,
    HEARTBEAT,
    IDLE_CHECK_S,
    IDLE_CPU_SHARE,
    KILL_GRACE_S,
    LEFTOVER_GRACE_S,
    OTEL_EXPORT_TIMEOUT_S,
    OTEL_EXPORTER,
    OUTCOME,
    OUTCOME_KEPT,
    REFUSED_DIR,
    RUNNER_LOG,
    SCHEMA_DIR,
    SCRIPT_DIR,
    SLOT_POLL_S,
    SLOT_WAIT_S,
    STOP_HOOKS_S,
    TRANSCRIPT,
)
from ..core.errors import CorruptRecordError, ExitCode, RefusedError, SpawnError, StateError
from ..core.forkstate import on_fork
from ..core.output import note
from ..core.prelude import inside_sandbox
from ..core.pure import (
    id_depth,
    new_agent_id,
    outcome_problem,
    parse_json,
    redacted_json,
    round_usd,
    started_timestamp,
    truncate_for_stdout,
    utc_now_iso,
    validate_output,
)
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Heartbeat, Outcome, Status, record_from_json, record_to_json
from ..core.settings import Settings
from ..policy.admission import try_take_slot
from ..policy.gateway import (
    REAL_CREDENTIAL_VARS,
    forget_real_credential,
    gateway_choice,
    gateway_gone,
    gateway_listen,
    gateway_start_lock,
    gateway_url,
    settle_agent,
    soft_budget_warning,
    start_gateway,
    stop_gateway,
)
from ..session.ledger import charge, read_ledger
from ..session.protocol import (
    AGENTS_DIR,
    DONE_MARKER,
    FAIL_MARKER,
    iter_agent_dirs,
    load_meta,
    open_regular,
    publish_once,
    read_json,
    read_limits,
    read_outcome,
    read_text,
    truncated_logs,
    with_estimated_cost,
    write_file_atomic,
    write_json_atomic,
)
from ..supervise.cluster import launch_on_ray, ray_address
from ..supervise.commit import commit_outcome
from ..supervise.fast_start import compiled_script
from ..supervise.supervisor import (
    GUARD_SETTLED,
    Supervised,
    become_subreaper,
    child_running,
    end_own_subtree,
    enter_tree_cgroup,
    is_guard,
    own_identity,
    own_pid_namespace,
    owned_cgroup,
    procfs_is_ours,
    register_runner,
    roots_running,
    sandbox_owner,
    stamp_where,
    start_guard,
    wait_gone,
)
from .broker import Broker, has_broker
from .executors import Executor, executor_for
from .forkserver import Entry, fork_detached_runner, forkserver_wanted, start_forkserver
from .inprocess import in_process_tree
from .resolving import Plan, load_schema, write_meta
from .running import (
    STOP_SIGNALS,
    EarlyStop,
    RunState,
    SdkLoader,
    stopped_by,
    user_command,
)

if TYPE_CHECKING:  # not at run time: asyncio is loaded where a run needs it, not by every verb
    import asyncio

# ------------------------------------------------------------ the CLI's start --


async def heartbeat_loop(agent_dir: Path, state: RunState, interval: float, idle_timeout: float | None = None) -> None:
    """Refresh heartbeat.json while the CLI is alive; a wedged agent stops beating."""
    import asyncio

    if state.cli_pid is None:
        # An event, not a poll: a runner can wait seconds for a start slot,
        # and each wake of a sleeping process costs ~0.1-0.3 ms of CPU on a VM.
        state.cli_started = asyncio.Event()
        await state.cli_started.wait()
    cli = state.cli_pid
    assert cli is not None
    if procfs_is_ours():
        try:
            create_time = psutil.Process(cli).create_time()
        except psutil.Error:
            return
        # Supervised.alive, not is_running() then status(): the CLI can exit
        # between the two, and the status call would raise out of this task.
        alive = Supervised(cli, create_time).alive
    else:  # in a sandbox: the CLI is our child, which the kernel answers for
        create_time, alive = time.time(), functools.partial(child_running, cli)
    while alive():
        beat = Heartbeat(cli, create_time, state.cli_pgid or cli, time.time(), interval, state.last_activity, idle_timeout)
        with contextlib.suppress(OSError):
            write_json_atomic(agent_dir / HEARTBEAT, record_to_json(beat))
        await asyncio.sleep(interval)


def cli_cpu_seconds(cli_pid: int) -> float:
    """CPU time used so far by the CLI and everything below it."""
    total = 0.0
    try:
        cli = psutil.Process(cli_pid)
        procs = [cli, *cli.children(recursive=True)]
    except psutil.Error:
        return total
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


async def idle_watch(meta: AgentMeta, state: RunState, idle_timeout: float, stop: Callable[[Status, str], None]) -> None:
    """End the agent once its CLI has been idle for idle_timeout (no event, no CPU, no live child)."""
    import asyncio

    check = min(IDLE_CHECK_S, idle_timeout / 4)
    last_cpu: float | None = None
    while True:
        await asyncio.sleep(check)
        if state.cli_pid is None or (state.pause is not None and state.pause.is_paused):
            # Queued for a slot, the CLI starting, or paused at the budget: waiting, not stalled.
            state.last_activity = time.time()
            continue
        cpu = await asyncio.to_thread(cli_cpu_seconds, state.cli_pid)
        if last_cpu is not None and cpu - last_cpu > IDLE_CPU_SHARE * check:
            state.last_activity = time.time()
        last_cpu = cpu
        if time.time() - state.last_activity < idle_timeout:
            continue
        if await asyncio.to_thread(live_descendants, meta):
            state.last_activity = time.time()  # waiting on its children is work
            continue
        stop(Status.FAILED, f"stalled: no activity for {idle_timeout:g} s")
        return


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)


def create_worktree(cwd: Path, agent_dir: Path, agent_id: str) -> Path:
    """A fresh git worktree of cwd's repository on branch spawn/ID, for `isolation: worktree`."""
    path = agent_dir / "worktree"
    proc = _git(cwd, "worktree", "add", "-q", "-b", f"spawn/{agent_id}", str(path), "HEAD")
    if proc.returncode != 0:
        raise StateError(f"isolation: worktree needs a git repository with a commit at {cwd}: {proc.stderr.strip()}")
    # Keep the agent's place below the top, so relative paths in the task still mean the same.
    top = _git(cwd, "rev-parse", "--show-toplevel").stdout.strip()
    return path / cwd.resolve().relative_to(Path(top).resolve()) if top else path


def settle_worktree(cwd: Path, agent_dir: Path, agent_id: str) -> str | None:
    """Remove an unchanged worktree and its branch; keep a changed one. Returns the kept path."""
    path = agent_dir / "worktree"
    if not path.is_dir():
        return None
    status = _git(path, "status", "--porcelain")
    if status.returncode != 0 or status.stdout.strip() or _git(path, "rev-parse", "HEAD").stdout != _git(cwd, "rev-parse", "HEAD").stdout:
        return str(path)
    _git(cwd, "worktree", "remove", "--force", str(path))
    _git(cwd, "branch", "-D", f"spawn/{agent_id}")
    return None


def run_agent(
    agent_dir: Path,
    cli: Path,
    secrets_: Sequence[str],
    sdk_loader: SdkLoader | None = None,
    guard: tuple[int, int] | None = None,
    *,
    admitted: AgentMeta | None = None,
    entry: Entry,
    settings: Settings,
) -> Outcome:
    """Run a registered agent to its one committed outcome, in the settings its edge read.

    admitted: the record as admission checked it; the file is not read
    again, so nothing written there afterwards changes what runs.
    """
    meta = admitted or load_meta(agent_dir)
    executor = executor_for(meta.kind)
    state = RunState(settings, in_process_tree(meta, agent_dir, secrets_, load_schema, settings))
    started = time.time()
    guard_pid, guard_pipe, error, home_cwd = start_agent_run(
        meta, agent_dir, cli=cli, executor=executor, state=state, secrets_=secrets_, sdk_loader=sdk_loader, guard=guard, entry=entry
    )
    import asyncio  # loaded by now (start_agent_run)

    async def main_task() -> None:
        nonlocal error
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop(status: Status, detail: str) -> None:
            if state.stop_reason is None:
                state.stop_reason, state.stop_detail = status, detail
                state.running_below = live_descendants(meta)
                stopping.append(asyncio.ensure_future(shut_down_agent(meta, state, task)))

        state.request_stop = stop

        stopping: list[asyncio.Future[None]] = []

        def on_signal(signum: int) -> None:
            stop(*stopped_by(signum, agent_dir))  # read at the signal: a kill leaves its reason just before

        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
        if EarlyStop.pending is not None:
            on_signal(EarlyStop.pending)
        if meta.deadline is not None:
            loop.call_at(loop.time() + max(0.0, meta.deadline - time.time()), stop, Status.TIMEOUT, "deadline reached")
        beat = asyncio.create_task(heartbeat_loop(agent_dir, state, state.settings.heartbeat_s, meta.idle_timeout_s))
        watchers = start_watchers(meta, agent_dir, state, secrets_, stop)
        try:
            await wait_for_slot(meta, agent_dir, stop)
            if error is None:
                await executor.run(meta, agent_dir, cli, state, secrets_, sdk_loader=sdk_loader)
            # A node that ended while being stopped (a remote task that reports
            # itself canceled) waits for the stop to finish: its hooks, such as
            # the A2A cancel, still record what they did.
            if stopping:
                await asyncio.gather(*stopping)
        except asyncio.CancelledError:
            if state.stop_reason is None:
                raise
        except Exception as exc:  # the SDK's errors become a failed outcome
            error = executor.describe_error(exc, agent_dir)
            # -N: killed by signal N; 128+N: a shell's way of saying the same.
            state.cli_killed = getattr(exc, "exit_code", None) in (-signal.SIGTERM, -signal.SIGKILL, 143, 137)
        finally:
            beat.cancel()
            for watcher in watchers:
                watcher.cancel()
            # Closing the loop resets its signal handlers to the default
            # action: held back from here, a late stop signal (a parent
            # ending its subtree) can't end us before the outcome is written.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    try:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(main_task())
    finally:
        EarlyStop.arm()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        return finish_agent_run(
            meta,
            agent_dir,
            executor=executor,
            state=state,
            started=started,
            error=error,
            home_cwd=home_cwd,
            guard=(guard_pid, guard_pipe),
            secrets_=secrets_,
        )
    finally:
        stop_root_gateway(meta)


GATEWAY_WATCH_S = 0.5  # how often a root's runner looks whether its gateway still runs
# The gateway this process started (a root's runner): stopped when its run ends.
GATEWAYS: list[subprocess.Popen[bytes] | None] = []
on_fork("GATEWAYS", GATEWAYS.clear)


def stop_root_gateway(meta: AgentMeta) -> None:
    """The gateway this root started, at its tree's end: stopped, unless another root of the session (an MCP
    server's) still runs on it, which it then serves until the last has ended (exit_with_session)."""
    while GATEWAYS:
        proc = GATEWAYS.pop()
        if not roots_running(Path(meta.session), besides=meta.id):
            stop_gateway(proc, Path(meta.session))


def root_gateway(meta: AgentMeta, state: RunState) -> None:
    """A root's: start the session's gateway, or join the one another root of the session started."""
    session = Path(meta.session)
    with gateway_start_lock(session):
        if gateway_url(session) is None or gateway_gone(session) is not None:
            start_tree_gateway(meta, state)
    if gateway_url(session) is not None:
        # The gateway holds the real credential now: it leaves this runner's environment, and the
        # environment its CLI starts from (the one read, which may start the CLI before the SDK
        # loads). A root that joins a session whose gateway another root started (an MCP
        # server's agents) still has it in both.
        forget_real_credential()
        state.settings = state.settings.without(REAL_CREDENTIAL_VARS)


def start_tree_gateway(meta: AgentMeta, state: RunState) -> None:
    """The root's: start the tree's gateway when it wants one, or say once why its budget stays soft."""
    policy = (meta.placement or {}).get("policy")
    start, soft = gateway_choice(state.settings, meta.max_budget_usd)
    if start:
        # Before the root's CLI, which gets its URL; inside the cgroup, so it ends with the tree.
        # The tree's budget as limits.json has it now, before any agent of the tree has run (a root
        # that shares a session, as an MCP server's roots do, holds less than it).
        budget = read_limits(Path(meta.session)).max_budget_usd
        # On loopback, or where a cluster's nodes reach this host when the tree is placed on one.
        listen = gateway_listen(policy if isinstance(policy, str) else None)
        proc, source = start_gateway(Path(meta.session), str(compiled_script()), budget, listen)
        GATEWAYS.append(proc)
        soft = None if proc is not None else f"no gateway: {source}"
    if soft is not None:
        note(f"warning: {soft_budget_warning(soft)}")


def start_watchers(
    meta: AgentMeta, agent_dir: Path, state: RunState, secrets_: Sequence[str], stop: Callable[[Status, str], None]
) -> list[asyncio.Task[None]]:
    """What watches the run beside its CLI, as it needs: its idle time, its drop box, its tree's gateway."""
    import asyncio

    coros: list[Coroutine[Any, Any, None]] = []
    if meta.idle_timeout_s:
        coros.append(idle_watch(meta, state, meta.idle_timeout_s, stop))
    if (service := drop_box_service(meta, agent_dir, state, secrets_)) is not None:
        coros.append(service)
    if GATEWAYS and GATEWAYS[-1] is not None:
        coros.append(gateway_watch(GATEWAYS[-1], stop))
    return [asyncio.create_task(c) for c in coros]


async def gateway_watch(proc: subprocess.Popen[bytes], stop: Callable[[Status, str], None]) -> None:
    """The root's: a gateway that ends before its tree ends the tree, at once and saying why (its CLIs
    would otherwise retry a refused connection for minutes, and no call may go around it)."""
    import asyncio

    while proc.poll() is None:
        await asyncio.sleep(GATEWAY_WATCH_S)
    why = f"the tree's gateway (pid {proc.pid}) ended (exit {proc.returncode}), so no model call of the tree can be made or metered"
    stop(Status.FAILED, f"model gateway: {why}")


def metered_outcome(meta: AgentMeta, outcome: Outcome) -> Outcome:
    """The outcome with the gateway's figure as its cost (the CLI's kept beside), and its refusal as its reason;
    under a budget with no gateway, a warning that the budget was soft."""
    session = Path(meta.session)
    if meta.kind != "claude":
        return outcome
    if gateway_url(session) is None:
        if read_limits(session).max_budget_usd is not None:
            outcome.warnings.append(soft_budget_warning("the tree ran without its gateway"))
        return outcome
    settle_agent(session, meta.id)
    ledger = read_ledger(session)
    if meta.id in ledger.spends:
        outcome.cli_cost_usd, outcome.cost_usd = outcome.cost_usd, round_usd(ledger.spends[meta.id])
        outcome.cost_estimated = None
    refusal = ledger.refusals.get(meta.id)
    if refusal and outcome.status == Status.FAILED:
        outcome.reason = f"{refusal}; {outcome.reason}"[:2000]
    elif outcome.status == Status.FAILED and (pid := gateway_gone(session)) is not None:
        why = f"model gateway: the tree's gateway (pid {pid}) is gone, so no model call of the tree can be made or metered"
        outcome.reason = f"{why}; {outcome.reason}"[:2000]
    return outcome


def start_agent_run(
    meta: AgentMeta,
    agent_dir: Path,
    *,
    cli: Path,
    executor: Executor,
    state: RunState,
    secrets_: Sequence[str],
    sdk_loader: SdkLoader | None,
    guard: tuple[int, int] | None,
    entry: Entry,
) -> tuple[int, int, str | None, Path]:
    """run_agent's start: the guard, the cgroup, the worktree, the node's start, the SDK's import, the fork server.

    (guard pid, guard pipe, the error that ends the run before it starts or None, the project's own cwd).
    """
    become_subreaper()
    guard_pid, guard_pipe = guard or start_guard(agent_dir)
    if meta.parent_id is None and meta.kind == "claude":
        root_gateway(meta, state)  # before the tree's cgroup, which the gateway outlives while another root of the session runs
    enter_tree_cgroup(meta)  # after the guard starts, so the guard stays outside
    error: str | None = None
    home_cwd = Path(meta.cwd)
    if meta.isolation == "worktree":
        try:
            meta.cwd = str(create_worktree(home_cwd, agent_dir, meta.id))  # this run only; meta.json keeps the project's
        except StateError as exc:
            error = exc.message
    if error is None:
        executor.start(meta, agent_dir, cli, state, secrets_)  # inside the cgroup, with the rest of the tree
    # Not at the top of the file (the verbs and --dry-run don't need it), and
    # not before the CLI's start: ~30 ms that a root's CLI would wait for.
    # Before the SDK's import thread, which then finds it loaded, and before
    # the fork server, which inherits it (and ssl with it) ready to serve.
    import asyncio  # noqa: F401

    if sdk_loader is not None:
        sdk_loader.start()
    if forkserver_wanted(meta, state.settings):
        start_forkserver(meta, sdk_loader, entry)  # after entering the cgroup: it ends with the tree
    return guard_pid, guard_pipe, error, home_cwd


def finish_agent_run(
    meta: AgentMeta,
    agent_dir: Path,
    *,
    executor: Executor,
    state: RunState,
    started: float,
    error: str | None,
    home_cwd: Path,
    guard: tuple[int, int],
    secrets_: Sequence[str],
) -> Outcome:
    """run_agent's end: end what the agent left, settle its descendants, commit its outcome, release the guard."""
    guard_pid, guard_pipe = guard
    # Whatever happened, nothing the agent started may outlive it.
    groups = [g for g in (state.cli_pgid,) if g]
    running_below = state.running_below if state.stop_reason else live_descendants(meta)
    # The tree's gateway is spared until the outcome has its charges (metered_outcome), then stopped last.
    gateways = [g.pid for g in GATEWAYS if g is not None]
    end_own_subtree(groups, grace=KILL_GRACE_S if state.stop_reason else LEFTOVER_GRACE_S, spare=[guard_pid, *gateways])
    settle_below(meta, state, secrets_, running_below)
    if has_drop_box(meta):
        record_dropped_refusals(meta, secrets_, DROPPED_REFUSALS_MAX - state.refusals_recorded, final=True)
    outcome = metered_outcome(meta, executor.outcome(meta, agent_dir, state, started, error))
    outcome.truncated = truncated_logs(agent_dir) or None
    if meta.isolation == "worktree":
        outcome.worktree = settle_worktree(home_cwd, agent_dir, meta.id)
    foreign = None
    if not commit_outcome(agent_dir, outcome, secrets_):
        asked_to_stop = state.stop_reason is not None or EarlyStop.pending is not None
        committed, foreign = outcome_committed_instead(agent_dir, outcome, secrets_, asked_to_stop=asked_to_stop)
        outcome = committed or outcome
    if owned_cgroup(meta) is None:
        # Outcome committed, subtree ended: nothing is left for the guard (see GUARD_SETTLED).
        with contextlib.suppress(OSError):
            os.write(guard_pipe, GUARD_SETTLED)
        os.close(guard_pipe)
    # With a tree cgroup, which holds us too, the pipe stays open until we
    # exit: only then does the guard wake and end that cgroup, so our summary
    # is never cut short, and an exiting process's status is already set.
    # (Moving out of the cgroup instead costs a cgroup migration, 10-30 ms.)
    if foreign is not None:
        raise foreign
    if meta.output_file and outcome.status == Status.DONE:
        write_output_file(Path(meta.output_file), outcome.output)
    return outcome


def settle_below(meta: AgentMeta, state: RunState, secrets_: Sequence[str], running_below: set[str]) -> None:
    """Every agent below an ending one gets its outcome: its in-process children
    first, from what its runner saw of them (nothing else knows they are gone)."""
    if state.in_process is not None:
        state.in_process.settle(state.stop_reason, state.stop_detail)
    settle_descendants(meta, secrets_, running_below)


async def shut_down_agent(meta: AgentMeta, state: RunState, task: Any) -> None:
    """Stop a running agent: child agents first, so they can record their own outcome; then our CLI.

    The CLI is frozen meanwhile, so the agent takes no further turn.

    The CLI kills its Bash commands hard when it is ended, and a child
    agent's spawn.py runs inside one. Cancelled without this, the SDK
    would also give the CLI 5 s to exit on its own, and a stopped agent
    must be gone well within its parent's grace.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    began = loop.time()
    # At once, beside the children's end: an a2a node's hook cancels its remote
    # task, and a request this process abandons before the remote has read it
    # is dropped there, leaving the remote subtree running.
    hooks = [asyncio.ensure_future(hook()) for hook in state.stop_hooks]
    try:
        # Freeze the CLI (not its group, where child agents run): it
        # must not start another model turn while the children end.
        if state.cli_pid:
            Supervised.signal_pid(state.cli_pid, signal.SIGSTOP)
        children = []
        for d in descendants_of(Path(meta.session), meta.id):
            with contextlib.suppress(FileNotFoundError, SpawnError):
                child_meta = load_meta(d)
                child = Supervised.of(child_meta)
                if child_meta.id in state.running_below and child.signal(signal.SIGTERM):
                    children.append(child)
        # The SIGKILL half of the stop path comes after the CLI's end,
        # in end_own_subtree; until then the loop keeps serving signals.
        limit = began + KILL_GRACE_S
        while loop.time() < limit and any(c.alive() for c in children):
            await asyncio.sleep(0.05)
        if hooks:
            # A killer waits 2 * KILL_GRACE_S for this process (settle_agents): the hooks
            # get all of it but the moment the outcome's commit and the exit take.
            await asyncio.wait(hooks, timeout=max(0.0, began + STOP_HOOKS_S - loop.time()))
        for hook in hooks:
            if hook.done() and not hook.cancelled():
                hook.exception()  # retrieved: a failed hook never stops the stop path
            else:
                hook.cancel()
        if state.cli_pgid:
            Supervised.signal_group(state.cli_pgid, signal.SIGTERM)
    finally:
        if state.cli_pid:
            Supervised.signal_pid(state.cli_pid, signal.SIGCONT)  # so it can act on the SIGTERM
        task.cancel()


async def wait_for_slot(meta: AgentMeta, agent_dir: Path, stop: Callable[[Status, str], None]) -> None:
    """Take a --max-concurrent slot, if the session has that limit."""
    import asyncio

    max_concurrent = read_limits(Path(meta.session)).max_concurrent
    if max_concurrent is not None:
        # Waits with the deadline and signal handlers armed, so a queued
        # agent can still be killed or time out with an outcome.
        limit = time.monotonic() + SLOT_WAIT_S
        while not try_take_slot(agent_dir, max_concurrent):
            if meta.deadline is None and time.monotonic() > limit:
                stop(Status.TIMEOUT, f"no --max-concurrent slot within {SLOT_WAIT_S:.0f} s")
            await asyncio.sleep(SLOT_POLL_S)


def outcome_committed_instead(
    agent_dir: Path, own: Outcome, secrets_: Sequence[str], *, asked_to_stop: bool
) -> tuple[Outcome | None, StateError | None]:
    """The outcome another writer committed first, which stands (a deadline, a
    parent's kill); or, when outcome.json is no outcome spawn.py committed for
    this agent, the error to end with.

    spawn.py commits for a live runner only after asking it to stop (a stop
    signal, then a grace): a runner never asked that loses the race lost it
    to something else, however well-formed the record (a sibling's Bash can
    forge one that passes for a kill). Either way this agent's own outcome is
    kept beside it in OUTCOME_KEPT and charged to the ledger, so what it found
    and spent is not lost. (The ledger counts an agent's first charge only:
    a winner spawn.py charged already is not charged twice.)
    """
    try:
        committed = read_outcome(agent_dir)
        why = "missing" if committed is None else outcome_problem(committed, own.id)
    except CorruptRecordError as exc:
        committed, why = None, exc.message
    if why is None and not asked_to_stop:
        why = f"nothing asked {own.id} to stop, so no spawn.py settled it"
    kept = agent_dir / OUTCOME_KEPT
    where = f"is kept in {kept}"
    if publish_once(kept, redacted_json(record_to_json(own), secrets_, indent=2).encode()):
        charge(agent_dir, own, secrets_)  # what it spent is spent, whoever wrote outcome.json
    else:
        where = f"could not be kept: {kept} exists too; its transcript is {agent_dir / TRANSCRIPT}"
    if committed is not None and why is None:
        winner = record_from_json(Outcome, committed)
        by = str(winner.committed_by)[:40]
        note(f"warning: {own.id}'s outcome.json was committed first by {by!r} ({winner.status}); its own outcome ({own.status}) {where}")
        return winner, None
    return None, StateError(
        f"{agent_dir / OUTCOME} was published by something other than spawn.py ({why}); {own.id}'s own outcome ({own.status}) {where}"
    )


def write_output_file(path: Path, output: Any) -> None:
    text = output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, (text + ("" if text.endswith("\n") else "\n")).encode())
    except OSError as exc:
        raise StateError(f"can't write --output {path}: {exc.strerror}; the result is in outcome.json") from None


def summary(agent_dir: Path, outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The one bounded JSON object a parent reads from stdout."""
    out, truncated = truncate_for_stdout(outcome.get("output"), agent_dir / OUTCOME)
    data: dict[str, Any] = {
        "id": outcome.get("id") or agent_dir.name,
        "status": outcome.get("status"),
        "exit_code": outcome.get("exit_code"),
        "reason": outcome.get("reason"),
        "output": out,
    }
    if truncated:
        data["output_truncated"] = True
    if outcome.get("validation_errors"):
        data["validation_errors"] = outcome["validation_errors"][:20]
    if "cost_usd" in outcome:  # other nodes' costs come as their servers or commands wrote them
        cost = outcome["cost_usd"]
        data["cost_usd"] = round_usd(cost) if isinstance(cost, float) else cost
    if outcome.get("worktree"):
        data["worktree"] = outcome["worktree"]  # the changes to review and merge
    data["duration_s"] = outcome.get("duration_s")
    data["agent_dir"] = str(agent_dir)
    data["outcome"] = str(agent_dir / OUTCOME)
    data["transcript"] = str(agent_dir / TRANSCRIPT)
    return data


def launch_background(agent_dir: Path, plan: Plan, environ: Mapping[str, str]) -> dict[str, Any]:
    """Start the runner detached; it is registered under its own pid."""
    # A session of its own: the launcher's caller (a Bash tool call, a CI
    # step) may end its process group as soon as the launcher returns.
    address = ray_address(plan.meta, environ)
    pid: int | None
    pgid: int | None = None
    with open(agent_dir / RUNNER_LOG, "ab") as log:
        if address is not None:  # a token (tools/ray_place.py's) is the agent's process here; it runs on a node
            runner = [sys.executable, str(compiled_script())]
            pid, pgid, where = launch_on_ray(agent_dir, address, runner, record_to_json(plan.meta), environ=environ)
            plan.meta.placement = {**(plan.meta.placement or {"reason": f"placement ray:{address}", "policy": f"ray:{address}"}), **where}
        else:
            # Forked by the session's fork server if this launcher was too.
            pid = fork_detached_runner(agent_dir, plan.meta.session, plan.meta.cwd, log.fileno())
        if pid is None:
            pid = subprocess.Popen(
                [sys.executable, str(compiled_script()), "_run", str(agent_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd=plan.meta.cwd,
            ).pid
    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        create_time = time.time()
    plan.meta.pid, plan.meta.create_time, plan.meta.pgid = pid, create_time, pgid or pid
    stamp_where(plan.meta)
    if address is None:  # a token is no agent's process: the runner started on a node registers itself there
        # Before meta.json, which the runner waits for before it starts the agent.
        register_runner(pid, create_time, agent_dir)
    write_meta(agent_dir, plan.meta, plan.secrets)
    return {
        "id": plan.meta.id,
        "status": Status.RUNNING.value,
        "pid": pid,
        "agent_dir": str(agent_dir),
        "outcome": str(agent_dir / OUTCOME),
        "done_marker": str(agent_dir / DONE_MARKER),
        "fail_marker": str(agent_dir / FAIL_MARKER),
        "wait": f"{user_command(environ, Path.cwd())} wait {plan.meta.id}",
    }


def export_trace(meta: AgentMeta, environ: Mapping[str, str]) -> None:
    """Send the finished tree's spans to OTLP, when OTEL_EXPORTER_OTLP_ENDPOINT is set.

    Once per tree, by the root, whose outcome means its subtree is settled.
    The exporter runs in a process of its own with its own pinned
    dependencies, so no agent at any depth imports OpenTelemetry. A failed
    export is a note on stderr: it never changes the agent's outcome.
    """
    if meta.depth != 0 or not any(environ.get(name) for name in ENV_OTLP_ENDPOINTS):
        return
    import shutil

    exporter, uv = SCRIPT_DIR / OTEL_EXPORTER, shutil.which("uv")
    if uv is None or not exporter.exists():
        note(f"warning: no OpenTelemetry export: it needs uv on PATH and {OTEL_EXPORTER} beside spawn.py")
        return
    try:
        done = subprocess.run(
            [uv, "run", "--quiet", "--script", str(exporter), meta.session],
            env=dict(environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=OTEL_EXPORT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        note(f"warning: OpenTelemetry export failed: {exc}")
        return
    if done.returncode != 0:
        note(f"warning: OpenTelemetry export failed: {done.stderr.strip()[-500:]}")


def refusal_outcome(meta: AgentMeta, reason: str) -> Outcome:
    return Outcome(
        id=meta.id,
        status=Status.REFUSED,
        reason=reason,
        exit_code=ExitCode.REFUSED,
        ended_at=utc_now_iso(),
        duration_s=0.0,
        warnings=meta.warnings,
    )


def record_refusal(agent_dir: Path, plan: Plan) -> Outcome:
    outcome = refusal_outcome(plan.meta, plan.refusal or "refused")
    commit_outcome(agent_dir, outcome, plan.secrets)
    return outcome


# A sandboxed leaf sees agents/ read-only (sandbox_writes), so the spawn.py it
# runs can't record a refused child there, and a hostile leaf can't forge its
# siblings' records. That spawn.py writes the refused child's meta into the
# leaf's drop box instead, and the leaf's runner, outside the sandbox, checks
# it and records it: while the leaf runs (once a second), when it ends, and,
# if the runner died, when the agent is settled.


def drop_refusal(plan: Plan) -> tuple[Path, Outcome, str] | None:
    """A spawn refused inside a sandboxed leaf: hand its record to the leaf's runner.

    (where the runner will record it, its outcome, the leaf's id), or None
    where agents/ is writable (the normal path records it). RefusedError
    when there is no drop box to write either.
    """
    meta = plan.meta
    session = Path(meta.session)
    if os.access(session / AGENTS_DIR, os.W_OK) or not inside_sandbox():
        return None
    owner = sandbox_owner()
    box = session / REFUSED_DIR / (owner.name if owner is not None else "")
    if owner is None or not os.access(box, os.W_OK):
        raise RefusedError(f"refused: {plan.refusal}; not recorded: the session directory is read-only here")
    meta.id = new_agent_id(meta.depth)
    meta.pid, meta.create_time, meta.pgid = own_identity()
    stamp_where(meta)
    reason = plan.refusal or "refused"
    data = redacted_json({"meta": record_to_json(meta), "reason": reason}, plan.secrets)
    if not publish_once(box / f"{meta.id}.json", data.encode()):
        raise StateError(f"{box / meta.id}.json already exists; agent ids must be unique")
    return session / AGENTS_DIR / meta.id, refusal_outcome(meta, reason), owner.name


def dropped_refusal(
    leaf: AgentMeta, name: str, raw: bytes, meta_schema: Mapping[str, Any], host_namespace: str | None
) -> tuple[AgentMeta, str] | str:
    """A refused child's meta and reason from a file in leaf's drop box, or what is wrong with it (pure).

    The leaf wrote it, so nothing in it is trusted: it must be a valid meta
    record of a child one level below, and what the leaf could not have been
    given by its own spawn.py (who the parent is, where it is, how deep, what
    tools and depth it may have) is set from the leaf's own meta.
    """
    match = re.fullmatch(r"(a(\d{1,4})-[0-9a-f]{6})\.json", name)
    if match is None or int(match[2]) != leaf.depth + 1:
        return f"{name}: not the record of a child at depth {leaf.depth + 1}"
    try:
        data = parse_json(raw)
    except ValueError:
        return f"{name}: not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str) or not isinstance(data.get("meta"), dict):
        return f"{name}: not a refused spawn's record"
    errors = validate_output(meta_schema, data["meta"])
    if errors:
        return f"{name}: not a meta record: {errors[0]}"
    try:
        meta = record_from_json(AgentMeta, data["meta"])
        started_timestamp(meta)
    except (TypeError, ValueError, AttributeError) as exc:
        return f"{name}: not a meta record: {exc}"
    meta.id, meta.session, meta.parent_id, meta.depth = match[1], leaf.session, leaf.id, leaf.depth + 1
    meta.max_depth = min(meta.max_depth, leaf.max_depth)
    meta.tools = [t for t in meta.tools if t in leaf.tools]
    meta.sandbox, meta.containment, meta.background = "inherited", None, False
    if meta.pid_namespace is None or meta.pid_namespace == host_namespace:
        # Its pid was the sandbox's (and is only what the leaf says): never one to look up or signal here.
        meta.pid_namespace = f"sandbox of {leaf.id}"
    return meta, data["reason"][:2000] or "refused"


def has_drop_box(meta: AgentMeta) -> bool:
    return meta.sandbox == "on" and meta.depth >= meta.max_depth


def record_dropped_refusals(leaf: AgentMeta, secrets_: Sequence[str], room: int = DROPPED_REFUSALS_MAX, *, final: bool = False) -> int:
    """Record the refused spawns in leaf's drop box, at most room of them; how many were recorded.

    Every file is taken out of the box, recorded or not: a file the leaf put
    there is never read twice, and one that isn't a refused child's record
    is named in a warning on stderr. final: nothing of the leaf runs any
    more, and the emptied box goes too.
    """
    session = Path(leaf.session)
    box = session / REFUSED_DIR / leaf.id
    try:
        names = sorted(os.listdir(box))
    except OSError:
        return 0
    recorded, schema = 0, None
    for name in names:
        path = box / name
        if name.startswith("."):
            if final:  # publish_once's temp file, left by a writer that died
                with contextlib.suppress(OSError):
                    path.unlink()
            continue  # publish_once's temp file, there only while it writes
        try:
            fd, _ = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                raw = os.read(fd, DROPPED_REFUSAL_MAX_BYTES + 1)
            finally:
                os.close(fd)
        except (OSError, CorruptRecordError):
            raw = None
        with contextlib.suppress(OSError):
            path.unlink()
        if recorded >= room:
            note(f"warning: {leaf.id}'s refused spawn {name} not recorded: more than {DROPPED_REFUSALS_MAX} of them")
            continue
        if raw is None or len(raw) > DROPPED_REFUSAL_MAX_BYTES:
            note(f"warning: {leaf.id}'s drop box held {name}, not a refused spawn's record of at most {DROPPED_REFUSAL_MAX_BYTES} bytes")
            continue
        if schema is None:
            schema = json.loads((SCHEMA_DIR / "meta.json").read_text())
        found = dropped_refusal(leaf, name, raw, schema, own_pid_namespace())
        if isinstance(found, str):
            note(f"warning: {leaf.id}'s drop box: {found}; not recorded")
            continue
        meta, reason = found
        agent_dir = session / AGENTS_DIR / meta.id
        try:
            agent_dir.mkdir()
        except OSError as exc:
            note(f"warning: {leaf.id}'s refused spawn {meta.id} not recorded: {exc.strerror or exc}")
            continue
        write_meta(agent_dir, meta, secrets_)
        commit_outcome(agent_dir, refusal_outcome(meta, reason), secrets_)
        recorded += 1
    if final:
        with contextlib.suppress(OSError):
            box.rmdir()
    return recorded


def drop_box_service(meta: AgentMeta, agent_dir: Path, state: RunState, secrets_: Sequence[str]) -> Coroutine[Any, Any, None] | None:
    """What serves a sandboxed agent's drop box while it runs: a leaf's refused spawns, a spawner's requests (the broker)."""
    if has_drop_box(meta):
        return drop_box_loop(meta, state, secrets_)
    if has_broker(meta):
        return Broker(meta, agent_dir, descendants_of, state.settings).serve()
    return None


async def drop_box_loop(leaf: AgentMeta, state: RunState, secrets_: Sequence[str]) -> None:
    """While a sandboxed leaf runs, record its refused spawns as they come."""
    import asyncio

    while True:
        await asyncio.sleep(DROP_BOX_POLL_S)
        state.refusals_recorded += record_dropped_refusals(leaf, secrets_, DROPPED_REFUSALS_MAX - state.refusals_recorded)


def agent_leftovers(agent_dir: Path, meta: AgentMeta) -> tuple[list[psutil.Process], list[int]]:
    """What is left of an agent: its spawn.py, its CLI, the CLI's descendants and group."""
    procs: list[psutil.Process] = []
    groups: list[int] = []
    if Supervised.of(meta).elsewhere():
        return procs, groups  # its pids, groups and environments name other processes here, or none
    if spawn_py := Supervised.of(meta).process():
        procs.append(spawn_py)
    with contextlib.suppress(FileNotFoundError, SpawnError, KeyError, TypeError, ValueError, psutil.Error):
        beat = read_json(agent_dir / HEARTBEAT)
        cli = Supervised(int(beat["cli_pid"]), float(beat["cli_create_time"])).process()
        if cli is not None:
            procs += [*reversed(cli.children(recursive=True)), cli]
            groups.append(int(beat["cli_pgid"]))
    seen = {p.pid for p in procs}
    procs += [p for p in processes_started_for(meta) if p.pid not in seen]
    return procs, groups


def processes_started_for(meta: AgentMeta) -> list[psutil.Process]:
    """Processes carrying the environment spawn.py gave this agent's CLI.

    Finds the CLI and what it started even when no heartbeat names it yet
    (spawn.py killed just as the CLI started) or their parent links are
    gone. Guards are left alone: each settles its own agent.
    """
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(ENV_AGENT_ID) == meta.id and env.get(ENV_SESSION) == meta.session and not is_guard(proc):
            found.append(proc)
    return found


def last_text_in_transcript(agent_dir: Path) -> str | None:
    """The agent's last assistant text, so an outcome committed for it keeps it."""
    try:
        lines = read_text(agent_dir / TRANSCRIPT).splitlines()  # a child's file, read by whoever settles it
    except (OSError, SpawnError):
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, AttributeError):
            record = parse_json(line)
            if record.get("type") == "AssistantMessage":
                texts = [b["text"] for b in record["message"].get("content", []) if isinstance(b, dict) and b.get("text")]
                if texts:
                    return "\n".join(texts)
    return None


def settle_agents(verdicts: Sequence[tuple[Path, Status, str]], by: str, secrets_: Sequence[str]) -> list[str]:
    """End what is left of several agents at once, and commit an outcome for each without one.

    Live spawn.py processes are asked first (SIGTERM), all together: each ends
    its own subtree and commits its own outcome, keeping everything it knows.
    After the grace, what remains of them is killed and the outcome given
    here (agent dir, status, reason) is committed for agents that still have
    none. Returns the ids that had no outcome when called.
    """
    pending = [(d, load_meta(d), status, reason) for d, status, reason in verdicts if read_outcome(d) is None]
    asked = []
    for _, meta, _, _ in pending:
        if proc := Supervised.of(meta).signal(signal.SIGTERM):
            asked.append(proc)
    # spawn.py answers SIGTERM by ending its own subtree (up to KILL_GRACE_S)
    # and settling it; give it that twice over before taking its place.
    wait_gone(asked, KILL_GRACE_S * 2)
    still_running = {meta.id for _, meta, _, _ in pending if Supervised.of(meta).alive()}

    def commit(which: Callable[[AgentMeta], bool]) -> None:
        for d, meta, status, reason in pending:
            if not which(meta):
                continue
            started = started_timestamp(meta)
            outcome = Outcome(
                id=meta.id,
                status=status,
                reason=reason,
                exit_code=EXIT_FOR_STATUS[status],
                ended_at=utc_now_iso(),
                duration_s=round(max(0.0, time.time() - started), 3),
                text=last_text_in_transcript(d),
                transcript=str(d / TRANSCRIPT),
                committed_by=by,
            )
            if has_drop_box(meta) and meta.id not in still_running:
                record_dropped_refusals(meta, secrets_, final=True)  # its runner is gone, and whatever it ran
            commit_outcome(d, with_estimated_cost(outcome, d, meta.model), secrets_)

    # A spawn.py about to be SIGKILLed gets its outcome first, so its guard
    # finds it rather than recording the kill as a crash. The others are
    # committed after their leftovers are gone, so an outcome is never seen
    # while what the agent left still runs.
    commit(lambda meta: meta.id in still_running)
    procs: list[psutil.Process] = []
    groups: list[int] = []
    for d, meta, _, _ in pending:
        more_procs, more_groups = agent_leftovers(d, meta)
        procs += more_procs
        groups += more_groups
    if procs or groups:
        Supervised.stop(procs, groups, grace=LEFTOVER_GRACE_S)
    commit(lambda meta: meta.id not in still_running)
    return [meta.id for _, meta, _, _ in pending]


def live_descendants(meta: AgentMeta) -> set[str]:
    """Ids of the agents below meta whose process is running and have no outcome."""
    live = set()
    for d in descendants_of(Path(meta.session), meta.id):
        if (d / OUTCOME).exists():  # one stat: most children of an ending agent have finished
            continue
        with contextlib.suppress(FileNotFoundError, SpawnError):
            child = load_meta(d)
            if Supervised.of(child).alive():
                live.add(child.id)
    return live


def settle_descendants(meta: AgentMeta, secrets_: Sequence[str], ended: set[str]) -> None:
    """Before an agent commits, every agent below it has an outcome too.

    Its subtree has been ended; what has no outcome yet was ended by it
    before recording one (those in `ended`, alive when it began), died
    unseen, or escaped the process tree. So a parent's marker means its
    whole subtree is settled, and no child's result is left hanging.
    """
    verdicts = []
    for d in descendants_of(Path(meta.session), meta.id):
        if (d / OUTCOME).exists():  # settled already: no need to look at its process
            continue
        with contextlib.suppress(FileNotFoundError):
            child = load_meta(d)
            if Supervised.of(child).alive() or child.id in ended:
                verdicts.append((d, Status.KILLED, f"ended with its ancestor {meta.id}"))
            elif parent_gone(Path(meta.session), child):
                # Its parent died or ended too: that end took it down, as reap_agent judges it.
                reason = f"process {child.pid} ended with its parent agent {child.parent_id} (found by {meta.id})"
                verdicts.append((d, Status.KILLED, reason))
            else:
                verdicts.append((d, Status.FAILED, f"process {child.pid} died without writing an outcome (found by {meta.id})"))
    settle_agents(verdicts, "parent", secrets_)


def parent_gone(session: Path, meta: AgentMeta) -> bool:
    """True if an agent's parent agent has ended or died (a live agent whose parent is gone escaped its tree)."""
    if meta.parent_id is None:
        return False
    parent_dir = session / AGENTS_DIR / meta.parent_id
    try:
        parent = load_meta(parent_dir)
    except (FileNotFoundError, SpawnError):
        return False
    return read_outcome(parent_dir) is not None or not Supervised.of(parent).alive()


def descendants_of(session: Path, agent_id: str) -> list[Path]:
    """Agent directories below agent_id, deepest first."""
    parents: dict[str, tuple[str | None, int, Path]] = {}
    own = id_depth(agent_id)
    for d in iter_agent_dirs(session):
        # Every agent calls this as it ends: in a fan-out of N leaves, reading
        # every record each time was N x N reads. An id carries its depth
        # (new_agent_id), and nothing at or above an agent's depth is below it.
        # A directory named otherwise is read, whatever it claims.
        if own is not None and (depth := id_depth(d.name)) is not None and depth <= own:
            continue
        with contextlib.suppress(FileNotFoundError, SpawnError):
            meta = load_meta(d)
            parents[meta.id] = (meta.parent_id, meta.depth, d)
    found = []
    for aid, (_, depth, d) in parents.items():
        cursor: str | None = aid
        while cursor is not None and cursor in parents:
            cursor = parents[cursor][0]
            if cursor == agent_id:
                found.append((depth, d))
                break
    return [d for _, d in sorted(found, key=lambda x: -x[0])]

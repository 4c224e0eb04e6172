"""Steering a running agent: its inbox (send), the budget pause and the top-ups a raise brings."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..core.constants import PAUSED, TRANSCRIPT
from ..core.errors import RefusedError, SpawnError, StateError, UsageError
from ..core.prelude import unix_address
from ..core.pure import estimate_cost, parse_json, round_usd, utc_now_iso
from ..core.records import AgentMeta, Status, record_to_json
from ..session.ledger import (
    append_budget_change,
    hold_need,
    hold_of,
    over_hold,
    same_dir,
    top_up_hold,
)
from ..session.protocol import (
    AGENTS_DIR,
    append_transcript,
    load_meta,
    read_limits,
    read_outcome,
    read_text,
    write_json_atomic,
)
from ..supervise.supervisor import Supervised, calling_agents
from .channel import bind_private_socket, peer_process, read_line
from .gateway import change_budget_at_gateway, gateway_url

# ----------------------------------------------------------------- steering --
# Steering a running tree: a message to an agent while it works (`send`), and
# a budget that pauses the tree instead of failing it (`--on-budget pause`,
# `budget`). Both go through the runner that owns the agent, over a socket
# where the kernel names the caller (as answers to asks do, see channel), so
# a record that anything with Bash can write never decides for an agent.

INBOX_SOCKET = "inbox.sock"  # in the agent's directory, 0600, while its runner takes messages
STOPPING = "is being stopped"  # why an inbox closed when its agent is stopped
# A message is a prompt someone typed or a script wrote: 256 KiB is far above
# that, and bounds what one caller makes the runner hold and record.
SEND_MAX_BYTES = 256 << 10
SEND_READ_S = 2.0  # as for answers: a caller that dawdles is hung up on
# The runner reads the caller's process ancestry (psutil, a few ms to tens of
# ms on a loaded machine) before it replies; a reply slower than this means
# the runner is wedged or frozen (a SIGSTOP), which `send` reports.
SEND_REPLY_S = 30.0
# A runner that has no inbox yet is starting (its socket is bound before the
# model is called); `send` waits this long for it before giving up.
INBOX_WAIT_S = 10.0
# A message that came too late (the runner had closed its inbox) is answered
# with the outcome, which the runner commits within about this long.
FINISHED_WAIT_S = 60.0

# Transcript lines (sessions/README.md, "Steering"):
SENT_LINE = "UserSent"  # {seq, text, from, by, pid, delivery}
SEND_REFUSED_LINE = "SendRefused"  # {from, by, pid, refused, chars}
# An a2a node's messages become the next messages of its remote task, marked as
# steering (A2A metadata spawn.steer) so a spawn.py A2A server never takes one as an answer.
REMOTE_DELIVERY = "next message of its remote task"
PAUSED_LINE = "BudgetPaused"  # {reason, spent_usd, hold_usd, needed_usd}
RESUMED_LINE = "BudgetResumed"  # {paused_s, hold_usd, topped_up_usd}

ENV_ON_BUDGET = "SPAWN_ON_BUDGET"  # fail|pause: what the tree does at its budget; children get no wider
ON_BUDGET_DEFAULT = "fail"
# pause keeps a half-done tree; fail ends it. A child may go pause -> fail,
# never fail -> pause: a parent that chose to fail at its budget must not get
# a subtree that sits paused, waiting for someone to pay.
ON_BUDGET_RANK = {"fail": 0, "pause": 1}
# A paused runner looks at the ledger this often for a raise (or a child's
# charge that freed its hold): a paused tree waits for a person, so half a
# second is quick, and an idle look costs one small file read.
PAUSE_POLL_S = 0.5
# A paused agent waits inside the CLI's PreToolUse hook, so the hook's timeout
# bounds a pause: past it the CLI gives up on the hook and makes its request.
# Measured with the bundled CLI: a 2,000,000 s timeout is honoured (a hook
# held 75 s got no request meanwhile); above 2**31 ms Node's timers overflow
# to 1 ms. A pause that nears it without a deadline ends the agent `failed`.
PAUSE_HOOK_TIMEOUT_S = 2_000_000.0
PAUSE_MARGIN_S = 60.0  # ended this long before the hook's timeout, so the CLI never meets it
# consume_sdk sees a turn's tool call (and decides on a pause) a moment after
# the CLI asks its PreToolUse hook about it: the hook waits this long for that.
TURN_CHECK_WAIT_S = 5.0


class FinishedError(SpawnError):
    """The agent has an outcome: it takes no more messages (exit 1)."""

    def __init__(self, agent_id: str, status: str, reason: str, resumable: bool = True) -> None:
        # Only an outcome with an SDK session can be resumed (an in-process agent's never has one).
        then = f"Continue its conversation with 'spawn.py --resume {agent_id} --task TEXT'" if resumable else "Start a new agent"
        super().__init__(f"agent {agent_id} has finished ({status}: {reason[:200]}); it takes no more messages. {then}")
        self.status = status


@dataclass
class PausedRecord:
    """paused.json: an agent stopped before a turn its hold can't pay for (schemas/paused.json)."""

    id: str
    since: str
    """When it paused (ISO 8601)."""
    reason: str
    spent_usd: float
    """Its own turns (priced) and what its children hold or were charged."""
    hold_usd: float
    """Its hold in the ledger."""
    needed_usd: float
    """How much more its hold needs for its next turn (that turn priced as its last)."""
    deadline: float | None = None
    """Unix seconds: it ends `timeout` then, paused or not."""


# ------------------------------------------------------------ who may steer --


def send_refusal(target: str, session: Path, callers: Sequence[tuple[str, str, int]], chain_of: Callable[[str], list[str]]) -> str | None:
    """Why a message to target must be refused, given the agents the sender runs under (pure but for chain_of).

    Neither the agent nor anything in its subtree may steer it: they run
    code its own model wrote. callers are (session, agent id, depth), nearest
    first (calling_agents): a process below the agent's runner has it among
    them; chain_of(id) gives an agent's ancestors by its meta.json, for one
    that escaped the process tree but not its record.
    """
    same = [agent for caller_session, agent, _depth in callers if same_dir(caller_session, session)]
    if not same:
        return None
    if same[0] == target:
        return f"agent {target} can't send a message to itself"
    for agent in same:
        if agent == target or target in chain_of(agent):
            return f"agent {same[0]} is in {target}'s subtree and can't steer it; its parent, the person or a client outside can"
    return None


def meta_chain(session: Path) -> Callable[[str], list[str]]:
    """chain_of for send_refusal: an agent's ancestors as meta.json's parent_id links them."""

    def chain(agent_id: str) -> list[str]:
        found: list[str] = []
        current: str | None = agent_id
        while current is not None and current not in found and len(found) < 256:
            try:
                current = load_meta(session / AGENTS_DIR / current).parent_id
            except (OSError, SpawnError):
                break
            if current is not None:
                found.append(current)
        return found

    return chain


def sender_name(pid: int, callers: Sequence[tuple[str, str, int]]) -> str:
    """Who sent a message, for the record: the agent it runs under, else its process."""
    if callers:
        return f"agent {callers[0][1]}"
    try:
        # Past the interpreter that runs spawn.py (and uv): the program that asked for it.
        proc = psutil.Process(pid)
        while proc.name().startswith(("uv", "python")) and (up := proc.parent()) is not None and up.pid > 1:
            proc = up
        return f"pid {proc.pid} ({proc.name()})"
    except psutil.Error:
        return f"pid {pid}"


def check_name(as_name: str | None, default: str) -> str:
    """`--as NAME` as recorded; names spawn.py uses itself are reserved."""
    import re

    if as_name is None:
        return default
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,63}", as_name) or as_name in ("timeout", "terminal", "rules"):
        raise UsageError(f"--as {as_name!r} is not a usable name; use letters, digits and _.:@- (not timeout, terminal or rules)")
    return as_name


def user_message(text: str) -> dict[str, Any]:
    """One prompt of the SDK's streaming input."""
    return {"type": "user", "session_id": "", "message": {"role": "user", "content": text}, "parent_tool_use_id": None}


# ---------------------------------------------------------------- the inbox --


class Inbox:
    """A running agent's socket for messages (`spawn.py send`), served on the runner's event loop.

    A message accepted while the run is open is recorded in the transcript
    (SENT_LINE) and handed to the CLI at once: the CLI puts it into its next
    model request, or, when its turn has ended, runs another turn for it.
    Closed (the run's last turn ended with nothing queued, or the agent is
    stopping), it answers `finished`; the sender then reports the outcome.
    """

    def __init__(self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> None:
        import asyncio

        self.meta, self.agent_dir, self.secrets = meta, agent_dir, secrets_
        self.queue: deque[str] = deque()
        self.wake = asyncio.Event()
        self.closed: str | None = None
        self.seq = 0
        self.turn_ended = False
        """The CLI's last turn has a result: a message now reopens the run."""
        self.before_reopen: Callable[[], Any] | None = None
        """Awaited before a message reopens a finished turn (the budget pause's gate)."""
        self.delivery = REMOTE_DELIVERY if meta.kind == "a2a" else None
        """What every accepted message becomes, where it isn't the CLI's next request (an a2a node's remote task)."""
        self.path = agent_dir / INBOX_SOCKET
        self.server: Any = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a runner that died left it: nothing listens there
        self.sock = bind_private_socket(self.path)
        self.sock.listen(16)
        self.sock.setblocking(False)

    async def start(self) -> None:
        import asyncio

        self.server = await asyncio.start_unix_server(self._serve, sock=self.sock, limit=SEND_MAX_BYTES + 2)

    def close(self, why: str, *, drop: bool = False) -> None:
        """Take no more messages; the prompt stream ends once the queue is empty (at once with drop: a stop)."""
        if drop:
            self.queue.clear()  # an agent being stopped is handed nothing more
            why = STOPPING
        if self.closed is None:
            self.closed = why
            with contextlib.suppress(OSError):
                self.path.unlink()
            if self.server is not None:
                self.server.close()
        self.wake.set()

    def result_seen(self) -> None:
        """The CLI's turn ended (a ResultMessage): with nothing queued, the run is over."""
        self.turn_ended = True
        if not self.queue:
            self.close("finished its turn")

    async def wait_for_message(self) -> bool:
        """Until a message is queued (True), or the inbox is closed with none left (False)."""
        while not self.queue and self.closed is None:
            self.wake.clear()
            await self.wake.wait()
        return bool(self.queue)

    async def prompts(self, first: str) -> AsyncIterator[dict[str, Any]]:
        """The SDK's streaming input: the task, then each accepted message."""
        yield user_message(first)
        while True:
            if not await self.wait_for_message():
                return
            if self.turn_ended and self.before_reopen is not None:
                await self.before_reopen()
                if not self.queue or self.closed == STOPPING:
                    return  # stopped while it waited
            self.turn_ended = False
            yield user_message(self.queue.popleft())

    async def _serve(self, reader: Any, writer: Any) -> None:
        import asyncio

        try:
            reply = await asyncio.wait_for(self._take(reader, writer), SEND_READ_S + SEND_REPLY_S)
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            reply = {"refused": "not a message: send one JSON line with text and by, whole, within 2 s"}
        with contextlib.suppress(OSError, ConnectionError):
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
            writer.close()

    async def _take(self, reader: Any, writer: Any) -> dict[str, Any]:
        import asyncio

        line = await asyncio.wait_for(reader.readline(), SEND_READ_S)
        given = parse_json(line.decode(errors="replace"))
        text, by = given.get("text") if isinstance(given, dict) else None, given.get("by") if isinstance(given, dict) else None
        if not isinstance(text, str) or not text.strip() or not isinstance(by, str | None):
            return {"refused": "not a message: send one JSON line with a non-empty text"}
        by = by[:64] if by is not None else None  # a name, as `--as` takes it; the socket takes anything
        sock = writer.get_extra_info("socket")
        peer = peer_process(sock) if sock is not None else None
        callers = await asyncio.to_thread(calling_agents, peer) if peer is not None else []
        session = Path(self.meta.session)
        refusal = "its sender can't be told apart" if peer is None else send_refusal(self.meta.id, session, callers, meta_chain(session))
        pid = peer.pid if peer is not None else 0
        sender = sender_name(pid, [c for c in callers if same_dir(c[0], session)] or callers)
        if refusal is not None:
            record = {"from": sender, "by": by, "pid": pid, "refused": refusal, "chars": len(text)}
            self._line(SEND_REFUSED_LINE, record)
            return {"refused": refusal}
        if self.closed is not None:
            return {"finished": self.closed}
        self.seq += 1
        delivery = self.delivery or ("reopens the run" if self.turn_ended else "next request")
        self._line(SENT_LINE, {"seq": self.seq, "text": text, "from": sender, "by": by, "pid": pid, "delivery": delivery})
        self.queue.append(text)
        self.wake.set()
        return {"queued": self.seq, "delivery": delivery}

    def _line(self, kind: str, message: Mapping[str, Any]) -> None:
        record = {"time": utc_now_iso(), "type": kind, "message": {k: v for k, v in message.items() if v is not None}}
        append_transcript(self.agent_dir / TRANSCRIPT, record, self.secrets)


def open_inbox(meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> Inbox | None:
    """The agent's inbox, bound; None where no socket can be made (the run goes on without one)."""
    try:
        return Inbox(meta, agent_dir, secrets_)
    except OSError:
        return None


# ------------------------------------------------------------ `spawn.py send` --


def send_message(agent_dir: Path, text: str, by: str | None) -> dict[str, Any]:
    """Hand text to the agent's runner; its reply ({"queued": N, "delivery"}).

    RefusedError: the runner refused the sender (recorded in the transcript).
    FinishedError: the agent has (or is about to have) an outcome.
    StateError: no runner takes messages for it.
    """
    import socket

    meta = load_meta(agent_dir)
    finished = _outcome_of(agent_dir, meta.id)
    if finished is not None:
        raise finished
    if meta.kind == "command":
        raise UsageError(
            f"agent {meta.id} is a command node: a command reads its one task on stdin and takes no messages; "
            "kill it and spawn another with the new task"
        )
    if (meta.placement or {}).get("backend") == "inprocess":
        # A Claude Code subagent has no stdin of its own: nothing can reach its turn but its own tool results.
        raise UsageError(
            f"agent {meta.id} runs in-process, a Claude Code subagent inside its host {host_of(meta)}'s CLI, and no message "
            f"can reach a subagent's turn: it was not sent. Send it to the host ('spawn.py send {host_of(meta)} TEXT': it reads "
            f"it at its next model request, once this child has answered), or 'spawn.py kill {meta.id}' to end the child at its "
            "next tool call; children started with --placement local take messages"
        )
    path = agent_dir / INBOX_SOCKET
    limit = time.monotonic() + INBOX_WAIT_S
    while True:
        address, dir_fd = unix_address(str(path))
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(SEND_REPLY_S)
                client.connect(address)
                client.sendall(json.dumps({"text": text, "by": by}).encode() + b"\n")
                said = parse_json(read_line(client, SEND_MAX_BYTES, SEND_REPLY_S))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            finished = _outcome_of(agent_dir, meta.id)
            if finished is not None:
                raise finished from None
            if time.monotonic() > limit:
                raise StateError(
                    f"agent {meta.id} takes no messages: its runner has no inbox ({path}); it may be a spawn.py older than 'send', "
                    "or have died (run 'spawn.py status')"
                ) from None
            time.sleep(0.1)
        except (OSError, ValueError) as exc:
            raise StateError(f"agent {meta.id}'s runner did not take the message ({exc}); run 'spawn.py status' to see how it is") from None
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
    if "refused" in said:
        raise RefusedError(f"refused: {said['refused']}; the attempt is recorded in {agent_dir / TRANSCRIPT}")
    if "finished" in said:
        limit = time.monotonic() + FINISHED_WAIT_S
        while (finished := _outcome_of(agent_dir, meta.id)) is None and time.monotonic() < limit:
            time.sleep(0.1)
        raise finished or StateError(f"agent {meta.id} {said['finished']} but has no outcome yet; run 'spawn.py wait {meta.id}'")
    return {"id": meta.id, "seq": said.get("queued"), "delivery": said.get("delivery")}


def host_of(meta: AgentMeta) -> str:
    """The agent whose CLI runs an in-process agent: its nearest ancestor that is no subagent."""
    current, seen = meta, {meta.id}
    while (current.placement or {}).get("backend") == "inprocess" and (above := current.parent_id) and above not in seen:
        seen.add(above)
        try:
            current = load_meta(Path(meta.session) / AGENTS_DIR / above)
        except (OSError, SpawnError):
            return above
    return current.id


def _outcome_of(agent_dir: Path, agent_id: str) -> FinishedError | None:
    with contextlib.suppress(SpawnError):
        outcome = read_outcome(agent_dir)
        if outcome is not None:
            return FinishedError(
                agent_id, str(outcome.get("status")), str(outcome.get("reason") or ""), bool(outcome.get("sdk_session_id"))
            )
    return None


# -------------------------------------------------------------- the budget --


def change_budget(
    session: Path, raise_usd: float | None, set_usd: float | None, by: str, secrets_: Sequence[str], *, at_most: float | None = None
) -> dict[str, Any]:
    """Change the tree's budget (its ledger line, under the session lock); what changed, and who is paused now.

    at_most: a caller's own cap (a server's --max-budget-usd), checked under the lock.
    """
    for flag, value in (("--raise", raise_usd), ("--set", set_usd), ("--at-most", at_most)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value}: give a non-negative number of USD")
    # A tree with a gateway: the gateway makes the change (its holds believe no other writer's line).
    answer = change_budget_at_gateway(session, raise_usd, set_usd, by, at_most)
    if answer is None:
        change = append_budget_change(session, raise_usd, set_usd, by, secrets_, at_most=at_most)
        answer = {"max_budget_usd": change.max_budget_usd, "previous_usd": change.previous_usd}
    elif "error" in answer:
        kind = {"usage": UsageError, "refused": RefusedError}.get(str(answer["error"]), StateError)
        raise kind(str(answer.get("message") or "the tree's gateway refused the change"))
    return {
        "session": str(session),
        "max_budget_usd": answer["max_budget_usd"],
        "previous_usd": answer["previous_usd"],
        "paused": paused_agents(session),
    }


def paused_agents(session: Path) -> list[dict[str, Any]]:
    """The paused.json of every agent of the session that is paused now (its runner alive)."""
    found = []
    agents = session / AGENTS_DIR
    for path in sorted(agents.glob(f"*/{PAUSED}")) if agents.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, SpawnError):
            record = parse_json(read_text(path))
            meta = load_meta(path.parent)
            if read_outcome(path.parent) is None and Supervised(meta.pid, meta.create_time).alive():
                found.append(record)
    return found


class BudgetPause:
    """An agent under `--on-budget pause`: it waits before a turn its hold can't pay for.

    consume_sdk sees each turn's tool calls (check_turn); the CLI asks its
    PreToolUse hook about each call before it runs it, and so before its next
    model request. The hook (pre_tool_use) waits while the agent is paused,
    so the CLI makes no request and its processes stay as they are. A poll
    grows the hold from a `budget` raise, or sees that a child's charge freed
    it, and lets the hook answer. The CLI runs with no max_budget_usd of its
    own under pause: its cap is fixed at its start, and a raise could never
    lift it; the hold is kept by this check before each turn instead.
    """

    def __init__(self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> None:
        import asyncio

        self.meta, self.agent_dir, self.secrets = meta, agent_dir, secrets_
        self.session = Path(meta.session)
        self.checked: set[str] = set()
        self.seen = asyncio.Event()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.paused: PausedRecord | None = None
        self.paused_at = 0.0
        self.stopping = False
        """The run is being stopped: the hook is never answered again (the CLI would take a turn), only abandoned."""
        self.spend: tuple[float, float] = (0.0, 0.0)
        self.poller: Any = None
        self.on_fail: Callable[[str], None] | None = None
        """The run's stop path (failed): a pause that nears the hook's timeout ends the agent."""
        self.stopped: Callable[[], bool] = lambda: False
        """Whether the run is being stopped (its stop_reason is set): then nothing resumes."""
        self.companions: Callable[[], Sequence[tuple[str, Path]]] = lambda: ()
        """The agents running inside this one's CLI (in-process children, by id and directory): a pause holds them too."""
        self.marked: list[Path] = []

    @property
    def is_paused(self) -> bool:
        return self.paused is not None

    def check_turn(self, tool_use_ids: Iterable[str], turns: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """After a turn that calls tools: pause if its hold can't pay for the next one."""
        self.check(list(turns))
        self.checked.update(tool_use_ids)
        self.seen.set()

    def check(self, turns: list[tuple[str, dict[str, Any]]]) -> None:
        """Pause unless its hold pays for a turn like its last, or can grow from a raise to pay for it."""
        if self.is_paused:
            return
        own, last = estimate_cost(turns), estimate_cost(turns[-1:])
        need = hold_need(self.session, self.meta.id, own, last)
        if need is not None and top_up_hold(self.session, self.meta.id, need[2], self.secrets) is not None:
            # A raise made before it ran short is drawn at once, a turn at a time, without a pause.
            need = hold_need(self.session, self.meta.id, own, last)
        if need is not None:
            why = over_hold(self.session, self.meta.id, own, last) or "budget: its hold can't pay for its next turn"
            self.pause(why.replace("stopped before another turn", "paused before another turn"), need, (own, last))

    def pause(self, reason: str, need: tuple[float, float, float], spend: tuple[float, float]) -> None:
        import asyncio

        spent, hold, needed = need
        self.spend = spend
        self.paused = PausedRecord(
            self.meta.id, utc_now_iso(), reason, round_usd(spent) or 0.0, round_usd(hold) or 0.0, needed, self.meta.deadline
        )
        self.paused_at = time.monotonic()
        self.resumed.clear()
        with contextlib.suppress(OSError):
            write_json_atomic(self.agent_dir / PAUSED, record_to_json(self.paused))
        # Its in-process children make no tool call, and so no request, while the CLI's hooks wait: paused too.
        for child_id, child_dir in self.companions():
            held = dataclasses.replace(self.paused, id=child_id, reason=f"its host {self.meta.id}'s CLI is paused: {self.paused.reason}")
            with contextlib.suppress(OSError):
                write_json_atomic(child_dir / PAUSED, record_to_json(held))
                self.marked.append(child_dir)
        message = {k: v for k, v in record_to_json(self.paused).items() if k in ("reason", "spent_usd", "hold_usd", "needed_usd")}
        self._line(PAUSED_LINE, message)
        self.poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        import asyncio

        topped = 0.0
        while self.paused is not None:
            await asyncio.sleep(PAUSE_POLL_S)
            if time.monotonic() - self.paused_at > PAUSE_HOOK_TIMEOUT_S - PAUSE_MARGIN_S and self.on_fail is not None:
                self.on_fail(f"budget: paused for {PAUSE_HOOK_TIMEOUT_S - PAUSE_MARGIN_S:.0f} s and nobody raised it; {self.paused.reason}")
                return
            own, last = self.spend
            need = await asyncio.to_thread(hold_need, self.session, self.meta.id, own, last)
            if need is not None:
                grown = await asyncio.to_thread(top_up_hold, self.session, self.meta.id, need[2], self.secrets)
                if grown is None:
                    continue
                topped += need[2]
                if await asyncio.to_thread(hold_need, self.session, self.meta.id, own, last) is not None:
                    continue
            self.resume(topped)

    def resume(self, topped: float) -> None:
        if self.stopping or self.stopped():
            return
        paused_s = round(time.monotonic() - self.paused_at, 3)
        self.paused = None
        self.unmark()
        hold = hold_of(self.session, self.meta.id)
        self._line(RESUMED_LINE, {"paused_s": paused_s, "hold_usd": round_usd(hold), "topped_up_usd": round_usd(topped)})
        self.resumed.set()

    def freeze(self) -> None:
        """The run is being stopped (deadline, kill, signal): every hook waiting here answers "stop".

        Left unanswered, the hook fails once the CLI's stdin closes, and the
        CLI (which handles its SIGTERM on its event loop) runs the tool and
        makes the very request the pause held back (seen under load). A hook
        output with continue false ends the CLI's turn instead.
        """
        self.stopping = True
        if self.poller is not None:
            self.poller.cancel()
        self.resumed.set()

    def close(self) -> None:
        """The run ends: a pause ends with it (its record goes; the outcome says what happened)."""
        if self.poller is not None:
            self.poller.cancel()
        if self.paused is not None:
            self.paused = None
            self.unmark()
        self.stopping = True  # a hook asked from here on answers "stop" too
        self.resumed.set()

    def unmark(self) -> None:
        """The pause's records go: its own and its in-process children's."""
        for folder in [self.agent_dir, *self.marked]:
            with contextlib.suppress(OSError):
                (folder / PAUSED).unlink()
        self.marked = []

    async def pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        """The CLI's PreToolUse hook: answer once the agent may take its next turn."""
        import asyncio

        limit = time.monotonic() + TURN_CHECK_WAIT_S
        while tool_use_id is not None and tool_use_id not in self.checked and time.monotonic() < limit:
            self.seen.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.seen.wait(), max(0.0, limit - time.monotonic()))
        await self.resumed.wait()
        if self.stopping or self.stopped():
            return {"continue_": False, "stopReason": "spawn.py: the agent is being stopped (its deadline, a kill or a signal)"}
        return {}

    async def before_turn(self, turns: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Before a message reopens a finished run: the same check, and wait while paused."""
        self.check(list(turns))
        await self.resumed.wait()

    def _line(self, kind: str, message: Mapping[str, Any]) -> None:
        record = {"time": utc_now_iso(), "type": kind, "message": dict(message)}
        append_transcript(self.agent_dir / TRANSCRIPT, record, self.secrets)


def narrow_on_budget(requested: str | None, inherited: Sequence[str | None]) -> tuple[str, str | None]:
    """(the agent's --on-budget, a warning) from its flag and what it inherits (pure): never wider than a parent's."""
    known = [v for v in inherited if v in ON_BUDGET_RANK]
    ceiling = min(known, key=ON_BUDGET_RANK.__getitem__) if known else None
    if requested is None:
        return ceiling or ON_BUDGET_DEFAULT, None
    if ceiling is not None and ON_BUDGET_RANK[requested] > ON_BUDGET_RANK[ceiling]:
        return ceiling, f"--on-budget {requested} is wider than the parent's {ceiling}; using {ceiling}"
    return requested, None


def ancestry_on_budget(ancestry: Mapping[str, Any]) -> str | None:
    """The --on-budget of the agent this spawn runs under (its runner's meta.json): absent there is fail."""
    runner = ancestry.get("runner")
    return (runner.get("on_budget") or ON_BUDGET_DEFAULT) if isinstance(runner, Mapping) else None


def paused_reason(session: Path, paused: Mapping[str, Any]) -> str:
    return (
        f"budget: the tree is paused at its budget (agent {paused.get('id')} needs ${paused.get('needed_usd')} more); "
        f"raise it with 'spawn.py budget {session} --raise USD'"
    )


def wait_while_paused(session: Path, deadline: float | None, *, no_wait: bool) -> str | None:
    """Before admission: wait while an agent of the tree is paused at its budget; the refusal, or None.

    A paused tree is waiting for someone to pay: a new agent would draw on
    what is left, or pause at once. With --no-wait it is refused now.
    """
    paused = paused_agents(session)
    if not paused:
        return None
    why = paused_reason(session, paused[0])
    if no_wait:
        return f"{why}; --no-wait"
    print(f"spawn: waiting for admission: {why}", file=sys.stderr, flush=True)
    while paused_agents(session):
        if deadline is not None and time.time() >= deadline:
            return f"{why}; the deadline passed while waiting"
        time.sleep(PAUSE_POLL_S)
    return None


# ------------------------------------------------------------- in the runner --


async def open_steering(meta: AgentMeta, agent_dir: Path, state: Any, secrets_: Sequence[str]) -> None:
    """Before a claude agent's or an a2a node's run: its inbox, and a claude agent's pause under --on-budget pause (state: the RunState).

    The run's stop path (state.request_stop, and its stop hooks, which run
    while the CLI is frozen) closes the inbox and answers a paused hook "stop".
    """
    if meta.kind not in ("claude", "a2a"):
        return  # a command reads its one task on stdin and takes no messages
    # An a2a node's messages go on to its remote task (A2AConversation.forward); its remote pauses on its own.
    # With the tree's gateway the pause is the gateway's: it holds the request itself, at every depth and
    # for in-process agents too, so no tool call waits on this turn check (nor pauses twice).
    if meta.on_budget == "pause" and meta.kind == "claude" and gateway_url(Path(meta.session)) is None:
        state.pause = BudgetPause(meta, agent_dir, secrets_)
        state.pause.stopped = lambda: state.stop_reason is not None
        if state.in_process is not None:
            state.pause.companions = state.in_process.running_children
        if state.request_stop is not None:
            state.pause.on_fail = lambda why: state.request_stop(Status.FAILED, why)

    async def on_stop() -> None:
        stop_steering(state)

    state.stop_hooks.append(on_stop)
    inbox = open_inbox(meta, agent_dir, secrets_)
    if inbox is None:
        return
    await inbox.start()
    pause = state.pause
    if pause is not None:
        inbox.before_reopen = lambda: pause.before_turn(state.turns.values())
    state.inbox = inbox


def stop_steering(state: Any) -> None:
    """The run is being stopped: no message is handed on, and a paused hook answers "stop"."""
    if state.inbox is not None:
        state.inbox.close(STOPPING, drop=True)
    if state.pause is not None:
        state.pause.freeze()


def close_steering(state: Any) -> None:
    """The run is over: its inbox takes no more, and a pause ends with it."""
    if state.inbox is not None:
        state.inbox.close("has ended")
    if state.pause is not None:
        state.pause.close()


def pause_hooks(sdk: Any, pause: BudgetPause | None) -> list[Any]:
    """The PreToolUse matcher a paused agent waits in, with a timeout no pause reaches (PAUSE_HOOK_TIMEOUT_S)."""
    if pause is None:
        return []
    return [sdk.HookMatcher(matcher=None, hooks=[pause.pre_tool_use], timeout=PAUSE_HOOK_TIMEOUT_S)]


# ------------------------------------------------------------ what status shows --


def paused_note(row: Mapping[str, Any]) -> str:
    """`status`'s words for a paused agent: what it spent and what its next turn needs."""
    paused = row.get("paused")
    if not isinstance(paused, Mapping):
        return ""
    return f"  [paused: spent ${paused.get('spent_usd')}, needs ${paused.get('needed_usd')} more; spawn.py budget SESSION --raise USD]"


class SentMessages:
    """`status --watch`'s view of the messages sent to the tree's agents: what is new since its last look."""

    RECENT = 5  # messages a terminal frame shows, newest last

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.recent: list[str] = []

    def read(self, rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """One line for each message (or refused one) recorded since the last call."""
        new: list[str] = []
        for row in rows:
            path = Path(str(row.get("agent_dir", ""))) / TRANSCRIPT
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                start = self.offsets.get(str(path), 0)
                if size <= start:
                    continue
                with path.open("rb") as fh:
                    fh.seek(start)
                    chunk = fh.read(size - start)
                whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
                self.offsets[str(path)] = start + len(whole)
                for line in whole.splitlines():
                    if b'"UserSent"' in line or b'"SendRefused"' in line:
                        new += self._describe(str(row.get("id")), line)
        self.recent = [*self.recent, *new][-self.RECENT :]
        return new

    @staticmethod
    def _describe(agent_id: str, line: bytes) -> list[str]:
        with contextlib.suppress(ValueError, AttributeError):
            record = parse_json(line.decode(errors="replace"))
            message = record.get("message") or {}
            if record.get("type") == SENT_LINE:
                text = " ".join(str(message.get("text", "")).split())[:120]
                return [f"message {message.get('seq')} to {agent_id} from {message.get('from')}: {text}"]
            if record.get("type") == SEND_REFUSED_LINE:
                return [f"message to {agent_id} from {message.get('from')} refused: {message.get('refused')}"]
        return []


def cli_budget_cap(meta: AgentMeta) -> float | None:
    """The CLI's own max_budget_usd: the agent's hold, but none under --on-budget pause in a tree with a budget.

    A running CLI's cap can't be raised, so after a raise it would still stop
    at the old one; the runner's check before each turn (BudgetPause) holds the
    agent to its hold instead. A tree without a budget has no holds to pause
    on: there an agent's own --max-budget-usd stays the CLI's cap, as under fail.
    """
    if meta.on_budget == "pause" and read_limits(Path(meta.session)).max_budget_usd is not None:
        return None
    return meta.max_budget_usd

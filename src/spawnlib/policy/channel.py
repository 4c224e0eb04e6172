"""Asks: a tree's questions to its root, their answers over a Unix socket, and confirm_spawn."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ..core.constants import ASK_POLL_S
from ..core.errors import RefusedError, StateError
from ..core.output import note
from ..core.prelude import unix_address
from ..core.pure import estimate_agent, parse_json, redacted_json, self_answer_refusal, token_hex, utc_now_iso
from ..core.records import AgentMeta, AskAnswer, AskAttempt, AskRecord, record_to_json
from ..core.settings import ask_timeout
from ..session.ledger import read_ledger
from ..session.protocol import agent_history, append_jsonl, asks_dir, publish_once, read_limits, write_json_atomic
from ..supervise.supervisor import calling_agents
from .agents import summarize_input

if TYPE_CHECKING:
    import socket


# ------------------------------------------------------- who is calling --
# A record anyone can write is believed by no one. What decides for an agent
# (an answer to its ask) reaches the process that accepts it over a Unix
# socket, where the kernel names the peer (SO_PEERCRED), and that process
# checks the peer's ancestry itself: the answer file is its record of the
# decision, written by it, never the way a decision arrives.

ASK_SOCKET = "{ask_id}.sock"  # in asks/, mode 0600, while the asking runner waits
# An answer is one short JSON line; a peer that sends more, or sends it
# slower than this, is hung up on and the runner goes on waiting.
ANSWER_MAX_BYTES = 64 << 10
ANSWER_READ_S = 2.0


def peer_process(conn: socket.socket) -> psutil.Process | None:
    """The process at the other end of a Unix socket, as the kernel reports it; None for another user's."""
    import socket
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        return None
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid)
    return None


def read_line(conn: socket.socket, limit: int, timeout: float) -> bytes:
    """One newline-ended line from conn, within limit bytes and timeout seconds; ValueError otherwise."""
    conn.settimeout(timeout)
    ends = time.monotonic() + timeout
    got = b""
    while b"\n" not in got:
        if len(got) > limit or time.monotonic() > ends:
            raise ValueError("too long, or too slow")
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("closed before a whole line")
        got += chunk
    return got.partition(b"\n")[0]


def ask_socket_path(session: Path, ask_id: str) -> Path:
    return asks_dir(session) / ASK_SOCKET.format(ask_id=ask_id)


def bind_private_socket(path: Path) -> Any:
    """A Unix stream socket bound at path, mode 0600: only this user may connect (an ask's, an inbox's)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, dir_fd = unix_address(str(path))
    mask = os.umask(0o177)
    try:
        sock.bind(address)
    finally:
        os.umask(mask)
        if dir_fd is not None:
            os.close(dir_fd)
    return sock


class AnswerChannel:
    """The socket an asking runner takes its ask's answer on: bound before the ask is published."""

    def __init__(self, session: Path, ask_id: str) -> None:
        self.session, self.ask_id = session, ask_id
        import threading

        self.path = ask_socket_path(session, ask_id)
        self.closed = False
        # One answer, whoever comes first: an answerer on the socket, the
        # timeout, or close() from a stopping agent, which must leave the ask
        # answered before its process exits (the waiting thread may never run again).
        self.lock = threading.Lock()
        self.answer: dict[str, Any] | None = None
        self.server = bind_private_socket(self.path)
        self.server.listen(8)
        self.server.settimeout(ASK_POLL_S)  # how soon close() is seen

    def close(self) -> None:
        """End a wait early (the agent is stopping): the ask is denied, by timeout, now."""
        self.closed = True
        self.deny_by_timeout()

    def deny_by_timeout(self) -> dict[str, Any]:
        """The answer, recording the timeout's denial unless an answer came first."""
        with self.lock:
            if self.answer is None:
                self.answer = record_answer(self.session, AskAnswer(self.ask_id, "deny", "timeout", ""))
            return self.answer

    def wait(self, ask_agent: str, timeout: float, secrets_: Sequence[str]) -> dict[str, Any]:
        """Wait for an answer from outside the asking agent's tree; the answer record, as written here.

        Blocking: an async caller runs it in a thread. The first answer whose
        caller may give it (self_answer_refusal, on the peer's own ancestry)
        wins; a refused one is recorded in asks/ID.attempts.jsonl and the wait
        goes on. At the timeout the ask is denied, by "timeout". Whatever an
        answer file said before (anything with Bash can write one) is replaced.
        """
        limit = time.monotonic() + timeout
        try:
            while time.monotonic() < limit and not self.closed:
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    continue
                with conn, self.lock:
                    if self.answer is not None:  # close() denied it meanwhile
                        break
                    self.answer = take_answer(conn, self.session, self.ask_id, ask_agent, secrets_)
                if self.answer is not None:
                    return self.answer
        finally:
            self.server.close()
            with contextlib.suppress(OSError):
                self.path.unlink()
        return self.deny_by_timeout()


def record_answer(session: Path, answer: AskAnswer) -> dict[str, Any]:
    """Write the answer record (replacing whatever file was there); the record."""
    answer.at = utc_now_iso()
    record = record_to_json(answer)
    write_json_atomic(asks_dir(session) / f"{answer.id}.answer.json", record)
    return record


def open_ask(
    meta: AgentMeta,
    tool: str,
    tool_input: Mapping[str, Any],
    rule: str,
    *,
    timeout: float,
    secrets_: Sequence[str],
    asker: str | None = None,
) -> AnswerChannel:
    """Publish an ask for the tree to answer, its answer channel already listening; asker: the asking agent's id (meta's)."""
    session = Path(meta.session)
    folder = asks_dir(session)
    folder.mkdir(exist_ok=True)
    ask_id = f"q-{token_hex(3)}"
    channel = AnswerChannel(session, ask_id)  # before the ask is seen: an answer never finds no one
    record = AskRecord(
        ask_id, asker if asker is not None else meta.id, tool, summarize_input(tool_input), rule, utc_now_iso(), time.time() + timeout
    )
    publish_once(folder / f"{ask_id}.json", redacted_json(record_to_json(record), secrets_, indent=2).encode())
    return channel


def take_answer(conn: socket.socket, session: Path, ask_id: str, ask_agent: str, secrets_: Sequence[str]) -> dict[str, Any] | None:
    """One caller's answer as recorded, if it may give it; it is told either way, once the record is written
    (whoever watches the asks, such as the A2A server, must not see the ask pending after its answer returned)."""

    def reply(data: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(data).encode() + b"\n")

    try:
        given = parse_json(read_line(conn, ANSWER_MAX_BYTES, ANSWER_READ_S))
        verdict, by, text = given["verdict"], given["by"], given.get("text")
        if verdict not in ("approve", "deny") or not isinstance(by, str) or not isinstance(text, str | None):
            raise ValueError("not an answer")
    except (OSError, ValueError, KeyError, TypeError):
        reply({"refused": "not an answer: send one JSON line with verdict (approve|deny), by and text"})
        return None
    peer = peer_process(conn)
    refusal = "its caller can't be told apart" if peer is None else self_answer_refusal(ask_agent, session, calling_agents(peer))
    if refusal is not None:
        attempt = AskAttempt(ask_id, verdict, by, utc_now_iso(), peer.pid if peer else 0, refusal)
        append_jsonl(asks_dir(session) / f"{ask_id}.attempts.jsonl", record_to_json(attempt), secrets_)
        reply({"refused": refusal})
        return None
    record = record_answer(session, AskAnswer(ask_id, verdict, by, "", text))
    reply({"answered": verdict})
    return record


def send_answer(session: Path, ask_id: str, verdict: str, by: str, text: str | None) -> None:
    """Give the waiting runner an answer to ask_id; RefusedError if it refuses this caller, StateError if none waits."""
    import socket

    path = ask_socket_path(session, ask_id)
    address, dir_fd = unix_address(str(path))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10.0)
            try:
                client.connect(address)
            except (FileNotFoundError, ConnectionRefusedError):
                raise StateError(
                    f"no agent is waiting for an answer to ask {ask_id}; it was answered, timed out, or its agent ended"
                ) from None
            client.sendall(json.dumps({"verdict": verdict, "by": by, "text": text}).encode() + b"\n")
            said = parse_json(read_line(client, ANSWER_MAX_BYTES, 10.0))
    except (OSError, ValueError) as exc:
        raise StateError(f"ask {ask_id}'s agent did not take the answer ({exc}); run 'spawn.py status' to see if it still asks") from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    if "refused" in said:
        raise RefusedError(f"refused: {said['refused']}; the attempt is recorded in {asks_dir(session) / f'{ask_id}.attempts.jsonl'}")


def prompt_person(meta: AgentMeta, tool: str, tool_input: Mapping[str, Any], rule: str, timeout: float) -> tuple[str, str]:
    """Ask the person at the root's terminal; no answer before timeout is a no."""
    import select

    sys.stderr.write(f"spawn: agent {meta.id} wants to use {tool}: {summarize_input(tool_input, 200)}\n  (rule {rule}) allow? [y/N] ")
    sys.stderr.flush()
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    answer = sys.stdin.readline().strip().lower() if ready else ""
    return ("allow" if answer in ("y", "yes") else "deny"), "terminal"


def confirm_spawn(meta: AgentMeta, session: Path, secrets_: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Ask the root before a spawn that would take the tree past --confirm-over; None lets it go on.

    Called before admission, without the session lock: the answer may take
    minutes, and other spawns and outcome commits must not wait for it. Two
    spawns racing under the threshold may both pass; the threshold is a
    prompt for a person, --max-budget-usd is the hard cap.
    """
    threshold = read_limits(session).confirm_over_usd
    if threshold is None:
        return None
    ended, running = agent_history(session)
    estimate, _, basis = estimate_agent(meta.model, ended)
    # A running agent's spend so far is in neither the ledger nor its estimate; the estimate stands for all of it.
    projected = read_ledger(session).spent + sum(estimate_agent(m, ended)[0] for m in running) + estimate
    if projected <= threshold:
        return None
    summary = (
        f"start a {meta.model} agent, estimated ${estimate:.4f} ({basis}): the tree's projected spend "
        f"${projected:.4f} passes --confirm-over ${threshold:g}; task: {summarize_input({'command': meta.task}, 120)}"
    )
    rule = f"--confirm-over {threshold:g}"
    timeout = ask_timeout(environ)
    if meta.deadline is not None:
        timeout = min(timeout, max(0.0, meta.deadline - time.time()))
    if sys.stdin is not None and sys.stdin.isatty():
        verdict, _ = prompt_person(meta, "Spawn", {"command": summary}, rule, timeout)
        return None if verdict == "allow" else f"confirm: the person at the terminal did not approve ({summary})"
    # The spawner asks: its parent's id (the root has none, but the root never passes through here).
    asker = meta.parent_id or ""
    channel = open_ask(meta, "Spawn", {"command": summary}, rule, timeout=timeout, secrets_=secrets_, asker=asker)
    ask_id = channel.ask_id
    note(f"spawn asks to {summary}: run 'spawn.py approve {ask_id}' or 'spawn.py deny {ask_id}' within {timeout:.0f} s")
    answer = channel.wait(asker, timeout, secrets_)
    if answer.get("verdict") == "approve":
        return None
    how = "timed out unanswered" if answer.get("by") == "timeout" else f"was denied by {answer.get('by')}"
    return f"confirm: ask {ask_id} {how} (projected ${projected:.4f} > --confirm-over ${threshold:g})"

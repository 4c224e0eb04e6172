"""The tree's ledger (ledger.jsonl): its one reader, its locked appends, and every decision made from it.

Holds (`reserve`), charges (`charge`), the tree budget's changes (`budget`)
and the top-ups a paused agent draws from a raise all go through here: the
runner's charge at commit, admission's hold, `budget --raise`, a paused
agent's poll and the gateway's per-request charges. One number rule
(ledger_usd) decides which amounts count, for every reader.

Two locks, both needed:
- the session lock (flock of the session's lock file, session_lock): a
  read-then-append decision (admit and reserve, a top-up, a budget change)
  is made on the ledger as it is, not as it was a moment ago;
- the ledger's own POSIX lock (fcntl, see append_ledger): whole lines
  across NFS clients, which share no flock.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..core.constants import LEDGER, LIMITS
from ..core.errors import CorruptRecordError, RefusedError, SpawnError, UsageError
from ..core.output import note
from ..core.pure import parse_json, round_usd, token_counts, utc_now_iso
from ..core.records import AgentMeta, LedgerEntry, ModelCall, Outcome, Status, record_to_json
from .protocol import (
    AGENTS_DIR,
    append_jsonl,
    load_meta,
    open_regular,
    read_limits,
    read_text,
    session_lock,
    transcript_spend,
    write_json_atomic,
)

# ---------------------------------------------------------------- reading --

MAC = "mac"  # the field of the tree's gateway's own lines: its HMAC, whose key only the gateway's memory holds
LEDGER_SLACK_USD = 1e-5  # amounts are rounded to the micro-dollar: sums of many may drift by a few


def ledger_usd(value: Any) -> float | None:
    """An amount of USD as the ledger may carry it: a finite, non-negative number (not a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


@dataclass
class LedgerState:
    """The tree budget as ledger.jsonl tells it (see sessions/README.md, "Budget")."""

    charges: dict[str, float | None] = field(default_factory=dict)
    """id -> what it spent (None: unknown)."""
    estimated: set[str] = field(default_factory=set)
    holds: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    """id -> (drawn_from, amount) for every reserve line, charged or not."""
    spends: dict[str, float] = field(default_factory=dict)
    """id -> what the gateway metered of its model calls (spend lines): for such an agent, its spend, whatever its charge says."""
    refusals: dict[str, str] = field(default_factory=dict)
    """id -> why the gateway last refused one of its model calls."""
    hosted: dict[str, str] = field(default_factory=dict)
    """In-process agent id -> the process agent whose CLI runs it (spend lines with `host`): its spend is inside that hold."""
    budget: float | None = None
    """The last budget line's max_budget_usd (None: none; limits.json's budget stands)."""

    def spend_of(self, holder: str) -> float:
        """What the gateway metered of a process agent's CLI: its own calls and its in-process agents'."""
        return self.spends.get(holder, 0.0) + self.hosted_cost(holder)

    def hosted_cost(self, holder: str) -> float:
        """What the gateway metered of the in-process agents a process agent's CLI runs (each has spend lines)."""
        return sum(self.spends[c] for c, h in self.hosted.items() if h == holder)

    def cost(self, agent_id: str) -> float | None:
        """What an agent spent: the gateway's figure where it metered the agent, else its charge."""
        return self.spends[agent_id] if agent_id in self.spends else self.charges.get(agent_id)

    def live(self, agent_id: str | None) -> bool:
        return agent_id is not None and agent_id in self.holds and agent_id not in self.charges

    def draws(self, source: str | None) -> list[str]:
        return [i for i, (src, _) in self.holds.items() if src == source]

    def used_by(self, agent_id: str) -> float:
        """What a hold takes from where it was drawn: all of it while live,
        then what it and the holds drawn from it were charged."""
        if self.live(agent_id):
            return self.holds[agent_id][1]
        return (self.cost(agent_id) or 0.0) + self.hosted_cost(agent_id) + sum(self.used_by(c) for c in self.draws(agent_id))

    def free(self, source: str | None, budget: float, own_spend: float = 0.0) -> float:
        """Unreserved USD of a live hold (less its owner's own spend so far), or of the tree (source None)."""
        if source is None:
            # An in-process agent's spend is its host's, counted with the host's hold.
            inside = {i for i, h in self.hosted.items() if h in self.holds}
            unheld = sum(self.cost(i) or 0.0 for i in {*self.charges, *self.spends} - inside if i not in self.holds)
            return budget - unheld - sum(self.used_by(t) for t in self.draws(None))
        return self.holds[source][1] - own_spend - sum(self.used_by(c) for c in self.draws(source))

    @property
    def spent(self) -> float:
        return sum(c for i in {*self.charges, *self.spends} if (c := self.cost(i)) is not None)

    @property
    def unknown(self) -> int:
        return sum(self.cost(i) is None for i in self.charges)

    @property
    def reserved(self) -> float:
        """Held by live agents and not yet spent or charged by anyone: what the gateway metered of a live
        agent's calls is in `spent` already."""
        # An agent that overran its hold (by its last turn) holds nothing more.
        return sum(
            max(0.0, self.holds[i][1] - self.spend_of(i) - sum(self.used_by(c) for c in self.draws(i))) for i in self.holds if self.live(i)
        )


@dataclass
class BudgetState:
    """The tree budget's changes as the ledger's `budget` lines tell them."""

    budget: float | None = None
    """The last budget line's max_budget_usd; None: limits.json's stands."""
    raised: float = 0.0
    """What the budget lines added in all: the pool that paused agents' holds grow from."""
    topped_up: float = 0.0
    """What holds grew by from that pool (reserve lines with topped_up_usd)."""


@dataclass
class BudgetChange:
    """A `budget` line of ledger.jsonl: the tree's budget from now on.

    It has no `id`, so a spawn.py that predates it skips the line (readers
    take a line with an id and no kind for a charge).
    """

    time: str
    max_budget_usd: float
    previous_usd: float
    by: str
    kind: str = "budget"


Accept = Callable[[Mapping[str, Any]], bool]
"""Which lines a reader believes (the gateway's: only its own signed lines of the kinds that decide money)."""


class Authority(Protocol):
    """The tree's gateway, as the ledger's writers see it: it believes only lines it signed of the kinds that
    decide money (see gateway.Gateway.trusted), signs the lines it writes, and knows the budget the tree began with."""

    initial_budget: float | None

    def trusted(self, entry: Mapping[str, Any]) -> bool: ...

    def sign(self, line: Mapping[str, Any]) -> dict[str, Any]: ...


def ledger_entries(lines: Iterable[str], accept: Accept | None = None) -> Iterable[dict[str, Any]]:
    """The ledger's lines that parse as JSON objects (and that accept believes); the rest are skipped (each write is one whole line)."""
    for line in lines:
        try:
            entry = parse_json(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and (accept is None or accept(entry)):
            yield entry


def ledger_state(lines: Iterable[str], accept: Accept | None = None) -> LedgerState:
    """Fold ledger.jsonl's holds and charges (pure)."""
    return fold_ledger(LedgerState(), lines, accept)


def fold_ledger(state: LedgerState, lines: Iterable[str], accept: Accept | None = None) -> LedgerState:
    """Fold more of ledger.jsonl's lines into state, in order (pure but for state)."""
    for entry in ledger_entries(lines, accept):
        if not isinstance(entry.get("id"), str):
            if (change := budget_line(entry)) is not None:
                state.budget = change[0]
            continue  # not an agent's line
        if entry.get("kind") == "reserve":
            amount = ledger_usd(entry.get("amount_usd"))
            # A gateway's read: a hold grows only by the gateway's own (signed) lines, so an agent
            # that appends a bigger hold for itself grows nothing; admission writes each hold once.
            grown = accept is not None and MAC not in entry and entry["id"] in state.holds
            if amount is not None and not grown:
                source = entry.get("drawn_from")
                state.holds[entry["id"]] = (source if isinstance(source, str) else None, amount)
        elif entry.get("kind") == "spend":
            spend = ledger_usd(entry.get("cost_usd"))
            state.spends[entry["id"]] = state.spends.get(entry["id"], 0.0) + (spend or 0.0)
            if isinstance(host := entry.get("host"), str) and host != entry["id"]:
                state.hosted[entry["id"]] = host
        elif entry.get("kind") == "refused":
            state.refusals[entry["id"]] = str(entry.get("reason") or "")
        elif entry["id"] not in state.charges:  # first charge wins; a commit happens once
            state.charges[entry["id"]] = ledger_usd(entry.get("cost_usd"))
            if entry.get("cost_estimated"):
                state.estimated.add(entry["id"])
    return state


def budget_line(entry: Mapping[str, Any]) -> tuple[float, float] | None:
    """(the tree's new budget, the one before) of a budget line; None for any other line, or one whose numbers don't count."""
    if entry.get("kind") != "budget" or "id" in entry:
        return None
    new, old = ledger_usd(entry.get("max_budget_usd")), ledger_usd(entry.get("previous_usd"))
    return (new, old) if new is not None and old is not None else None


def budget_state(lines: Iterable[str], accept: Accept | None = None) -> BudgetState:
    """Fold ledger.jsonl's budget and top-up lines (pure); holds and charges are ledger_state's."""
    state = BudgetState()
    for entry in ledger_entries(lines, accept):
        if (change := budget_line(entry)) is not None:
            state.budget = change[0]
            state.raised += change[0] - change[1]
        elif entry.get("kind") == "reserve" and (topped := ledger_usd(entry.get("topped_up_usd"))) is not None:
            state.topped_up += topped
    return state


def ledger_seconds(value: Any) -> float | None:
    """A span of seconds as a spend line may carry it: a finite, non-negative number (not a bool); else None."""
    return ledger_usd(value)  # the same rule as money's: what counts is a finite number >= 0


def model_calls(lines: Iterable[str]) -> dict[str, list[ModelCall]]:
    """Agent id -> its model calls, in ledger order, from the ledger's spend lines (pure).

    A call is its agent's (`id`), wherever its CLI ran (`host`). Its cost is
    read by the same rule as fold_ledger's, so an agent's calls sum to its spend.
    Only lines that mention "spend" are parsed: a tree's ledger is mostly holds and charges.
    """
    calls: dict[str, list[ModelCall]] = {}
    for entry in ledger_entries(line for line in lines if '"spend"' in line):
        agent, at = entry.get("id"), entry.get("time")
        if entry.get("kind") != "spend" or not isinstance(agent, str) or not isinstance(at, str):
            continue
        model, status = entry.get("model"), entry.get("status")
        call = ModelCall(
            time=at,
            model=model if isinstance(model, str) else "",
            usage=token_counts(entry.get("usage")),
            cost_usd=ledger_usd(entry.get("cost_usd")) or 0.0,
            status=status if isinstance(status, str) else "",
            duration_s=ledger_seconds(entry.get("duration_s")),
            ttfb_s=ledger_seconds(entry.get("ttfb_s")),
        )
        calls.setdefault(agent, []).append(call)
    return calls


def read_model_calls(session: Path) -> dict[str, list[ModelCall]]:
    return model_calls(ledger_lines(session))


def ledger_lines(session: Path) -> list[str]:
    """The ledger's lines, read whole under its shared POSIX lock; none when nothing was written yet."""
    try:
        return read_text(session / LEDGER, shared_lock=True).splitlines()
    except FileNotFoundError:
        return []


def read_ledger(session: Path) -> LedgerState:
    return ledger_state(ledger_lines(session))


@dataclass
class LedgerTail:
    """The ledger as a long-lived reader keeps it (the gateway, once a model call): it reads and folds
    only what was appended since it last read, so a call costs the same in a tree's thousandth call."""

    session: Path
    state: LedgerState = field(default_factory=LedgerState)
    offset: int = 0
    identity: tuple[int, int] | None = None
    accept: Accept | None = None

    def read(self) -> LedgerState:
        try:
            fd, st = open_regular(self.session / LEDGER, os.O_RDONLY)
        except FileNotFoundError:
            return self.state
        try:
            if (st.st_dev, st.st_ino) != self.identity or st.st_size < self.offset:  # replaced: read it anew
                self.state, self.offset, self.identity = LedgerState(), 0, (st.st_dev, st.st_ino)
            if st.st_size > self.offset:
                data = os.pread(fd, st.st_size - self.offset, self.offset)
                whole = data[: data.rfind(b"\n") + 1]  # each append is one whole line: a line cut here is read next time
                fold_ledger(self.state, whole.decode(errors="replace").splitlines(), self.accept)
                self.offset += len(whole)
        finally:
            os.close(fd)
        return self.state


def tree_spend(session: Path) -> tuple[float, int]:
    """(USD charged to ended agents, how many of them have an unknown cost)."""
    state = read_ledger(session)
    return state.spent, state.unknown


# ---------------------------------------------------------------- writing --
# ledger.jsonl is shared by every host of a tree placed on a cluster. O_APPEND is
# atomic on one host only: an NFS client appends at the file size it has cached.
# So each line is written under a POSIX lock of the ledger itself (fcntl; NFSv4
# keeps such locks on the server): taking it makes the Linux NFS client fetch
# the file's current size, and releasing it (at close) flushes the line first.
# Readers take it shared, so they see every line written before.


def append_ledger(session: Path, record: Mapping[str, Any], secrets_: Sequence[str]) -> None:
    """One ledger line, under the ledger's exclusive POSIX lock (callers hold the session lock too)."""
    append_jsonl(session / LEDGER, record, secrets_, locked=True)


def charge(agent_dir: Path, outcome: Outcome, secrets_: Sequence[str]) -> None:
    """The ledger line of a committed outcome: it releases the agent's budget hold."""
    if outcome.status == Status.REFUSED and outcome.transcript is None:
        return  # refused before it ran: it held and spent nothing
    entry = LedgerEntry(
        id=outcome.id, time=outcome.ended_at, status=outcome.status, cost_usd=outcome.cost_usd, cost_estimated=outcome.cost_estimated,
        usage=token_counts(outcome.usage) if outcome.usage else None, cli_cost_usd=outcome.cli_cost_usd,
    )  # fmt: skip
    try:
        with session_lock(agent_dir.parent.parent):
            append_ledger(agent_dir.parent.parent, record_to_json(entry), secrets_)
    except CorruptRecordError as exc:
        # Something replaced the ledger (a FIFO, a directory): the outcome
        # is committed and must still get its marker and be reported.
        note(f"warning: {exc.message}; {outcome.id}'s charge is not in the ledger")


def budget_source(state: LedgerState, meta: AgentMeta) -> str | None:
    """Whose hold pays for a new agent: its parent's while that is live, else the tree's remainder."""
    return meta.parent_id if state.live(meta.parent_id) else None


def budget_left(session: Path, meta: AgentMeta, budget: float) -> tuple[float, str | None, LedgerState]:
    """(unreserved USD a new agent may hold, where it is drawn from, the ledger)."""
    state = read_ledger(session)
    source = budget_source(state, meta)
    own = state.spend_of(source or "")  # metered by the tree's gateway
    if source is not None and source not in state.spends and source not in state.hosted.values():
        # The parent is still spending from its own hold: count its turns so far.
        with contextlib.suppress(FileNotFoundError, SpawnError):
            own = transcript_spend(session / AGENTS_DIR / source, load_meta(session / AGENTS_DIR / source).model)
    return state.free(source, budget, own), source, state


def reserve_budget(session: Path, meta: AgentMeta, secrets_: Sequence[str]) -> None:
    """Hold an admitted agent's cap (under the session lock, right after admit)."""
    if read_limits(session).max_budget_usd is None or meta.max_budget_usd is None:
        return
    entry = LedgerEntry(
        id=meta.id,
        time=utc_now_iso(),
        kind="reserve",
        amount_usd=meta.max_budget_usd,
        drawn_from=budget_source(read_ledger(session), meta),
    )
    append_ledger(session, record_to_json(entry), secrets_)


def over_hold(session: Path, agent_id: str, own_spend: float, last_turn: float = 0.0) -> str | None:
    """Why an agent may take no further turn, or None: its own spend and what
    its children hold or were charged have reached its hold, or leave less of
    it than its last turn cost.

    The CLI's own cap (its max_budget_usd, the hold) sees only the agent's own
    turns; without this a parent that gave its hold to children could spend
    it again itself, and a subtree up to about twice its hold. The CLI also
    checks only after a turn, so every agent could overrun by one; a turn
    costs at least about what the last one did (the context only grows), so
    an agent that can't afford another is stopped before it, and the tree
    stays within its budget unless a turn costs much more than the one before.
    """
    state = read_ledger(session)
    if not state.live(agent_id):
        return None  # no tree budget, or already charged
    hold = state.holds[agent_id][1]
    children = sum(state.used_by(c) for c in state.draws(agent_id))
    spent = f"budget: its own turns (${own_spend:.4f}, estimated) and its children (${children:.4f} held or spent)"
    if own_spend + children >= hold:
        return f"{spent} reached its hold of ${hold:.4f}; stopped before another turn"
    if own_spend + children + last_turn > hold:
        left = hold - own_spend - children
        return (
            f"{spent} leave ${left:.4f} of its hold of ${hold:.4f}, less than its last turn cost (${last_turn:.4f}); "
            "stopped before another turn"
        )
    return None


# ------------------------------------------------- raises, top-ups, pauses --


def append_budget_change(
    session: Path,
    raise_usd: float | None,
    set_usd: float | None,
    by: str,
    secrets_: Sequence[str],
    *,
    at_most: float | None = None,
    authority: Authority | None = None,
) -> BudgetChange:
    """Append the tree's new budget to its ledger (under the session lock); the line.

    The caller has checked the numbers and the caller's right to change it.
    at_most: a caller's own cap (a server's --max-budget-usd), checked under
    the same lock as the change, so no raise that races another passes it.
    limits.json follows the line, so that every reader of the cap (admission,
    status, the MCP server) sees it; the ledger line, first, is the record.
    authority: the tree's gateway, the only writer of a tree that has one:
    the budget is what its own lines say, and its line is signed.
    """
    with session_lock(session):
        limits = read_limits(session)
        lines = ledger_lines(session)
        accept = authority.trusted if authority is not None else None
        budget = budget_now(session, lines, authority)
        if budget is None or limits.max_budget_usd is None:
            raise UsageError(f"session {session.name} has no budget (its root ran without --max-budget-usd); there is nothing to raise")
        ledger = ledger_state(lines, accept)
        new = budget + raise_usd if raise_usd is not None else float(set_usd or 0.0)
        if at_most is not None and new > at_most + 1e-9:
            raise RefusedError(f"refused: a budget of ${new:g} is past ${at_most:g}, the most this caller may give the tree")
        floor = ledger.spent + ledger.reserved
        if new + 1e-9 < floor:
            raise UsageError(
                f"--set {new:g} is below what the tree has spent and holds (${floor:.4f}); set at least that, or wait for agents to end"
            )
        change = BudgetChange(utc_now_iso(), round_usd(new) or 0.0, round_usd(budget) or 0.0, by)
        line = record_to_json(change)
        append_ledger(session, authority.sign(line) if authority is not None else line, secrets_)
        write_json_atomic(session / LIMITS, record_to_json(replace(limits, max_budget_usd=change.max_budget_usd)))
    return change


BUDGET_ATTEMPTS = "budget.attempts.jsonl"  # in the session: `budget` calls refused (from inside the tree)


def tree_caller_refusal(session: Path, callers: Sequence[tuple[str, str, int]]) -> str | None:
    """Why a caller may not change its tree's budget: it runs under one of the tree's agents (pure)."""
    for caller_session, agent, depth in callers:
        if same_dir(caller_session, session):
            return f"agent {agent} (depth {depth}) runs in this tree and can't change its budget; the person or a client outside can"
    return None


def same_dir(a: str, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return Path(a).resolve() == b.resolve()
    return False


def record_budget_refusal(session: Path, by: str, refusal: str, secrets_: Sequence[str]) -> None:
    attempt = {"at": utc_now_iso(), "by": by, "pid": os.getpid(), "refused": refusal}
    append_jsonl(session / BUDGET_ATTEMPTS, attempt, secrets_)


def hold_chain(ledger: LedgerState, agent_id: str) -> list[str]:
    """The live holds a top-up of agent_id's hold passes through: its own, then each live one it draws from (pure)."""
    chain: list[str] = []
    current: str | None = agent_id
    seen: set[str] = set()
    while current is not None and current in ledger.holds and current not in seen:
        seen.add(current)
        if ledger.live(current):
            chain.append(current)
        current = ledger.holds[current][0]
    return chain


def budget_now(session: Path, lines: Sequence[str], authority: Authority | None = None) -> float | None:
    """The tree's budget: its last budget line's (the gateway's own, for a tree that has one), else the one it began with."""
    changed = budget_state(lines, authority.trusted if authority is not None else None).budget
    if changed is not None:
        return changed
    return authority.initial_budget if authority is not None else read_limits(session).max_budget_usd


def top_up_hold(session: Path, agent_id: str, needed: float, secrets_: Sequence[str], authority: Authority | None = None) -> float | None:
    """Grow a paused agent's hold by needed from what `budget` raised, under the session lock; the new hold, or None.

    The holds it draws from grow by as much (their own room is unchanged),
    and the tree's remainder must have it: a raise is spent by the paused
    agents that need it, a turn at a time, and never more than was raised.
    authority: as for append_budget_change (only the gateway's raises count, and its lines are signed).
    """
    with session_lock(session):
        lines = ledger_lines(session)
        accept = authority.trusted if authority is not None else None
        ledger, changes = ledger_state(lines, accept), budget_state(lines, accept)
        budget = budget_now(session, lines, authority)
        chain = hold_chain(ledger, agent_id)
        if budget is None or not chain or changes.raised - changes.topped_up + 1e-9 < needed:
            return None
        if ledger.free(None, budget) + 1e-9 < needed:
            return None
        now = utc_now_iso()
        for n, holder in enumerate(chain):
            source, amount = ledger.holds[holder]
            line: dict[str, Any] = {"id": holder, "time": now, "kind": "reserve", "amount_usd": round_usd(amount + needed)}
            if source is not None:
                line["drawn_from"] = source
            if n == 0:
                line["topped_up_usd"] = round_usd(needed)
            append_ledger(session, authority.sign(line) if authority is not None else line, secrets_)
        return float(round_usd(ledger.holds[agent_id][1] + needed) or 0.0)


def overdrawn(ledger: LedgerState, holder: str, budget: float) -> str | None:
    """Why the holds above a live agent's may not be believed, or None (pure).

    Admission draws each hold from its parent's room, or the tree's remainder,
    and a top-up grows every hold of its chain alike: so what the holds drawn
    from a hold hold (an ended one: what it spent, up to its hold) is never
    more than that hold, nor the top holds more than the budget. A reserve line
    that anyone else appended (an agent's own, to grow its hold) breaks that
    somewhere on its chain, and the gateway grants none of the chain's calls:
    a line can move a hold's room, never make the tree's.
    """

    def held_below(source: str | None) -> float:
        return sum(ledger.holds[c][1] if ledger.live(c) else min(ledger.used_by(c), ledger.holds[c][1]) for c in ledger.draws(source))

    cursor: str | None = holder
    seen: set[str] = set()
    while cursor is not None and cursor not in seen:
        seen.add(cursor)
        if cursor not in ledger.holds:
            return f"agent {cursor}'s hold is drawn from a hold the ledger never had"
        hold = ledger.holds[cursor][1]
        if ledger.live(cursor) and (below := held_below(cursor)) > hold + LEDGER_SLACK_USD:
            return f"the holds drawn from agent {cursor}'s hold (${below:.4f}) are more than it (${hold:.4f})"
        cursor = ledger.holds[cursor][0]
    if cursor is not None:
        return "the ledger's holds are drawn in a loop"
    if (top := held_below(None)) > budget + LEDGER_SLACK_USD:
        return f"the holds drawn from the tree's budget (${top:.4f}) are more than it (${budget:.4f})"
    return None


def hold_need(session: Path, agent_id: str, own_spend: float, last_turn: float) -> tuple[float, float, float] | None:
    """(spent, hold, needed) of an agent whose next turn its hold can't pay for, else None."""
    ledger = read_ledger(session)
    if not ledger.live(agent_id):
        return None
    hold = ledger.holds[agent_id][1]
    spent = own_spend + sum(ledger.used_by(c) for c in ledger.draws(agent_id))
    needed = spent + last_turn - hold
    if spent < hold and needed <= 0:
        return None
    # At least a cent, rounded up to the micro-dollar: a hold that grows by a
    # hair's breadth would pause again at once.
    return spent, hold, max(0.01, math.ceil(max(needed, 0.0) * 1e6) / 1e6)


def hold_of(session: Path, agent_id: str) -> float:
    """An agent's hold in the ledger now (0 without one)."""
    return read_ledger(session).holds.get(agent_id, (None, 0.0))[1]

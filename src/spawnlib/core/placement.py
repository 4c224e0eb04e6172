"""Placement: where an agent runs (pure).

One seam for every way of running a node: as its own local process (local),
inside its parent's Claude Code process as a native subagent (inprocess), or
on a cluster (ray:ADDRESS). `auto` lets spawn.py choose between the first two.

A *policy* is what an agent was started under and what its children inherit
(--placement, else SPAWN_PLACEMENT, else local). The *backend* is where this
one agent actually runs, and meta.json records it with the reason.

Policies only narrow down the tree, in this order (widest first):

    ray:ADDRESS  >  local  >  auto  >  inprocess

A child may ask for its parent's policy or a narrower one, never a wider one;
under ray:A it may narrow to local (or below) but never move to ray:B. Under
inprocess every descendant is in-process: an in-process agent lives inside
its parent's CLI, and its children can only be that CLI's subagents too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import UsageError, did_you_mean

ENV_PLACEMENT = "SPAWN_PLACEMENT"  # the policy an agent runs under, inherited by its children
# The CLI's own limit on nesting its subagents (see subagent_depth_limit).
ENV_SUBAGENT_DEPTH = "CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH"
IN_PROCESS_POLICIES = ("inprocess", "auto")  # policies under which the Agent tool starts governed children
DEFAULT_POLICY = "local"
POLICY_NAMES = ("local", "inprocess", "auto", "ray")
# Wider placements give a child more separation from its parent; a child may only go down.
POLICY_RANK = {"inprocess": 0, "auto": 1, "local": 2, "ray": 3}
BACKENDS = ("local", "inprocess", "ray")


class PlacementError(UsageError):
    """A --placement value or narrowing spawn.py can't honour (exit 2)."""


@dataclass(frozen=True)
class PlacementPolicy:
    """A parsed --placement value."""

    name: str
    """local, inprocess, auto or ray."""
    address: str | None = None
    """ray only: the cluster's address, as given."""

    def __str__(self) -> str:
        return f"ray:{self.address}" if self.name == "ray" else self.name


@dataclass(frozen=True)
class PlacementDecision:
    """Where one agent runs, and why: meta.json's `placement` (schemas/meta.json)."""

    backend: str
    """local, inprocess or ray."""
    reason: str
    policy: str
    """The policy it ran under and passes on to its children."""

    def as_record(self) -> dict[str, Any]:
        return {"backend": self.backend, "reason": self.reason, "policy": self.policy}


def parse_policy(text: str, source: str = "--placement") -> PlacementPolicy:
    """`local`, `inprocess`, `auto` or `ray:ADDRESS` (pure)."""
    value = text.strip()
    name, sep, address = value.partition(":")
    if name == "ray":
        if not sep or not address.strip():
            raise PlacementError(f"{source} ray needs the cluster's address: ray:HOST:PORT (or ray:auto)")
        if any(c.isspace() for c in address):
            raise PlacementError(f"{source} {value!r}: the address may not hold spaces")
        return PlacementPolicy("ray", address.strip())
    if sep or name not in POLICY_NAMES:
        hint = did_you_mean(name, POLICY_NAMES) if not sep else ""
        raise PlacementError(f"{source} {value!r} is not a placement{hint or ';'} use local, inprocess, auto or ray:ADDRESS")
    return PlacementPolicy(name)


def narrow_policy(requested: PlacementPolicy | None, inherited: PlacementPolicy | None) -> tuple[PlacementPolicy, str | None]:
    """(the policy to run under, a warning): a child never widens its parent's (pure).

    A wider request is lowered to the inherited policy, with a warning, as
    permission modes are. Moving from one cluster to another is no narrowing:
    that is refused.
    """
    if inherited is None:
        return requested or PlacementPolicy(DEFAULT_POLICY), None
    if requested is None:
        return inherited, None
    if requested.name == "ray" and inherited.name == "ray" and requested.address != inherited.address:
        raise PlacementError(
            f"--placement {requested} under the parent's {inherited}: a child may leave its parent's cluster "
            f"for local or inprocess, never move to another; drop --placement or use {inherited}"
        )
    if POLICY_RANK[requested.name] > POLICY_RANK[inherited.name]:
        return inherited, f"placement {requested} lowered to the parent's {inherited} (placement only narrows)"
    return requested, None


def process_needs(
    *,
    sandbox: bool = False,
    own_cwd: bool = False,
    deadline: bool = False,
    budget: bool = False,
    kind: str = "claude",
    cluster: bool = False,
) -> list[str]:
    """What a child asks for that only a process of its own can give (pure).

    A subagent shares its parent's CLI: its sandbox, its working directory, its
    node kind; and spawn.py can stop it only between tool calls, so a deadline
    or budget it was given explicitly is kept hard only by a process.
    """
    needs = []
    if sandbox:
        needs.append("its own sandbox")
    if own_cwd:
        needs.append("its own working directory")
    if deadline:
        needs.append("a hard deadline")
    if budget:
        needs.append("a hard budget")
    if kind != "claude":
        needs.append(f"another kind of node ({kind})")
    if cluster:
        needs.append("a cluster placement")
    return needs


def decide_placement(policy: PlacementPolicy, needs: Sequence[str], *, by_agent_tool: bool, is_root: bool) -> PlacementDecision:
    """Where an agent runs under policy (pure).

    by_agent_tool: started by a parent's Agent tool (a native subagent), not as
    a spawn.py command. Raises PlacementError where the policy can't be kept.
    """
    if policy.name == "ray":
        if by_agent_tool:
            return PlacementDecision("inprocess", f"started with the Agent tool inside its parent's CLI (under {policy})", str(policy))
        return PlacementDecision("ray", f"placement {policy}", str(policy))
    if by_agent_tool:
        if policy.name == "local":
            raise PlacementError("placement local: a Claude Code subagent runs inside its parent's CLI, not as a process")
        if needs and policy.name == "auto":
            raise PlacementError(f"placement auto: this child needs a process ({', '.join(needs)}); start it with spawn.py from Bash")
        why = "nothing it needs requires a process" if policy.name == "auto" else "placement inprocess"
        return PlacementDecision("inprocess", f"{why}: a Claude Code subagent in its parent's CLI", str(policy))
    if is_root:
        return PlacementDecision("local", "a root runs as the process it was started as", str(policy))
    if policy.name == "inprocess":
        raise PlacementError(
            "placement inprocess: this agent's children run inside its CLI as Claude Code subagents (the Agent tool), "
            "not as spawn.py processes; use the Agent tool, or start the tree with --placement auto or local"
        )
    if policy.name == "auto":
        if needs:
            return PlacementDecision("local", f"placement auto: it needs a process ({', '.join(needs)})", str(policy))
        return PlacementDecision("local", "placement auto: started as a spawn.py command, so it is a process already", str(policy))
    return PlacementDecision("local", "placement local", str(policy))


def subagent_depth_limit(depth: int, max_depth: int) -> int:
    """How many levels of subagents an agent's CLI may nest below it (pure).

    The CLI's CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH=N offers the Agent tool to
    subagents at levels 0..N-1 below the main thread: level N has no Agent
    tool (measured on CLI 2.1.329: N=1 gives the main thread alone the tool,
    unset means 3). 0 or less counts as unset, so at the limit the Agent tool
    is withheld from the tool list instead (0 returned here).
    """
    return max(0, max_depth - depth)

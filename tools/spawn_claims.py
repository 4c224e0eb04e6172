"""Signed limits that travel: the claim a root's side gives each agent it places on another host.

Shared by the Ray sibling (tools/ray_place.py), which makes and checks
claims, and the A2A server (tools/a2a_server.py --require-claim), which
checks them. Not a PEP 723 script of its own: its one dependency,
`cryptography`, is in both importers' locks. spawn.py never imports it, so a
claude leaf never loads cryptography.

A claim is a JSON object in canonical form (sorted keys, no spaces, ASCII),
signed with Ed25519: a verifier holds only the public key and can't mint
one. The signing key is per tree and lives only in memory (the driver on
the root's side and the host actors it hands it to); nothing here writes a
private key anywhere. Verifying checks, in order: the signature over the
exact bytes, the version, the audience, the times, and the nonce (once).
"""

from __future__ import annotations

import base64
import json
import math
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

CLAIM_VERSION = 1
# Minted just before the node starts the agent: a claim lives long enough to
# cross the cluster and be checked once, not to be stored and replayed later.
CLAIM_TTL_S = 120.0
# Hosts' clocks disagree a little (NTP keeps them within tens of ms); a claim
# issued "in the future" by that much is not a forgery.
CLOCK_SKEW_S = 5.0
# spawn.py's ranking of permission modes (constants.PERMISSION_RANK): a child
# gets no more than its parent. Repeated here: siblings never import spawn.py.
PERMISSION_RANK = {"plan": 0, "dontAsk": 1, "default": 2, "acceptEdits": 3, "auto": 3, "bypassPermissions": 4}
A2A_CLAIM_KEY = "spawn.claim"
A2A_SIGNATURE_KEY = "spawn.claim_sig"


class ClaimError(ValueError):
    """A claim refused: missing, changed, expired, replayed, or for someone else. The message says which."""


@dataclass(frozen=True)
class Claim:
    """What a node may run for one agent: spawn.py's limits, signed by the tree's key."""

    session: str
    """The session's id (its directory name)."""
    parent: str | None
    """The parent agent's id; None for the root."""
    child: str
    """The id the agent runs under."""
    audience: str
    """Who may act on it: the Ray node id (or a boot id, or an A2A server's name)."""
    depth: int
    max_depth: int
    deadline: float | None
    """Absolute, Unix seconds."""
    budget_hold_usd: float | None
    """What the ledger holds for this agent; it may spend no more."""
    tools: tuple[str, ...]
    deny: tuple[str, ...]
    ask: tuple[str, ...]
    permission_mode: str
    issued_at: float = field(default_factory=time.time)
    expires_at: float = 0.0
    """0 at construction means issued_at + CLAIM_TTL_S (set by sign_claim)."""
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))
    version: int = CLAIM_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("tools", "deny", "ask"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Claim:
        """A claim's fields, types checked: a wrong one is a changed claim, never a crash further on."""
        expected = {
            "session": (str,),
            "parent": (str, type(None)),
            "child": (str,),
            "audience": (str,),
            "depth": (int,),
            "max_depth": (int,),
            "deadline": (float, int, type(None)),
            "budget_hold_usd": (float, int, type(None)),
            "tools": (list,),
            "deny": (list,),
            "ask": (list,),
            "permission_mode": (str,),
            "issued_at": (float, int),
            "expires_at": (float, int),
            "nonce": (str,),
            "version": (int,),
        }
        if set(data) != set(expected):
            raise ClaimError(f"claim fields differ from version {CLAIM_VERSION}'s: {sorted(set(data) ^ set(expected))}")
        for name, types in expected.items():
            if type(data[name]) not in types:  # type(): True is no depth
                raise ClaimError(f"claim field {name} has the wrong type")
        for name in ("tools", "deny", "ask"):
            if not all(isinstance(item, str) for item in data[name]):
                raise ClaimError(f"claim field {name} must be a list of strings")
        if data["permission_mode"] not in PERMISSION_RANK:
            raise ClaimError(f"claim permission mode {data['permission_mode']!r} is unknown")
        values = {**data, **{n: tuple(data[n]) for n in ("tools", "deny", "ask")}}
        return cls(**values)


def canonical(data: Mapping[str, Any]) -> bytes:
    """The one byte form that is signed: sorted keys, no whitespace, ASCII, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_tree_key() -> Ed25519PrivateKey:
    """A tree's signing key: in memory only, never written, never in an environment."""
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public half as PEM, for verifiers (a file they read; it signs nothing)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(path: Path | str) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ClaimError(f"{path} holds no Ed25519 public key")
    return key


def sign_claim(claim: Claim, key: Ed25519PrivateKey) -> tuple[str, str]:
    """(claim text, signature): the text is canonical JSON, the signature base64url over its bytes."""
    data = claim.to_json()
    if not data["expires_at"]:
        data["expires_at"] = data["issued_at"] + CLAIM_TTL_S
    if data["deadline"] is not None:
        data["expires_at"] = min(data["expires_at"], data["deadline"])
    raw = canonical(data)
    return raw.decode(), b64url(key.sign(raw))


class ReplayCache:
    """Nonces seen, until their claim expires: a claim is acted on once per verifier.

    In memory: a host actor or an A2A server lives as long as the tree it
    serves; a replay after a restart is still bounded by the claim's expiry
    (CLAIM_TTL_S at most).
    """

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first_use(self, nonce: str, expires_at: float, now: float) -> bool:
        with self._lock:
            self._seen = {n: t for n, t in self._seen.items() if t + CLOCK_SKEW_S >= now}
            if nonce in self._seen:
                return False
            self._seen[nonce] = expires_at
            return True


def verify_claim(
    text: str | None,
    signature: str | None,
    public_key: Ed25519PublicKey,
    *,
    audience: str,
    replay: ReplayCache,
    now: float | None = None,
) -> Claim:
    """The claim, if it is whole, signed by the tree's key, for this audience, current and new; else ClaimError."""
    if not text or not signature:
        raise ClaimError("no claim: a placed agent needs its limits signed by the tree's key")
    raw = text.encode()
    try:
        public_key.verify(unb64url(signature), raw)
    except (InvalidSignature, ValueError) as exc:
        raise ClaimError("the claim's signature does not match: it was changed, or signed by another key") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ClaimError("the claim is not JSON") from exc
    if not isinstance(data, dict) or canonical(data) != raw:
        raise ClaimError("the claim is not in canonical form")
    if data.get("version") != CLAIM_VERSION:
        raise ClaimError(f"claim version {data.get('version')!r} is not {CLAIM_VERSION}")
    claim = Claim.from_json(data)
    now = time.time() if now is None else now
    if claim.audience != audience:
        raise ClaimError(f"the claim is for {claim.audience}, not {audience}")
    if claim.issued_at > now + CLOCK_SKEW_S:
        raise ClaimError("the claim was issued in the future")
    if not math.isfinite(claim.expires_at) or now > claim.expires_at:
        raise ClaimError("the claim has expired")
    if claim.deadline is not None and now > claim.deadline:
        raise ClaimError("the agent's deadline has passed")
    if claim.depth > claim.max_depth:
        raise ClaimError(f"the claim's depth {claim.depth} is past its max depth {claim.max_depth}")
    if not replay.first_use(claim.nonce, claim.expires_at, now):
        raise ClaimError("the claim was used already (replayed)")
    return claim


def narrow_claim(parent: Claim, *, child: str, audience: str, asked: Mapping[str, Any]) -> Claim:
    """A child's claim: the minimum of the parent's and what is asked. Never more than the parent holds.

    asked may hold deadline, budget_hold_usd, tools, deny, ask, permission_mode
    and max_depth; anything missing is the parent's.
    """
    depth = parent.depth + 1
    if depth > parent.max_depth:
        raise ClaimError(f"depth {depth} is past the tree's max depth {parent.max_depth}")

    def least(mine: float | None, theirs: Any) -> float | None:
        values = [v for v in (mine, theirs) if v is not None]
        return min(values) if values else None

    tools: Sequence[str] = asked.get("tools", parent.tools)
    mode = asked.get("permission_mode", parent.permission_mode)
    if PERMISSION_RANK.get(mode, 99) > PERMISSION_RANK[parent.permission_mode]:
        mode = parent.permission_mode
    return Claim(
        session=parent.session,
        parent=parent.child,
        child=child,
        audience=audience,
        depth=depth,
        max_depth=min(parent.max_depth, int(asked.get("max_depth", parent.max_depth))),
        deadline=least(parent.deadline, asked.get("deadline")),
        budget_hold_usd=least(parent.budget_hold_usd, asked.get("budget_hold_usd")),
        tools=tuple(t for t in tools if t in parent.tools),
        deny=tuple(dict.fromkeys([*parent.deny, *asked.get("deny", ())])),
        ask=tuple(dict.fromkeys([*parent.ask, *asked.get("ask", ())])),
        permission_mode=mode,
    )

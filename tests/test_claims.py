"""tools/spawn_claims.py: signed limits that travel to other hosts (unit tests of the pure claim code).

A node refuses a missing, changed, expired, replayed or misaddressed claim;
a child's claim is never more than its parent's. Skipped where the tests'
venv has no cryptography (the A2A server's lock brings it).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cryptography")

import spawn_claims  # from tools/, which conftest.py puts on sys.path
from spawn_claims import Claim, ClaimError, ReplayCache, narrow_claim, new_tree_key, sign_claim, verify_claim

NODE = "node-a"


def root_claim(**changes: object) -> Claim:
    fields: dict[str, object] = {
        "session": "20261127-1200-t",
        "parent": None,
        "child": "a1-000001",
        "audience": NODE,
        "depth": 1,
        "max_depth": 3,
        "deadline": None,
        "budget_hold_usd": 1.0,
        "tools": ("Read", "Bash"),
        "deny": ("Bash(rm:*)",),
        "ask": (),
        "permission_mode": "dontAsk",
    }
    fields.update(changes)
    return Claim(**fields)  # type: ignore[arg-type]


def test_a_signed_claim_verifies_once() -> None:
    key = new_tree_key()
    text, sig = sign_claim(root_claim(), key)
    cache = ReplayCache()
    claim = verify_claim(text, sig, key.public_key(), audience=NODE, replay=cache)
    assert claim.child == "a1-000001" and claim.tools == ("Read", "Bash") and claim.budget_hold_usd == 1.0
    with pytest.raises(ClaimError, match="replayed"):
        verify_claim(text, sig, key.public_key(), audience=NODE, replay=cache)


@pytest.mark.parametrize(("text", "sig"), [(None, None), ("", ""), ('{"a":1}', None)])
def test_a_missing_claim_is_refused(text: str | None, sig: str | None) -> None:
    with pytest.raises(ClaimError, match="no claim"):
        verify_claim(text, sig, new_tree_key().public_key(), audience=NODE, replay=ReplayCache())


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(budget_hold_usd=100.0),
        lambda d: d.update(tools=["Read", "Bash", "Write"]),
        lambda d: d.update(deny=[]),
        lambda d: d.update(permission_mode="bypassPermissions"),
        lambda d: d.update(max_depth=10),
        lambda d: d.update(expires_at=d["expires_at"] + 3600),
    ],
    ids=["budget", "tools", "deny", "mode", "depth", "expiry"],
)
def test_a_changed_claim_is_refused(tamper: object) -> None:
    key = new_tree_key()
    text, sig = sign_claim(root_claim(), key)
    data = json.loads(text)
    tamper(data)  # type: ignore[operator]
    changed = spawn_claims.canonical(data).decode()
    with pytest.raises(ClaimError, match="signature"):
        verify_claim(changed, sig, key.public_key(), audience=NODE, replay=ReplayCache())


def test_a_claim_signed_by_another_tree_is_refused() -> None:
    text, sig = sign_claim(root_claim(), new_tree_key())
    with pytest.raises(ClaimError, match="signature"):
        verify_claim(text, sig, new_tree_key().public_key(), audience=NODE, replay=ReplayCache())


def test_a_reformatted_claim_is_refused_even_with_its_own_signature() -> None:
    """The signature covers exact bytes: a verifier never re-serialises before checking."""
    key = new_tree_key()
    text, _ = sign_claim(root_claim(), key)
    spaced = json.dumps(json.loads(text), indent=1)
    with pytest.raises(ClaimError, match="canonical"):
        verify_claim(spaced, spawn_claims.b64url(key.sign(spaced.encode())), key.public_key(), audience=NODE, replay=ReplayCache())


def test_an_expired_claim_is_refused() -> None:
    key = new_tree_key()
    text, sig = sign_claim(root_claim(issued_at=1000.0), key)
    with pytest.raises(ClaimError, match="expired"):
        verify_claim(text, sig, key.public_key(), audience=NODE, replay=ReplayCache(), now=1000.0 + spawn_claims.CLAIM_TTL_S + 1)


def test_a_claim_expires_at_the_agents_deadline() -> None:
    key = new_tree_key()
    text, sig = sign_claim(root_claim(issued_at=1000.0, deadline=1010.0), key)
    assert json.loads(text)["expires_at"] == 1010.0
    with pytest.raises(ClaimError, match="expired"):
        verify_claim(text, sig, key.public_key(), audience=NODE, replay=ReplayCache(), now=1011.0)


def test_a_claim_for_another_node_is_refused() -> None:
    key = new_tree_key()
    text, sig = sign_claim(root_claim(), key)
    with pytest.raises(ClaimError, match="not node-b"):
        verify_claim(text, sig, key.public_key(), audience="node-b", replay=ReplayCache())


def test_a_child_claim_is_never_more_than_its_parent() -> None:
    parent = root_claim(deadline=5000.0)
    asked = {
        "deadline": 9000.0,
        "budget_hold_usd": 50.0,
        "tools": ["Read", "Write"],
        "deny": ["WebFetch"],
        "permission_mode": "bypassPermissions",
        "max_depth": 9,
    }
    child = narrow_claim(parent, child="a2-000002", audience="node-b", asked=asked)
    assert (child.parent, child.depth, child.max_depth) == ("a1-000001", 2, 3)
    assert (child.deadline, child.budget_hold_usd) == (5000.0, 1.0)
    assert child.tools == ("Read",)
    assert child.deny == ("Bash(rm:*)", "WebFetch")
    assert child.permission_mode == "dontAsk"
    assert narrow_claim(parent, child="c", audience="n", asked={"deadline": 10.0, "budget_hold_usd": 0.25}).deadline == 10.0
    with pytest.raises(ClaimError, match="max depth"):
        narrow_claim(root_claim(depth=3), child="c", audience="n", asked={})


def test_a_claim_with_a_wrong_field_type_is_refused_not_crashed() -> None:
    key = new_tree_key()
    data = root_claim().to_json() | {"expires_at": 2e9, "depth": True}
    raw = spawn_claims.canonical(data)
    with pytest.raises(ClaimError, match="depth"):
        verify_claim(raw.decode(), spawn_claims.b64url(key.sign(raw)), key.public_key(), audience=NODE, replay=ReplayCache())

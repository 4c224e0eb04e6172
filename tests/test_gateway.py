"""The tree's model gateway: every agent's calls metered where they are spent, held to its hold, with no real credential below the root."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import (
    FAKE_API_KEY,
    ROOT,
    MockModel,
    agent_dirs,
    load,
    mock_task,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    wait_until,
    write_agent,
)

import spawn

TABLE = spawn.price_table({})


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_price_usage_prices_every_kind_of_token() -> None:
    usage = {
        "input_tokens": 1_000_000,
        "output_tokens": 1_000_000,
        "cache_read_input_tokens": 1_000_000,
        "cache_creation_input_tokens": 2_000_000,
        "cache_creation": {"ephemeral_1h_input_tokens": 1_000_000},
    }
    assert spawn.price_usage("claude-sonnet-4-5", usage, TABLE) == pytest.approx(3 + 15 + 0.3 + 3 * 1.25 + 3 * 2)
    overridden = spawn.price_table({"SPAWN_GATEWAY_PRICES": json.dumps({"sonnet": [1, 2], "bad": ["x", 1]})})
    assert overridden["sonnet"] == (1.0, 2.0) and "bad" not in overridden
    assert spawn.price_usage("sonnet", {"output_tokens": 1_000_000}, overridden) == 2.0


def test_hold_plan_reserves_the_input_high_and_bounds_the_output() -> None:
    # $0.10 of room; 3,000 request bytes are at most 1,000 tokens, priced as cache writes: $0.00375.
    granted, reserved = spawn.hold_plan(0.10, 3_000, "sonnet", 32_000, TABLE)
    assert granted == int((0.10 - 0.00375) * 1e6 / 15) and reserved == pytest.approx(0.00375 + granted * 15 / 1e6)
    assert reserved <= 0.10
    assert spawn.hold_plan(10.0, 3_000, "sonnet", 500, TABLE)[0] == 500  # never more than asked
    assert spawn.hold_plan(0.004, 3_000, "sonnet", 500, TABLE)[0] is None  # no room for a turn


def test_stream_meter_reads_usage_and_charges_a_cut_stream_for_what_passed() -> None:
    message = {"id": "m", "model": "sonnet", "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}}
    frames = [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x" * 400}}),
    ]
    meter = spawn.StreamMeter()
    raw = b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in frames)
    for n in range(0, len(raw), 7):  # split anywhere
        meter.feed_sse(raw[n : n + 7])
    assert meter.served() == {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 100}
    meter.feed_sse(b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 120}}\n\n')
    assert meter.final and meter.served()["output_tokens"] == 120


# ------------------------------------------------------------------ end to end --


def gateway_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SPAWN_GATEWAY": "1"}


def served_usd(mock_model: MockModel) -> float:
    """What the scripted model served, at list price: each answer's last record (a cut stream logs what it sent)."""
    last: dict[str, dict[str, Any]] = {}
    for record in mock_model.requests():
        if record.get("message_id") and record.get("usage"):
            last[record["message_id"]] = record
    return sum(spawn.price_usage(str(r["model"]), r["usage"], TABLE) for r in last.values())


def gone(path: Path) -> bool:
    return not path.exists()


def ledger_lines(session_root: Path) -> list[dict[str, Any]]:
    (path,) = session_root.glob("*/ledger.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def heavy(name: str, first: dict[str, Any] | None = None, turns: int = 4) -> str:
    steps: list[dict[str, Any]] = [first] if first else []
    steps += [{"text": f"{name} turn {n}", "bash": "true", "filler": 20_000, "stream_s": 0.3} for n in range(turns)]
    return mock_task(name, [*steps, {"text": f"{name} done"}])


def test_a_heavy_tree_spends_what_was_served_and_stays_within_its_budget(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    """Process children at depth 1 and 2, four 20,000-token turns each, under --max-budget-usd 1 (fail)."""
    budget = 1.0
    leaf = heavy("leaf")
    child = heavy("child", {"bash": spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.3")})
    root = heavy("root", {"bash": spawn_in_bash("--task", child, "--tools", "Bash", "--max-budget-usd", "0.6")})
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", str(budget)], gateway_env(env), timeout=300)
    lines = ledger_lines(session_root)
    spent = spawn.ledger_state([json.dumps(line) for line in lines]).spent
    served = served_usd(mock_model)
    assert served > 0.5, (done.stderr[-2000:], lines)
    assert spent == pytest.approx(served, rel=0.01)
    assert spent <= budget + 1e-6
    outcomes = {d.name: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert len(outcomes) == 3
    refused = [o for o in outcomes.values() if "budget:" in str(o.get("reason"))]
    assert refused, outcomes
    for outcome in outcomes.values():
        assert outcome.get("cli_cost_usd") is None or outcome["cost_usd"] >= outcome["cli_cost_usd"] * 0.5
    # Only the gateway sent the real credential; every agent's CLI its own.
    real = hashlib.sha256(FAKE_API_KEY.encode()).hexdigest()[:12]
    assert {r["credential"] for r in mock_model.requests() if r["path"].startswith("/v1/messages")} == {real}
    for d in agent_dirs(session_root):
        assert FAKE_API_KEY not in (d / "transcript.jsonl").read_text()
    assert os.environ.get("ANTHROPIC_API_KEY") != FAKE_API_KEY


def test_under_pause_the_gateway_holds_the_request_until_a_raise(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    """The same tree under --on-budget pause: it pauses, is raised, and ends done, within what it was given."""
    leaf = heavy("leaf", turns=2)
    child = heavy("child", {"bash": spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.6")}, turns=2)
    root = heavy("root", {"bash": spawn_in_bash("--task", child, "--tools", "Bash", "--max-budget-usd", "0.8")}, turns=2)
    args = ["--task", root, "--tools", "Bash", "--max-budget-usd", "1", "--on-budget", "pause"]
    proc = start_spawn(args, gateway_env(env))
    raises = 0
    limit = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < limit:
        paused = list(session_root.glob("*/agents/*/paused.json"))
        if paused:
            session = paused[0].parent.parent.parent
            seen = len(mock_model.requests())
            time.sleep(1.0)  # the rest of the tree waits on the paused agent (each parent on its child, in Bash)
            if paused[0].exists():
                assert len(mock_model.requests()) == seen, "a request reached the model while paused"
            raised = run_spawn(["budget", str(session), "--raise", "1"], env)
            assert raised.returncode == spawn.ExitCode.OK, raised.stderr
            raises += 1
            assert wait_until(functools.partial(gone, paused[0]), 30), "the raise did not resume it"
        time.sleep(0.2)
    code, _, err = finish(proc)
    assert code == spawn.ExitCode.OK, err[-3000:]
    assert raises >= 1
    outcomes = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert [o["status"] for o in outcomes] == ["done"] * 3, [o.get("reason") for o in outcomes]
    lines = ledger_lines(session_root)
    spent = spawn.ledger_state([json.dumps(line) for line in lines]).spent
    assert spent == pytest.approx(served_usd(mock_model), rel=0.01)
    (limits,) = session_root.glob("*/limits.json")
    assert spent <= json.loads(limits.read_text())["max_budget_usd"] + 1e-6


def test_a_killed_agent_is_charged_what_was_served(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    task = mock_task("killed", [{"text": "long", "filler": 20_000, "stream_s": 10}])
    proc = start_spawn(["--task", task, "--max-budget-usd", "2"], gateway_env(env))
    assert wait_until(lambda: any(r.get("kind") == "main" and r.get("message_id") for r in mock_model.requests()), 60)
    time.sleep(3)  # a third of the stream or so
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == spawn.ExitCode.KILLED, err[-2000:]
    assert wait_until(lambda: any(r["reply"] == "stream_cut" for r in mock_model.requests()), 10)
    (outcome,) = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    served = served_usd(mock_model)
    assert 0.05 < served < 0.25  # cut: 20,000 tokens would be $0.30 of output alone
    # Within one chunk (400 bytes: 100 tokens, $0.0015) in flight when the CLI went.
    assert outcome["cost_usd"] == pytest.approx(served, abs=0.0016)
    assert spawn.ledger_state([json.dumps(line) for line in ledger_lines(session_root)]).spent == pytest.approx(served, abs=0.0016)


DIRECT_CALLS = """
import json, os, sys, urllib.request, urllib.error
out = open(sys.argv[1], "a")
login = os.path.join(os.environ.get("CLAUDE_CONFIG_DIR") or os.path.expanduser("~/.claude"), ".credentials.json")
try:
    read = open(login).read()
except OSError as exc:
    read = "unreadable: " + type(exc).__name__
out.write(json.dumps({"environ": dict(os.environ), "login": read}) + "\\n")
script = 'MOCK[{"text": "direct", "filler": 20000}]MOCK'
for n in range(3):
    body = {"model": "claude-opus-direct", "max_tokens": 32000, "tools": [{"name": "Bash"}],
            "messages": [{"role": "user", "content": script}]}
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""), "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            out.write(json.dumps({"status": reply.status, "stop": json.loads(reply.read())["stop_reason"]}) + "\\n")
    except urllib.error.HTTPError as exc:
        out.write(json.dumps({"status": exc.code}) + "\\n")
    except OSError:
        out.write(json.dumps({"status": "unreachable"}) + "\\n")
"""

REAL_LOGIN = "sk-ant-oat01-real-login-token-0000"
REAL_HELPER_KEY = "sk-ant-api03-real-helper-key-0000"


def credential_given(way: str, env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The user's environment with the real credential given one way, and that credential."""
    config = Path(env["CLAUDE_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    if way == "environment":
        return env, FAKE_API_KEY
    bare = {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}
    if way == "login":
        login = {"claudeAiOauth": {"accessToken": REAL_LOGIN, "refreshToken": "r", "expiresAt": 4102444800000}}
        (config / ".credentials.json").write_text(json.dumps(login))
        (config / ".credentials.json").chmod(0o600)
        return bare, REAL_LOGIN
    (config / "settings.json").write_text(json.dumps({"apiKeyHelper": f"echo {REAL_HELPER_KEY}"}))
    return bare, REAL_HELPER_KEY


@pytest.mark.parametrize("way", ["environment", "login", "apiKeyHelper"])
@pytest.mark.parametrize("sandbox", ["off", "on"])
def test_no_agent_holds_the_real_credential_and_its_direct_calls_are_metered(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path, *, way: str, sandbox: str
) -> None:
    if sandbox == "on" and (shutil.which("bwrap") is None or shutil.which("socat") is None):
        pytest.skip(f"Claude Code's sandbox needs them: {spawn.SANDBOX_INSTALL}")
    user_env, real = credential_given(way, env)
    out = tmp_path / "scratch" / "found.jsonl"
    out.parent.mkdir()
    (tmp_path / "direct.py").write_text(DIRECT_CALLS)
    # A leaf's Bash prints its environment, reads the login's file, and calls the model with what it found.
    bash = f'"$SPAWN_PYTHON" {tmp_path / "direct.py"} {out}'
    leaf = mock_task("leaf", [{"bash": bash}, {"text": "leaf done"}])
    child = spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.3", "--sandbox", sandbox, "--cwd", str(out.parent))
    root = mock_task("root", [{"bash": child}, {"text": "root done"}])
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1"], user_env, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    assert "warning: budget: soft" not in done.stderr
    found = [json.loads(line) for line in out.read_text().splitlines()]
    seen, calls = found[0], found[1:]
    assert real not in json.dumps(seen["environ"])
    assert seen["environ"]["ANTHROPIC_API_KEY"].startswith("sk-spawn-")
    if sandbox == "on":
        assert real not in seen["login"]  # the login's file is hidden from a sandboxed Bash
    lines = ledger_lines(session_root)
    leaf_id = next(d.name for d in agent_dirs(session_root) if d.name.startswith("a1-"))
    direct = [line for line in lines if line.get("kind") == "spend" and line.get("model") == "claude-opus-direct"]
    if sandbox == "on" and {c["status"] for c in calls} == {"unreachable"}:
        assert not direct  # the sandbox's network reaches no loopback server: the gateway is out of its reach too
    else:
        # The first call is cut to what the leaf's hold can pay; then nothing is left: refused.
        assert calls[0] == {"status": 200, "stop": "max_tokens"} and calls[-1] == {"status": 403}
        assert direct and {line["id"] for line in direct} == {leaf_id}
    state = spawn.ledger_state([json.dumps(line) for line in lines])
    assert (state.cost(leaf_id) or 0.0) <= 0.3 + 1e-6
    # Only the gateway sent the real credential; no session file names it.
    digest = hashlib.sha256(real.encode()).hexdigest()[:12]
    assert {r["credential"] for r in mock_model.requests() if r["path"].startswith("/v1/messages")} == {digest}
    for path in session_root.rglob("*"):
        if path.is_file():
            assert real not in path.read_text(errors="replace"), path


def test_the_gateway_sends_a_login_as_a_bearer_token_with_the_oauth_beta(tmp_path: Path) -> None:
    """The header swap for a claude.ai login (the API's side of OAuth can't be tried offline)."""
    login = tmp_path / ".credentials.json"
    login.write_text(json.dumps({"claudeAiOauth": {"accessToken": "first"}}))
    credential, source = spawn.real_credential({"HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path)})
    assert source == "the claude.ai login" and credential["oauth"] == "first"
    gw = spawn.Gateway(tmp_path, credential, "http://upstream", {})
    sent = [(b"x-api-key", b"sk-spawn-agent"), (b"anthropic-beta", b"tools-2024, fine-grained"), (b"content-type", b"application/json")]
    headers = gw.upstream_headers(sent)
    assert headers["authorization"] == "Bearer first" and "x-api-key" not in headers
    assert headers["anthropic-beta"] == "tools-2024,fine-grained,oauth-2025-04-20"
    # The user's own CLI refreshed the login: the gateway reads the new token.
    login.write_text(json.dumps({"claudeAiOauth": {"accessToken": "second"}}))
    os.utime(login, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert gw.upstream_headers(sent)["authorization"] == "Bearer second"
    # Nothing to hold: no gateway, and the reason says what to give it.
    assert spawn.real_credential({"HOME": str(tmp_path / "none"), "CLAUDE_CONFIG_DIR": str(tmp_path / "none")})[0] == {}
    assert spawn.real_credential({"ANTHROPIC_AUTH_TOKEN": "t", "CLAUDE_CONFIG_DIR": str(tmp_path)}) == (
        {"ANTHROPIC_AUTH_TOKEN": "t"},
        "the environment",
    )


def test_a_rate_limit_is_the_trees_and_no_cli_sees_a_529(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    """A 429 with retry-after 2, then three 529s (the CLI gives up on its third): the gateway waits them out, the agent ends done."""
    steps = [{"error": 429, "times": 1, "retry_after": 2, "text": "after the 429"}, {"error": 529, "times": 3, "text": "after the 529s"}]
    task = mock_task("limited", [{"bash": "true", **steps[0]}, steps[1]])
    done = run_spawn(["--task", task, "--tools", "Bash", "--max-budget-usd", "1"], gateway_env(env), timeout=180)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    main = [r for r in mock_model.requests() if r.get("kind") == "main"]
    statuses = [r["status"] for r in main]
    assert statuses.count(429) == 1 and statuses.count(529) == 3
    limited = next(r for r in main if r["status"] == 429)
    after = next(r for r in main if r["time"] > limited["time"])
    assert after["time"] - limited["time"] >= 2.0  # retry-after honoured, once, by the gateway
    # The CLI's own retries would carry x-stainless-retry-count; it sent each step once.
    assert all(not r.get("retry") for r in main)
    (outcome,) = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert outcome["status"] == "done" and outcome["text"] == "after the 529s"


FAN_OUT = 16
RETRY_AFTER_S = 3
# The gateway learns of the rate limit a moment after the scripted model logged it: a call it had
# already sent in that moment is no fault of its own.
RATE_LIMIT_NEWS_S = 0.5


def fan_out_bash(count: int, leaf: str) -> str:
    """A root's Bash: `count` background leaves with the same task, started at once, then `wait --all`."""
    start = spawn_in_bash("--task", leaf, "--tools", "Read", "--background", "--print", "id")
    return f'd=$(mktemp -d); for i in $(seq {count}); do {start} > "$d/$i" & done; wait; {spawn_in_bash("wait", "--all")} $(cat "$d"/*)'


@pytest.mark.parametrize("status", [429, 529])
def test_a_fan_out_meets_a_rate_limit_and_the_gateway_holds_every_call_until_retry_after(
    env: dict[str, str], session_root: Path, mock_model: MockModel, status: int
) -> None:
    """16 leaves with one task: the first leaf call meets a 429 (or 529) with retry-after 3 at t. Nothing reaches the
    model in (t, t+3), no CLI sees it (a CLI gives up on its third 529), and every leaf ends done."""
    # "times" counts per task: the leaves share theirs, so one call of the whole fan-out is limited.
    leaf = mock_task("fan-out leaf", [{"error": status, "times": 1, "retry_after": RETRY_AFTER_S, "text": "leaf done"}])
    root = mock_task("root", [{"bash": fan_out_bash(FAN_OUT, leaf), "timeout": 300_000}, {"text": "root done"}])
    # Two start slots, as on CI's two cores: the leaves' first calls come one after another, so most come after t.
    slotted = {**gateway_env(env), "SPAWN_START_SLOTS": "2"}
    done = run_spawn(["--task", root, "--tools", "Bash,Read"], slotted, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    calls = [r for r in mock_model.requests() if r["path"].startswith("/v1/messages")]
    limited = [r for r in calls if r["status"] == status]
    assert len(limited) == 1, [r["status"] for r in calls]
    t = limited[0]["time"]
    early = [(round(r["time"] - t, 3), r["kind"], r["reply"]) for r in calls if t + RATE_LIMIT_NEWS_S <= r["time"] < t + RETRY_AFTER_S]
    assert not early, f"calls reached the model before retry-after passed: {early}"
    # The leaves' calls are the ones without Bash (each leaf's facts make its task text its own).
    held = [r for r in calls if r.get("first") and "Bash" not in r["tools"] and r["time"] >= t + RETRY_AFTER_S]
    assert len(held) >= FAN_OUT // 2, "too few leaves asked after the rate limit for the hold to show"
    # A CLI's own retries carry x-stainless-retry-count: none saw the error, so none retried.
    assert not [r for r in calls if r.get("retry")], "a CLI saw the rate limit and retried"
    outcomes = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert len(outcomes) == FAN_OUT + 1
    assert [o["status"] for o in outcomes] == ["done"] * len(outcomes), [o.get("reason") for o in outcomes]
    assert sum(o.get("text") == "leaf done" for o in outcomes) == FAN_OUT


def cli_request(system_text: str, task: str, model: str = "claude-sonnet-4-5", ttl: str | None = None) -> dict[str, Any]:
    """A request shaped as the CLI sends it: tools unmarked, a billing line, then system blocks it marks."""
    marker: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return {
        "model": model,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.329.590;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": marker},
            {"type": "text", "text": system_text, "cache_control": marker},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": task, "cache_control": {"type": "ephemeral"}}]}],
    }


def test_the_cacheable_head_is_the_model_tools_and_system_up_to_their_last_breakpoint() -> None:
    head = spawn.cache_head(cli_request("briefing", "task one"))
    assert head is not None and head[1] == 300.0
    assert spawn.cache_head(cli_request("briefing", "another task")) == head  # the messages are each agent's own
    assert spawn.cache_head(cli_request("another briefing", "task one")) != head
    assert spawn.cache_head(cli_request("briefing", "task one", model="claude-opus-4-1")) != head
    assert spawn.cache_head(cli_request("briefing", "task one", ttl="1h")) == (head[0], 3600.0)  # a marker is no content
    unmarked = cli_request("briefing", "task one")
    for block in unmarked["system"]:
        block.pop("cache_control", None)
    assert spawn.cache_head(unmarked) is None  # only the message is marked: no head a sibling could read
    assert spawn.cache_head({"model": "m", "system": "plain"}) is None


def test_a_call_waits_only_while_its_head_is_being_written() -> None:
    role = spawn.stagger_role
    assert role(10.0, 0.0, writing=False) == "write"  # first of its head: it goes, the others wait for it
    assert role(10.0, 0.0, writing=True) == "wait"
    assert role(10.0, 310.0, writing=True) == "read"  # answered within its TTL: straight through
    assert role(400.0, 310.0, writing=False) == "write"  # expired: written again
    limit = spawn.stagger_limit
    assert limit({}) == spawn.STAGGER_WAIT_S and limit({"SPAWN_GATEWAY_STAGGER_S": "0"}) == 0.0
    assert limit({"SPAWN_GATEWAY_STAGGER_S": "2.5"}) == 2.5 and limit({"SPAWN_GATEWAY_STAGGER_S": "x"}) == spawn.STAGGER_WAIT_S
    assert limit({"SPAWN_GATEWAY_STAGGER_S": "nan"}) == spawn.STAGGER_WAIT_S


def test_the_stagger_hands_the_head_on_when_its_writer_fails_and_never_waits_past_its_bound(tmp_path: Path) -> None:
    import asyncio

    body = cli_request("briefing", "task")
    gw = spawn.Gateway(tmp_path, {}, "http://upstream", {"SPAWN_GATEWAY_STAGGER_S": "1"})

    async def scenario() -> None:
        first = await spawn.stagger(gw, body, None)
        assert first is not None and first.writer is not None
        second = asyncio.ensure_future(spawn.stagger(gw, body, None))
        third = asyncio.ensure_future(spawn.stagger(gw, body, None))
        await asyncio.sleep(0.1)
        assert not second.done() and not third.done()  # held while the first writes
        spawn.head_released(gw, first)  # it failed before answering: one of the others writes instead
        turns = [await second, await third]
        writers = [t for t in turns if t is not None and t.writer is not None]
        assert len(writers) == 1
        spawn.head_answered(gw, writers[0])
        later = await spawn.stagger(gw, body, None)
        assert later is not None and later.writer is None  # answered: straight through
        # A writer that never answers holds the others for the bound only, and never past a deadline.
        other = cli_request("other briefing", "task")
        stuck = await spawn.stagger(gw, other, None)
        assert stuck is not None and stuck.writer is not None
        started = time.monotonic()
        assert (await spawn.stagger(gw, other, None)) is not None
        assert 0.9 <= time.monotonic() - started < 3
        started = time.monotonic()
        await spawn.stagger(gw, other, time.time() + 0.2)
        assert time.monotonic() - started < 0.8

    asyncio.run(scenario())
    off = spawn.Gateway(tmp_path, {}, "http://upstream", {"SPAWN_GATEWAY_STAGGER_S": "0"})
    assert asyncio.run(spawn.stagger(off, body, None)) is None


STAGGER_LEAVES = 8
LEAF_ANSWER_S = 2.0  # each leaf's model answers after this: long enough for its siblings to catch it writing


def test_leaves_with_one_head_wait_for_the_first_to_start_answering_and_read_the_head(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    """8 leaves started at once (no start slots) with one tools-and-system head: the scripted model sends the first
    leaf call's first byte before any other leaf call arrives, and the others read the head from the cache."""
    # One task for all: the CLI's billing line in the system prompt takes characters of the task.
    leaf = mock_task("stagger leaf", [{"text": "leaf done", "sleep": LEAF_ANSWER_S}])
    root = mock_task("root", [{"bash": fan_out_bash(STAGGER_LEAVES, leaf), "timeout": 300_000}, {"text": "root done"}])
    unslotted = {**gateway_env(env), "SPAWN_START_SLOTS": "0"}
    done = run_spawn(["--task", root, "--tools", "Bash,Read"], unslotted, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    firsts = [r for r in mock_model.requests() if r.get("first") and "Bash" not in r["tools"] and r["status"] == 200]
    firsts.sort(key=lambda r: r["time"])
    assert len(firsts) == STAGGER_LEAVES and len({r["system_digest"] for r in firsts}) == 1
    # Logged as it answers, LEAF_ANSWER_S after it arrived: the first's record is its first byte.
    writer = firsts[0]
    early = [round(r["time"] - LEAF_ANSWER_S - writer["time"], 3) for r in firsts[1:] if r["time"] - LEAF_ANSWER_S < writer["time"]]
    assert not early, f"leaf calls arrived before the first one answered (seconds after it): {early}"
    reading = [r for r in firsts if r["usage"]["cache_read_input_tokens"] >= r["head_tokens"] > 0]
    assert len(reading) == STAGGER_LEAVES - 1, [r["usage"] for r in firsts]
    outcomes = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert [o["status"] for o in outcomes] == ["done"] * (STAGGER_LEAVES + 1), [o.get("reason") for o in outcomes]


# ------------------------------------------------------------ in-process agents --


def agent_call(prompt: str, subagent_type: str = "general-purpose") -> dict[str, Any]:
    call = {"description": "delegate", "prompt": prompt, "subagent_type": subagent_type, "run_in_background": False}
    return {"tool": "Agent", "input": call}


def epoch(iso: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_in_process_agents_are_metered_as_themselves_and_held_to_their_hosts_budget(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    """root -> L1 -> L2 in the root's CLI (--placement inprocess), L2 spending four 20,000-token turns, under $0.5 (fail)."""
    budget = 0.5
    middle = mock_task("middle", [agent_call(heavy("deep")), {"text": "middle done"}])
    root = mock_task("root", [agent_call(middle), {"text": "root done"}])
    args = ["--task", root, "--tools", "Agent,Bash", "--placement", "inprocess", "--max-depth", "3", "--max-budget-usd", str(budget)]
    done = run_spawn(args, env, timeout=240)
    chain = {load(d / "meta.json")["depth"]: d for d in agent_dirs(session_root)}
    assert sorted(chain) == [0, 1, 2], done.stderr[-2000:]
    root_id, deep_id = chain[0].name, chain[2].name
    lines = ledger_lines(session_root)
    spends = [line for line in lines if line.get("kind") == "spend"]
    # Each call is charged to the agent that made it, inside its host's hold.
    deep = [line for line in spends if line["id"] == deep_id]
    assert deep and all(line["host"] == root_id for line in deep), spends
    assert all(line.get("host") is None for line in spends if line["id"] == root_id)
    state = spawn.ledger_state([json.dumps(line) for line in lines])
    served = served_usd(mock_model)
    assert served > 0.3 and state.spent == pytest.approx(served, rel=0.01)
    assert state.spent <= budget + 1e-6
    refused = [line for line in lines if line.get("kind") == "refused"]
    assert refused and refused[0]["id"] == deep_id and refused[0]["reason"].startswith("budget:"), lines
    deep_outcome = load(chain[2] / "outcome.json")
    assert deep_outcome["status"] == "failed" and deep_outcome["reason"] == refused[0]["reason"], deep_outcome
    # The agents above it go on with what is left (their own calls are small), or fail at their own refusal.
    root_outcome = load(chain[0] / "outcome.json")
    expected = spawn.ExitCode.OK if root_outcome["status"] == "done" else spawn.ExitCode.AGENT_FAILED
    assert done.returncode == expected and (root_outcome["status"] == "done" or "budget" in root_outcome["reason"]), done.stderr[-2000:]
    # Ended promptly once the hold ran out: no poll of a tool call, no idle wait.
    assert epoch(root_outcome["ended_at"]) - epoch(refused[0]["time"]) < 10
    assert deep_outcome["cost_usd"] == pytest.approx(state.spends[deep_id], abs=1e-6)
    # Each agent's own cost, once: the tree's sum is what was served.
    costs = [load(d / "outcome.json").get("cost_usd") or 0.0 for d in chain.values()]
    assert sum(costs) == pytest.approx(served, rel=0.01)
    # status --json lists each agent's calls as the ledger has them, under the agent that made them
    # (not its host), and they sum to its cost.
    listed = run_spawn(["status", "--json", str(chain[0].parent.parent)], env)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "status.json").read_text())).validate(data)
    rows = {row["id"]: row for row in data["agents"]}
    keys = ("time", "model", "usage", "cost_usd", "status", "duration_s", "ttfb_s")
    for agent_dir in chain.values():
        mine = [{k: line[k] for k in keys if k in line} for line in spends if line["id"] == agent_dir.name]
        assert mine and rows[agent_dir.name]["model_calls"] == mine, agent_dir.name
    deep_calls = rows[deep_id]["model_calls"]
    assert sum(c["cost_usd"] for c in deep_calls) == pytest.approx(deep_outcome["cost_usd"], abs=1e-5)
    assert all(c["status"] == "200" and c["usage"]["input_tokens"] + c["usage"]["cache_creation_input_tokens"] > 0 for c in deep_calls)
    assert all(0 <= c["ttfb_s"] <= c["duration_s"] for c in deep_calls)


def test_an_in_process_agents_own_budget_holds_at_its_model_calls(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path
) -> None:
    """A depth-2 in-process agent whose definition gives it $0.1 spends at most that; the tree goes on."""
    write_agent(tmp_path, "thrifty", "description: small budget\nmax_budget_usd: 0.1\ntools: Bash")
    middle = mock_task("middle", [agent_call(heavy("thrifty one"), "thrifty"), {"text": "middle done"}])
    root = mock_task("root", [agent_call(middle), {"text": "root done"}])
    args = ["--task", root, "--tools", "Agent,Bash", "--placement", "inprocess", "--max-depth", "3", "--max-budget-usd", "5"]
    done = run_spawn([*args, "--cwd", str(tmp_path)], env, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    chain = {load(d / "meta.json")["depth"]: d for d in agent_dirs(session_root)}
    thrifty = load(chain[2] / "outcome.json")
    state = spawn.ledger_state([json.dumps(line) for line in ledger_lines(session_root)])
    assert 0.05 < state.spends[chain[2].name] <= 0.1 + 1e-6, state.spends
    assert thrifty["status"] == "failed" and "budget" in thrifty["reason"], thrifty
    assert state.refusals[chain[2].name].startswith("budget: agent"), state.refusals


def test_the_gateway_is_on_under_a_budget_and_off_where_it_can_not_hold_one() -> None:
    choice = spawn.gateway_choice
    assert choice({}, 1.0) == (True, None)
    assert choice({}, None) == (False, None)  # nothing to hold: no gateway, nothing soft
    assert choice({"SPAWN_GATEWAY": "1"}, None) == (True, None)  # for its per-call records
    assert choice({"SPAWN_GATEWAY": "0"}, 1.0) == (False, "SPAWN_GATEWAY=0")
    assert choice({"SPAWN_GATEWAY": "0"}, None) == (False, None)
    for provider in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"):
        start, soft = choice({provider: "1", "SPAWN_GATEWAY": "1"}, 1.0)
        assert not start and soft is not None and provider in soft
    assert choice({"CLAUDE_CODE_USE_BEDROCK": "0"}, 1.0) == (True, None)


def test_the_gateway_listens_on_loopback_unless_the_tree_is_placed_on_a_cluster() -> None:
    """Placed on Ray, it listens where this host reaches the cluster's head, so that every node reaches it."""
    for policy in (None, "local", "auto", "inprocess", "ray:", "ray:no-such-host.invalid:6379"):
        assert spawn.gateway_listen(policy) == "127.0.0.1", policy
    assert spawn.gateway_listen("ray:127.0.0.1:6379") == "127.0.0.1"
    outward = "127.0.0.1"  # a machine with no route there: loopback
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.1", 6379))  # nothing is sent: the interface the route picks
        outward = probe.getsockname()[0]
    assert spawn.gateway_listen("ray:10.255.255.1:6379") == outward


def test_a_budget_without_the_gateway_is_declared_soft_at_the_root_and_in_each_outcome(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    leaf = mock_task("leaf", [{"text": "leaf done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Read")}, {"text": "root done"}])
    tools = "Bash,Read"
    done = run_spawn(["--task", root, "--tools", tools, "--max-budget-usd", "1"], {**env, "SPAWN_GATEWAY": "0"})
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "budget: soft" in line]
    assert warned == [line for line in warned if line.startswith("spawn: warning: budget: soft (SPAWN_GATEWAY=0)")] and len(warned) == 1
    outcomes = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert len(outcomes) == 2 and all(any("budget: soft" in w for w in o["warnings"]) for o in outcomes)
    assert not list(session_root.glob("*/gateway/credentials/*"))
    # With the gateway (the default under a budget): none of that.
    again = run_spawn(["--task", mock_task("again", [{"text": "done"}]), "--max-budget-usd", "1"], env)
    assert again.returncode == spawn.ExitCode.OK and "budget: soft" not in again.stderr, again.stderr


def test_when_the_gateway_dies_each_agent_fails_saying_so_and_nothing_goes_unmetered(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    task = mock_task("orphaned", [{"bash": "sleep 4"}, {"text": "never answered"}])
    proc = start_spawn(["--task", task, "--tools", "Bash", "--max-budget-usd", "1"], env)
    assert wait_until(lambda: any(session_root.glob("*/gateway/gateway.json")), 60), "no gateway started"
    (record,) = session_root.glob("*/gateway/gateway.json")
    assert wait_until(lambda: any(r.get("kind") == "main" for r in mock_model.requests()), 60)
    os.kill(json.loads(record.read_text())["pid"], signal.SIGKILL)
    seen = len(mock_model.requests())
    code, _, err = finish(proc, timeout=60)  # at once: the CLI would retry the refused connection for minutes
    assert code == spawn.ExitCode.AGENT_FAILED, err[-2000:]
    (outcome,) = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    assert outcome["status"] == "failed" and outcome["reason"].startswith("model gateway: the tree's gateway (pid "), outcome
    assert len(mock_model.requests()) == seen  # no call went around it
    # Killed, it could not take its record and socket with it: its root did.
    assert not list(session_root.glob("*/gateway/gateway.json")) and not list(session_root.glob("*/gateway/control.sock"))


def test_a_cap_on_calls_at_once_holds_for_the_tree(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    """SPAWN_GATEWAY_MAX_CALLS=1: three leaves streaming at the same time reach the model one after another."""
    leaves = [mock_task(f"capped leaf {n}", [{"text": f"leaf {n}", "filler": 2000, "stream_s": 1.5}]) for n in range(3)]
    flags = ("--tools", "Read", "--max-budget-usd", "0.5", "--background", "--print", "id")
    start = [spawn_in_bash("--task", leaf, *flags) + f" > ids{n} &" for n, leaf in enumerate(leaves)]
    bash = f"cd $(mktemp -d); {' '.join(start)} wait; {spawn_in_bash('wait', '--all')} $(cat ids*)"
    root = mock_task("root", [{"bash": bash}, {"text": "root done"}])
    capped = {**env, "SPAWN_GATEWAY_MAX_CALLS": "1"}
    done = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-budget-usd", "5"], capped, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    root_digest = next(r["task_digest"] for r in mock_model.requests() if r.get("kind") == "main")
    streamed = sorted(r["time"] for r in mock_model.requests() if r.get("kind") == "main" and r["task_digest"] != root_digest)
    assert len(streamed) == 3, (streamed, done.stderr[-2000:])
    # Each stream takes 1.5 s: one at a time, their records lie at least that far apart.
    assert all(b - a >= 1.4 for a, b in itertools.pairwise(streamed)), streamed


def test_an_in_process_agent_under_pause_is_held_at_its_request_until_a_raise(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    """root -> L1 in the root's CLI under --on-budget pause: L1's request waits in the gateway, no call goes up, a raise resumes it."""
    root = mock_task("root", [agent_call(heavy("deep", turns=3)), {"text": "root done"}])
    args = ["--task", root, "--tools", "Agent,Bash", "--placement", "inprocess", "--max-budget-usd", "0.5", "--on-budget", "pause"]
    proc = start_spawn(args, env)
    assert wait_until(lambda: any(session_root.glob("*/agents/a1-*/paused.json")), 120), "the in-process agent never paused"
    (paused,) = session_root.glob("*/agents/a1-*/paused.json")
    session = paused.parent.parent.parent
    seen = len(mock_model.requests())
    time.sleep(1.5)
    assert paused.exists() and len(mock_model.requests()) == seen, "a request reached the model while paused"
    raised = run_spawn(["budget", str(session), "--raise", "2"], env)
    assert raised.returncode == spawn.ExitCode.OK, raised.stderr
    assert wait_until(functools.partial(gone, paused), 30), "the raise did not resume it"
    code, _, err = finish(proc)
    assert code == spawn.ExitCode.OK, err[-3000:]
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert [outcomes[d]["status"] for d in sorted(outcomes)] == ["done", "done"], outcomes
    state = spawn.ledger_state([json.dumps(line) for line in ledger_lines(session_root)])
    assert state.spent == pytest.approx(served_usd(mock_model), rel=0.01) and state.spent <= 2.5 + 1e-6
    # The gateway's pause, not the runner's turn check: no tool call waited on one.
    for d in agent_dirs(session_root):
        assert '"BudgetPaused"' not in (d / "transcript.jsonl").read_text()


CONCURRENT_CALLS = """
import json, os, sys, threading, urllib.request, urllib.error
results = []
def call(n):
    script = 'MOCK[{"text": "concurrent ' + str(n) + '", "stream_s": 1.0}]MOCK'
    body = {"model": "claude-opus-direct", "max_tokens": 32000, "stream": True, "messages": [{"role": "user", "content": script}]}
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
            results.append(reply.status)
    except urllib.error.HTTPError as exc:
        results.append(exc.code)
threads = [threading.Thread(target=call, args=(n,)) for n in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
open(sys.argv[1], "w").write(json.dumps(sorted(results)))
"""


def test_a_call_short_only_of_its_agents_calls_in_flight_waits_for_them(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path
) -> None:
    """Two calls at once, each asking for more output than the hold could pay twice over (as a CLI's turn and its
    side question do): the second waits for the first to be charged, and both are answered."""
    (tmp_path / "calls.py").write_text(CONCURRENT_CALLS)
    out = tmp_path / "statuses.json"
    root = mock_task("root", [{"bash": f'"$SPAWN_PYTHON" {tmp_path / "calls.py"} {out}'}, {"text": "root done"}])
    # $0.5: either call's 32,000 opus tokens take nearly all of it.
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "0.5"], env, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    assert json.loads(out.read_text()) == [200, 200]
    assert not [line for line in ledger_lines(session_root) if line.get("kind") == "refused"]


def test_the_gateway_believes_only_its_own_lines_of_money(tmp_path: Path) -> None:
    """Unit: lines anyone could append (a raise, a bigger hold, a spend moved elsewhere) move no hold's room."""
    session = tmp_path / "s"
    session.mkdir()
    gw = spawn.Gateway(session, {}, "http://127.0.0.1:9", {}, 1.0)

    def append(line: dict[str, Any]) -> None:
        spawn.append_ledger(session, {"time": "2026-01-01T00:00:00Z", **line}, [])

    append({"id": "root", "kind": "reserve", "amount_usd": 1.0})
    append({"id": "leaf", "kind": "reserve", "amount_usd": 0.3, "drawn_from": "root"})
    append(gw.sign({"id": "leaf", "kind": "spend", "cost_usd": 0.1, "time": "t"}))
    assert gw.room("leaf") == pytest.approx(0.2)
    assert gw.budget() == 1.0
    # What the leaf's own Bash could append, every way:
    append({"kind": "budget", "max_budget_usd": 100.0, "previous_usd": 1.0, "by": "leaf"})
    append({"id": "leaf", "kind": "reserve", "amount_usd": 100.0, "drawn_from": "root"})
    append({"id": "leaf", "kind": "reserve", "amount_usd": 100.0, "drawn_from": "root", "mac": "0" * 64})
    append({"id": "leaf", "kind": "reserve", "amount_usd": 100.0, "drawn_from": "root", "topped_up_usd": 99.7})
    append({"id": "leaf", "kind": "spend", "cost_usd": 0.0, "host": "root"})
    append({**gw.sign({"id": "root", "kind": "spend", "cost_usd": 0.0, "time": "t"}), "id": "leaf", "host": "root"})
    (session / "limits.json").write_text(json.dumps({"max_budget_usd": 100.0}))
    assert gw.budget() == 1.0
    assert gw.room("leaf") == pytest.approx(0.2)
    assert gw.overdrawn("leaf") is None
    assert gw.ledger.read().hosted == {}
    # Its own lines it believes: a raise it made, and the hold it grew from it.
    spawn.append_budget_change(session, 0.5, None, "person", [], authority=gw)
    assert gw.budget() == 1.5
    assert spawn.top_up_hold(session, "leaf", 0.25, [], gw) == pytest.approx(0.55)
    assert gw.room("leaf") == pytest.approx(0.45)
    assert spawn.top_up_hold(session, "leaf", 0.3, [], gw) is None  # past what was raised
    # A hold nobody admitted, drawn from the tree's budget: no call of the tree is granted.
    append({"id": "ghost", "kind": "reserve", "amount_usd": 5.0})
    assert "the tree's budget" in str(gw.overdrawn("leaf"))
    # A gateway started after these lines (a resumed tree's) believes them: they were the tree's before it.
    again = spawn.Gateway(session, {}, "http://127.0.0.1:9", {}, 1.0)
    assert again.budget() == 1.5


def test_overdrawn_names_the_hold_a_line_broke() -> None:
    """Unit: admission's holds fit in what they are drawn from; one that doesn't is named, up to the tree."""

    def state(*lines: dict[str, Any]) -> Any:
        return spawn.ledger_state([json.dumps(line) for line in lines])

    root = {"id": "r", "kind": "reserve", "amount_usd": 1.0}
    a = {"id": "a", "kind": "reserve", "amount_usd": 0.6, "drawn_from": "r"}
    b = {"id": "b", "kind": "reserve", "amount_usd": 0.4, "drawn_from": "a"}
    assert spawn.overdrawn(state(root, a, b), "b", 1.0) is None
    assert "agent a's hold" in str(spawn.overdrawn(state(root, a, b, {**b, "id": "c"}), "b", 1.0))
    # An ended child takes what it spent, at most its hold: its overrun is its own.
    ended = {"id": "b", "time": "t", "status": "done", "cost_usd": 0.9}
    assert spawn.overdrawn(state(root, a, b, ended, {**b, "id": "c", "amount_usd": 0.2}), "c", 1.0) is None
    assert "never had" in str(spawn.overdrawn(state(root, {**a, "drawn_from": "nobody"}), "a", 1.0))
    assert "tree's budget" in str(spawn.overdrawn(state(root, a), "a", 0.5))


FORGE = """
import json, os, socket, sys, time, urllib.request, urllib.error
session, me = os.environ["SPAWN_SESSION"], os.environ["SPAWN_AGENT_ID"]
out = open(sys.argv[1], "a")
now = time.strftime("%Y-%m-%dT%H:%M:%SZ")
forged = [
    {"time": now, "kind": "budget", "max_budget_usd": 100.0, "previous_usd": 1.0, "by": "me"},
    {"id": me, "time": now, "kind": "reserve", "amount_usd": 100.0},
    {"id": me, "time": now, "kind": "reserve", "amount_usd": 100.0, "topped_up_usd": 99.7, "mac": "0" * 64},
    {"id": me, "time": now, "kind": "spend", "cost_usd": 0.0, "host": "nobody"},
]
with open(os.path.join(session, "ledger.jsonl"), "a") as ledger:
    ledger.write("".join(json.dumps(line) + "\\n" for line in forged))
with open(os.path.join(session, "limits.json"), "w") as limits:
    limits.write(json.dumps({"max_budget_usd": 100.0}))
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
os.chdir(os.path.join(session, "gateway"))
client.connect("control.sock")
client.sendall(json.dumps({"raise_usd": 100.0, "by": "me"}).encode() + b"\\n")
out.write(client.makefile().readline())
script = 'MOCK[{"text": "direct", "filler": 20000}]MOCK'
for n in range(3):
    body = {"model": "claude-opus-direct", "max_tokens": 32000, "tools": [{"name": "Bash"}],
            "messages": [{"role": "user", "content": script}]}
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            out.write(json.dumps({"status": reply.status}) + "\\n")
    except urllib.error.HTTPError as exc:
        out.write(json.dumps({"status": exc.code}) + "\\n")
"""


def test_a_raise_reaches_the_gateway_only_from_outside_the_tree(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path
) -> None:
    """A leaf appends a raise, a bigger hold and a moved spend to the ledger, rewrites limits.json and asks the gateway's
    control socket for a raise: its calls are still held to its hold, and the tree to its budget."""
    (tmp_path / "forge.py").write_text(FORGE)
    out = tmp_path / "forged.jsonl"
    leaf = mock_task("leaf", [{"bash": f'"$SPAWN_PYTHON" {tmp_path / "forge.py"} {out}'}, {"text": "leaf done"}])
    # Unsandboxed: inside its sandbox, the session's files are read-only to it.
    child = spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.3", "--sandbox", "off")
    root = mock_task("root", [{"bash": child}, {"text": "root done"}])
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1"], env, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    answer, *calls = (json.loads(line) for line in out.read_text().splitlines())
    assert answer["error"] == "refused" and "runs in this tree" in answer["message"], answer
    assert calls[0]["status"] == 200 and calls[-1]["status"] == 403, calls
    lines = ledger_lines(session_root)
    leaf_id = next(d.name for d in agent_dirs(session_root) if d.name.startswith("a1-"))
    metered = sum(line["cost_usd"] for line in lines if line.get("kind") == "spend" and line["id"] == leaf_id and "mac" in line)
    assert 0.1 < metered <= 0.3 + 1e-6
    assert sum(line["cost_usd"] for line in lines if line.get("kind") == "spend" and "mac" in line) <= 1.0 + 1e-6
    (attempts,) = session_root.glob("*/budget.attempts.jsonl")
    assert "runs in this tree" in attempts.read_text()
    # Stopped with its tree, the gateway took its record and its socket with it.
    assert not list(session_root.glob("*/gateway/gateway.json")) and not list(session_root.glob("*/gateway/control.sock"))


def test_the_gateways_upstream_keeps_connections_and_sends_again_on_one_the_server_closed() -> None:
    """Unit: a kept connection carries the next call; one the server closed meanwhile is replaced, the call not lost."""
    import asyncio

    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            body = await reader.readexactly(length)
            answer = b"data: " + body + b"\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in (answer[:5], answer[5:]):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            if body == b"last":  # then close the kept connection, as a server's idle timeout does
                writer.close()
                return

    async def call(upstream: Any, body: bytes) -> tuple[int, bytes, str | None]:
        response = await upstream.send("POST", "/v1/messages", {"x-api-key": "k", "content-length": "999"}, body)
        got = b"".join([chunk async for chunk in response.aiter_raw()])
        await response.aclose()
        return response.status_code, got, response.headers.get("Content-Type")

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = spawn.Upstream(f"http://127.0.0.1:{port}", {})
        assert await call(upstream, b"one") == (200, b"data: one\n\n", "text/event-stream")
        assert await call(upstream, b"last") == (200, b"data: last\n\n", "text/event-stream")
        assert connections == [0]  # the second call went on the first call's connection
        await asyncio.sleep(0.1)
        assert await call(upstream, b"again") == (200, b"data: again\n\n", "text/event-stream")
        assert connections == [0, 1]
        await upstream.aclose()
        server.close()

    asyncio.run(main())


def test_the_gateway_speaks_through_the_environments_proxy_with_httpx() -> None:
    """Unit: an upstream the environment routes through a proxy is httpx's (it speaks to proxies); else the gateway's own."""
    api = "https://api.anthropic.com"
    assert not spawn.proxied(api, {"PATH": "/bin"})
    assert spawn.proxied(api, {"HTTPS_PROXY": "http://proxy.corp:3128"})
    assert spawn.proxied(api, {"all_proxy": "socks5://proxy.corp:1080"})
    assert not spawn.proxied(api, {"HTTP_PROXY": "http://proxy.corp:3128"})  # another scheme's
    assert not spawn.proxied(api, {"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "localhost,api.anthropic.com"})
    assert not spawn.proxied("http://127.0.0.1:8080", {"HTTP_PROXY": "http://proxy.corp:3128", "no_proxy": "127.0.0.1"})


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed")
def test_a_new_pid_namespace_hides_no_caller_from_the_gateway(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path
) -> None:
    """A leaf at its depth limit runs, under `unshare -Urpf --mount-proc` (its ancestry hidden from what it starts there),
    `spawn.py budget --raise` on its own tree and a new tree of its own: the gateway refuses the raise (it walks the
    caller's real ancestry and cgroup), and every call of the new tree is charged to the leaf and held to its hold."""
    probe = subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no user and pid namespaces: {probe.stderr.decode().strip()}")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "inner-task").write_text(heavy("inner"))
    # Its Bash can rewrite its own environment too: what spawn.py reads of it is gone as well.
    forget = 'P="$SPAWN_PYTHON" S="$SPAWN_PY" SESSION="$SPAWN_SESSION"; for v in $(compgen -e | grep "^SPAWN_"); do unset "$v"; done; '
    hide = 'unshare -Urpf --mount-proc "$P" "$S"'
    bash = forget + (
        f'{hide} budget "$SESSION" --raise 100 > {out}/raise.out 2>&1; echo $? > {out}/raise.code; '
        f'SPAWN_SESSION_ROOT={out}/sessions {hide} --task "$(cat {tmp_path}/inner-task)" --tools Bash > {out}/inner.out 2>&1; '
        f"echo $? > {out}/inner.code"
    )
    leaf = mock_task("leaf", [{"bash": bash}, {"text": "leaf done"}])
    child = spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.3", "--sandbox", "off", "--max-depth", "1")
    root = mock_task("root", [{"bash": child}, {"text": "root done"}])
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1"], env, timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    assert int((out / "raise.code").read_text()) == spawn.ExitCode.REFUSED, (out / "raise.out").read_text()
    assert "runs in this tree" in (out / "raise.out").read_text()  # said by the gateway: the caller's own walk sees no tree
    assert int((out / "inner.code").read_text()) != spawn.ExitCode.OK, (out / "inner.out").read_text()
    (ledger,) = session_root.glob("*/ledger.jsonl")
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert not [line for line in lines if line.get("kind") == "budget"]
    leaf_id = next(d.name for d in agent_dirs(session_root) if d.name.startswith("a1-"))
    spends = [line for line in lines if line.get("kind") == "spend"]
    inner = [line for line in spends if line["id"] == leaf_id and line["usage"]["output_tokens"] > 1000]
    assert inner, "the new tree's heavy turns were not charged to the leaf"
    assert sum(line["cost_usd"] for line in spends if line["id"] == leaf_id) <= 0.3 + 1e-6
    assert any(line.get("kind") == "refused" and line["id"] == leaf_id for line in lines)
    real = hashlib.sha256(FAKE_API_KEY.encode()).hexdigest()[:12]
    assert {r["credential"] for r in mock_model.requests() if r["path"].startswith("/v1/messages")} == {real}


def test_in_tree_cgroup_names_a_process_in_the_trees_cgroup_or_below(tmp_path: Path) -> None:
    """Unit, on real cgroups: what the gateway asks of a caller that its ancestry can't place (it left the tree's process tree)."""
    here = spawn.own_cgroup()
    if here is None or not os.access(here / "cgroup.procs", os.W_OK):
        pytest.skip("no writable cgroup v2 here: the tree has no cgroup, and ancestry alone decides (docs/guarantees.md)")
    tree = here / f"spawn-test-{os.getpid()}"
    tree.mkdir()
    (tree / "below").mkdir()
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        (tree / "cgroup.procs").write_text(f"{sleepers[0].pid}\n")
        (tree / "below" / "cgroup.procs").write_text(f"{sleepers[1].pid}\n")
        assert spawn.process_cgroup(sleepers[0].pid) == tree
        assert spawn.in_tree_cgroup(sleepers[1].pid, [here / "spawn-other", tree]) == tree
        assert spawn.in_tree_cgroup(sleepers[0].pid, [tree]) == tree
        assert spawn.in_tree_cgroup(sleepers[2].pid, [tree]) is None  # outside: the person's terminal
        assert spawn.in_tree_cgroup(sleepers[1].pid, []) is None  # trees with no cgroup of their own
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        for folder in (tree / "below", tree):
            with contextlib.suppress(OSError):
                folder.rmdir()

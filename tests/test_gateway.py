"""The tree's model gateway: every agent's calls metered where they are spent, held to its hold, with no real credential below the root."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_API_KEY, MockModel, agent_dirs, load, mock_task, run_spawn, spawn_in_bash, start_spawn, wait_until

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
out.write(json.dumps(dict(os.environ)) + "\\n")
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
"""


def test_an_agents_bash_holds_no_real_credential_and_its_direct_calls_are_metered(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path
) -> None:
    out = tmp_path / "found.jsonl"
    (tmp_path / "direct.py").write_text(DIRECT_CALLS)
    # An unsandboxed leaf: it runs as the user, and still finds only its own credential.
    bash = f'"$SPAWN_PYTHON" {tmp_path / "direct.py"} {out}'
    leaf = mock_task("leaf", [{"bash": bash}, {"text": "leaf done"}])
    child = spawn_in_bash("--task", leaf, "--tools", "Bash", "--max-budget-usd", "0.3", "--sandbox", "off")
    root = mock_task("root", [{"bash": child}, {"text": "root done"}])
    done = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1"], gateway_env(env), timeout=240)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    found = [json.loads(line) for line in out.read_text().splitlines()]
    environ, calls = found[0], found[1:]
    assert FAKE_API_KEY not in json.dumps(environ)
    assert environ["ANTHROPIC_API_KEY"].startswith("sk-spawn-")
    # The first call is cut to what the leaf's hold can pay; then nothing is left: refused.
    assert calls[0] == {"status": 200, "stop": "max_tokens"} and calls[-1] == {"status": 403}
    lines = ledger_lines(session_root)
    leaf_id = next(d.name for d in agent_dirs(session_root) if d.name.startswith("a1-"))
    direct = [line for line in lines if line.get("kind") == "spend" and line.get("model") == "claude-opus-direct"]
    assert direct and {line["id"] for line in direct} == {leaf_id}
    state = spawn.ledger_state([json.dumps(line) for line in lines])
    assert (state.cost(leaf_id) or 0.0) <= 0.3 + 1e-6
    real = hashlib.sha256(FAKE_API_KEY.encode()).hexdigest()[:12]
    assert {r["credential"] for r in mock_model.requests() if r["path"].startswith("/v1/messages")} == {real}


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

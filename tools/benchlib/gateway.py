"""P11: time to first byte through the tree's model gateway over direct to the scripted model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from mock_model import mock_task

import spawn

from .core import SPAWN, Target, fmt, median

# P11: time to first byte through the tree's gateway over direct to the scripted
# model, with GATEWAY_STREAMS concurrent streams of GATEWAY_TOKENS output tokens
# spread over GATEWAY_STREAM_S each, the two sides interleaved round by round.
GATEWAY_STREAMS = 16
GATEWAY_TOKENS = 20_000
# 2,000 tokens a second a stream: twenty times the API's pace, so the gateway's share of a
# core is a ceiling for a real tree's.
GATEWAY_STREAM_S = 10.0
# The scripted model's time to its first byte, as the API's is for a turn of an agent's size
# (hundreds of ms and up): the ratio then says what the gateway adds to a model call, not to
# a loopback hop of a millisecond. The added milliseconds are printed beside it.
GATEWAY_FIRST_BYTE_S = 0.5
TARGET_GATEWAY_RATIO = 1.05
GATEWAY_CPU_AIM = 0.05  # of a core, while streaming
GATEWAY_RSS_AIM_MB = 60.0


def first_byte_s(url: str, key: str, task: str) -> float:
    """Seconds to the first body byte of one streamed /v1/messages answer; the rest is read and dropped."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"model": "claude-sonnet-5-5", "max_tokens": 32000, "stream": True, "tools": [{"name": "Bash"}],
                       "messages": [{"role": "user", "content": task}]})  # fmt: skip
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)
    started = time.monotonic()
    conn.request("POST", "/v1/messages", body=body, headers={"content-type": "application/json", "x-api-key": key})
    response = conn.getresponse()
    response.read(1)
    first = time.monotonic() - started
    while response.read(1 << 16):
        pass
    conn.close()
    return first


def stream_into(results: list[float], url: str, key: str, task: str) -> None:
    results.append(first_byte_s(url, key, task))


def gateway_rounds(mock_url: str, workdir: Path, rounds: int, streams: int = GATEWAY_STREAMS) -> Target:
    """P11: a gateway (spawn.py _gateway) for a session without a budget, and streams through it and direct, interleaved."""
    import psutil

    session = workdir / "p11-session"
    (session / "agents").mkdir(parents=True, exist_ok=True)
    agent_key = spawn.mint_credential(session, "a0-bench")
    env = {**os.environ, "ANTHROPIC_BASE_URL": mock_url, "ANTHROPIC_API_KEY": "sk-ant-bench-0000000000000000"}
    gateway = subprocess.Popen(
        [sys.executable, str(SPAWN), "_gateway", str(session)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert gateway.stdin is not None and gateway.stdout is not None
    gateway.stdin.write(json.dumps({"credential": {"ANTHROPIC_API_KEY": env["ANTHROPIC_API_KEY"]}, "upstream": mock_url}).encode() + b"\n")
    gateway.stdin.close()
    url = gateway.stdout.readline().decode().strip()
    task = mock_task("p11", [{"text": "stream", "filler": GATEWAY_TOKENS, "stream_s": GATEWAY_STREAM_S, "sleep": GATEWAY_FIRST_BYTE_S}])
    sides: dict[str, list[float]] = {"gateway": [], "direct": []}
    # The first call through a new gateway pays its one-time set-up (a tree's first call, once): not measured.
    first_byte_s(url, agent_key, mock_task("p11-warm", [{"text": "warm"}]))
    process = psutil.Process(gateway.pid)
    cpu_before, rss_peak, busy_s = process.cpu_times(), 0, 0.0
    try:
        for n in range(rounds):
            for side in ("gateway", "direct") if n % 2 == 0 else ("direct", "gateway"):
                target, key = (url, agent_key) if side == "gateway" else (mock_url, env["ANTHROPIC_API_KEY"])
                results: list[float] = []
                threads = [threading.Thread(target=stream_into, args=(results, target, key, task)) for _ in range(streams)]
                started = time.monotonic()
                for thread in threads:
                    thread.start()
                while any(t.is_alive() for t in threads):
                    rss_peak = max(rss_peak, process.memory_info().rss) if side == "gateway" else rss_peak
                    time.sleep(0.05)
                if side == "gateway":
                    busy_s += time.monotonic() - started
                sides[side].append(median(results))
        cpu_after = process.cpu_times()
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)
    cpu_share = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / busy_s if busy_s else math.nan
    ratio = median(sides["gateway"]) / median(sides["direct"])
    added = [g - d for g, d in zip(sides["gateway"], sides["direct"], strict=True)]
    print(
        f"P11: {streams} streams of {GATEWAY_TOKENS} tokens over {GATEWAY_STREAM_S:g} s, first byte after {GATEWAY_FIRST_BYTE_S:g} s; "
        f"time to first byte, medians of {rounds} rounds: "
        f"gateway {fmt(median(sides['gateway']) * 1000, 'ms')}, direct {fmt(median(sides['direct']) * 1000, 'ms')}, "
        f"added {fmt(median(added) * 1000, 'ms')} (rounds {', '.join(fmt(a * 1000, 'ms') for a in added)}); "
        f"gateway CPU {cpu_share:.1%} of a core while streaming (aim < {GATEWAY_CPU_AIM:.0%}), "
        f"peak RSS {rss_peak / 1e6:.1f} MB (aim < {GATEWAY_RSS_AIM_MB:g} MB)",
        flush=True,
    )
    return Target("time to first byte, through the gateway / direct", ratio, TARGET_GATEWAY_RATIO, "x", "P11", "bench --only-gateway")

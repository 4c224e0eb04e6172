"""P3 through tools/mcp_server.py over stdio: spawn_agent's start and agent_wait's latency."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mock_model import mock_task

from .clocks import MarkerClock, psutil_clock_offset
from .core import SPAWN, WAIT_AGENT_SLEEP_S, BenchError


def mcp_samples(env: Mapping[str, str], workdir: Path, count: int, timeout: float) -> dict[str, Any]:
    """tools/mcp_server.py over stdio: spawn_agent -> the agent's process started, and agent_wait's latency.

    Start: from the spawn_agent call to the runner's create_time in meta.json (the
    kernel's start time, 10 ms resolution). Latency: the .done marker's mtime to
    agent_wait's result arriving, to compare with `spawn.py wait`'s.
    """
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=[str(SPAWN.parent / "tools" / "mcp_server.py"), "--python", sys.executable],
        env=dict(env),
        cwd=str(workdir),
    )
    starts: list[float] = []
    latencies: list[float] = []
    from_created: list[float] = []
    offset = psutil_clock_offset()

    async def run() -> None:
        async with Client(params, read_timeout_seconds=timeout) as client:
            for i in range(count + 1):  # the first is a warm-up
                task = mock_task(f"bench mcp sample {i}", [{"text": "waited", "sleep": WAIT_AGENT_SLEEP_S}])
                called = time.time()
                started = await client.call_tool("spawn_agent", {"task": task, "tools": ["Read"]})
                data = started.structured_content or {}
                if started.is_error or "agent_dir" not in data:
                    raise BenchError(f"spawn_agent failed: {started.content}")
                agent_dir = Path(str(data["agent_dir"]))
                clock = MarkerClock(agent_dir)
                waited = await client.call_tool("agent_wait", {"agent_ids": [data["agent_id"]], "timeout_s": 50})
                returned = time.time_ns()
                if waited.is_error or (waited.structured_content or {}).get("status") != "done":
                    raise BenchError(f"agent_wait: {waited.content}")
                if i:
                    meta = json.loads((agent_dir / "meta.json").read_text())
                    starts.append((float(meta["create_time"]) - offset - called) * 1000)
                    latencies.append((returned - (agent_dir / ".done").stat().st_mtime_ns) / 1e6)
                    if clock.seen_ns is not None:
                        from_created.append((returned - clock.seen_ns) / 1e6)

    asyncio.run(run())
    return {"spawn_to_process_ms": starts, "agent_wait_latency_ms": latencies, "agent_wait_from_created_ms": from_created}

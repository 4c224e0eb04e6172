"""The tree's model gateway: every agent's model calls pass through it, metered where they are spent.

The root's runner starts one per tree (start_gateway) before its own CLI,
hands it the real credential on a pipe, and removes that credential from
its own environment, so no agent below inherits it. Every agent's CLI gets
ANTHROPIC_BASE_URL at the gateway and a credential of its own (mint_credential,
by the agent's runner after admission); the session keeps only the
credential's sha256, so a file an agent reads names no credential.

Per request, the gateway (serve_gateway, in its own process: its imports of
uvicorn and httpx are paid there, never on a leaf's path):
- names the agent by its credential (401 for one it never minted);
- under a tree budget, checks the request against the agent's hold
  (hold_plan): the input priced high, plus an output allowance it enforces
  by lowering the request's max_tokens; a request its hold can't pay for is
  refused (`--on-budget fail`) or held, with no upstream call, until a raise
  covers it (`pause`);
- passes the answer through chunk by chunk and prices it from the API's own
  usage (message_start, then the final message_delta: input, output, cache
  reads, cache writes), or, for a stream cut short, the input side and the
  output deltas' bytes / 4;
- appends a `spend` line to the ledger for it (ledger.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import CACHE_READ_FACTOR, CACHE_WRITE_1H_FACTOR, CACHE_WRITE_FACTOR, MODEL_PRICES_USD_PER_MTOK, USAGE_COUNTS
from ..core.pure import float_or_none, price_family, round_usd, utc_now_iso
from ..session.ledger import append_ledger, read_ledger, top_up_hold
from ..session.protocol import read_json, read_limits, session_lock, write_json_atomic
from ..supervise.supervisor import Supervised

GATEWAY_DIR = "gateway"  # in the session: gateway.json and credentials/
GATEWAY_RECORD = "gateway.json"  # {url, pid}: where the tree's gateway listens
CREDENTIALS_DIR = "credentials"  # one file per minted credential, named by its sha256, holding the agent id
ENV_GATEWAY_PRICES = "SPAWN_GATEWAY_PRICES"  # JSON {family: [input, output] USD per Mtok}: overrides the pinned table
# 1: the root starts the tree's gateway. Off by default while it is new: a
# tree without one keeps its budget from what each CLI reports (soft).
ENV_GATEWAY = "SPAWN_GATEWAY"
REAL_CREDENTIAL_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
DEFAULT_UPSTREAM = "https://api.anthropic.com"
# The input side is priced before the answer says what it was: from the
# request's bytes, at a rate no tokenizer beats (3 bytes a token; the API's
# tokens average about 4), all of it as a 5-minute cache write (the dearest
# input but the hour-long write, which spawn.py's agents don't ask for).
INPUT_BYTES_PER_TOKEN = 3
# An output allowance smaller than this is no turn: the request is refused (or held).
MIN_OUTPUT_TOKENS = 256
CUT_BYTES_PER_TOKEN = 4  # a cut stream's output: its deltas' bytes at this rate
GATEWAY_PAUSE_POLL_S = 0.5
SETTLE_WAIT_S = 3.0
RATE_RETRIES = 8  # a call the API rate-limits is sent again this often before its 429 is passed on
RATE_BACKOFF_MAX_S = (
    30.0  # the longest wait between tries without a retry-after  # a runner waits this long for its agent's last calls to be charged
)


# ------------------------------------------------------------------- pure --


def credential_digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def price_table(environ: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """The pinned per-family price table, with SPAWN_GATEWAY_PRICES's overrides (bad entries are ignored)."""
    table = dict(MODEL_PRICES_USD_PER_MTOK)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        for family, pair in json.loads(environ.get(ENV_GATEWAY_PRICES) or "{}").items():
            price_in, price_out = (float(v) for v in pair)
            if math.isfinite(price_in) and math.isfinite(price_out) and price_in >= 0 and price_out >= 0:
                table[str(family)] = (price_in, price_out)
    return table


def family_prices(model: str, table: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    exact = table.get(model)
    return exact if exact is not None else table.get(price_family(model), MODEL_PRICES_USD_PER_MTOK[price_family(model)])


def price_usage(model: str, usage: Mapping[str, Any], table: Mapping[str, tuple[float, float]]) -> float:
    """USD for one request's usage: input, cache reads (0.1x), cache writes (1.25x, 2x for an hour), output."""

    def count(source: Any, key: str) -> float:
        value = source.get(key) if isinstance(source, Mapping) else None
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0

    price_in, price_out = family_prices(model, table)
    written = count(usage, "cache_creation_input_tokens")
    one_hour = min(count(usage.get("cache_creation"), "ephemeral_1h_input_tokens"), written)
    read_in = count(usage, "input_tokens") + CACHE_READ_FACTOR * count(usage, "cache_read_input_tokens")
    read_in += CACHE_WRITE_FACTOR * (written - one_hour) + CACHE_WRITE_1H_FACTOR * one_hour
    return (read_in * price_in + count(usage, "output_tokens") * price_out) / 1e6


def hold_plan(
    room: float, body_bytes: int, model: str, max_tokens: int | None, table: Mapping[str, tuple[float, float]]
) -> tuple[int | None, float]:
    """(the max_tokens to forward, None: refuse; what the request can cost at most) for an agent with room USD left.

    The rule: the input is priced high (input_ceiling), and the output may take
    what is left, at most the request's own max_tokens. So a request's cost is
    at most its reservation unless its input is dearer than the ceiling.
    """
    price_in, price_out = family_prices(model, table)
    ceiling = input_ceiling(body_bytes, price_in)
    tokens = (room - ceiling) * 1e6 / price_out if price_out > 0 else math.inf
    allowance = math.floor(tokens) if math.isfinite(tokens) else (max_tokens or 1 << 20)
    if allowance < MIN_OUTPUT_TOKENS:
        return None, ceiling + MIN_OUTPUT_TOKENS * price_out / 1e6
    granted = allowance if max_tokens is None else min(max_tokens, allowance)
    return granted, ceiling + granted * price_out / 1e6


def input_ceiling(body_bytes: int, price_in: float) -> float:
    return math.ceil(body_bytes / INPUT_BYTES_PER_TOKEN) * CACHE_WRITE_FACTOR * price_in / 1e6


@dataclass
class StreamMeter:
    """The usage of one answer, read from the bytes passed through (SSE or one JSON body)."""

    usage: dict[str, Any] = field(default_factory=dict)
    output_bytes: int = 0
    final: bool = False
    """The answer's last usage (message_delta, or a whole JSON body) was seen."""
    buffer: bytes = b""
    model: str | None = None

    def feed_sse(self, chunk: bytes) -> None:
        self.buffer += chunk
        while b"\n\n" in self.buffer:
            frame, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if line.startswith(b"data:"):
                    with contextlib.suppress(ValueError):
                        self.event(json.loads(line[5:]))

    def event(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = data["message"]
            self.model = message.get("model") if isinstance(message.get("model"), str) else None
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            delta = data["delta"]
            self.output_bytes += len(str(delta.get("text") or delta.get("partial_json") or delta.get("thinking") or "").encode())
        elif kind == "message_delta" and isinstance(data.get("usage"), dict):
            self.usage.update(data["usage"])  # cumulative counts
            self.final = True

    def feed_json(self, body: bytes) -> None:
        with contextlib.suppress(ValueError):
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                self.usage.update(data["usage"])
                self.model = data.get("model") if isinstance(data.get("model"), str) else None
                self.final = True

    def served(self) -> dict[str, Any]:
        """The usage to charge: the API's, or for a stream cut short its input side and its deltas' bytes / 4."""
        usage = dict(self.usage)
        if not self.final and usage:
            usage["output_tokens"] = self.output_bytes // CUT_BYTES_PER_TOKEN
        return usage


def token_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(v) if isinstance(v := usage.get(k), int) and not isinstance(v, bool) and v > 0 else 0 for k in USAGE_COUNTS}


# ------------------------------------------------------- in every runner --


def gateway_url(session: Path) -> str | None:
    """The URL of the session's gateway, if the tree has one."""
    with contextlib.suppress(OSError, ValueError, Exception):
        record = read_json(session / GATEWAY_DIR / GATEWAY_RECORD)
        url = record.get("url")
        return url if isinstance(url, str) else None
    return None


def mint_credential(session: Path, agent_id: str) -> str:
    """A fresh credential for one agent's CLI: the session keeps its sha256, naming the agent."""
    # os.urandom, not secrets: every spawn imports this module, and secrets pulls in hmac and _hashlib.
    credential = "sk-spawn-" + os.urandom(32).hex()
    folder = session / GATEWAY_DIR / CREDENTIALS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / credential_digest(credential), {"id": agent_id})
    return credential


def gateway_environment(session: Path, agent_id: str) -> dict[str, str]:
    """ANTHROPIC_BASE_URL and the agent's own credential, when the tree has a gateway; else nothing."""
    url = gateway_url(session)
    if url is None:
        return {}
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": mint_credential(session, agent_id)}


def settle_agent(session: Path, agent_id: str) -> None:
    """Wait (briefly) until the gateway has charged every call of this agent (its CLI has ended)."""
    import urllib.request

    url = gateway_url(session)
    if url is None:
        return
    with contextlib.suppress(OSError, ValueError):
        request = urllib.request.Request(f"{url}/_spawn/settle?agent={agent_id}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=SETTLE_WAIT_S + 2) as reply:
            reply.read()


# ------------------------------------------------------------ in the root --


def wants_gateway(environ: Mapping[str, str], session: Path) -> bool:
    """A root starts one when asked (SPAWN_GATEWAY=1), unless the tree calls Bedrock or Vertex (soft budgets there), or one runs."""
    if environ.get(ENV_GATEWAY) != "1" or gateway_url(session) is not None:
        return False
    return not any(environ.get(v) in ("1", "true") for v in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"))


def start_gateway(session: Path, script: str) -> subprocess.Popen[bytes] | None:
    """Start the tree's gateway and hand it the real credential on its stdin; remove the credential from this process.

    It runs `spawn.py _gateway SESSION` in this process's cgroup and process
    group, so it ends with the tree; it prints its URL once it listens.
    """
    credential = {v: os.environ[v] for v in REAL_CREDENTIAL_VARS if os.environ.get(v)}
    upstream = os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_UPSTREAM
    env = {k: v for k, v in os.environ.items() if k not in REAL_CREDENTIAL_VARS}
    proc = subprocess.Popen(
        [sys.executable, script, "_gateway", str(session)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"credential": credential, "upstream": upstream}).encode() + b"\n")
    proc.stdin.close()
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("http://"):
        proc.wait()
        return None
    for name in REAL_CREDENTIAL_VARS:
        os.environ.pop(name, None)
    return proc


def stop_gateway(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    # Our own child, not yet reaped: Supervised's stop path, as every signal spawn.py sends.
    Supervised.signal_pid(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
        return
    Supervised.signal_pid(proc.pid, signal.SIGKILL)
    proc.wait()


# ------------------------------------------------------ the gateway itself --


@dataclass
class Inflight:
    """The calls the gateway is forwarding now (a docstring also spares dataclasses an import of inspect)."""

    count: int = 0
    reserved: float = 0.0


class Gateway:
    """The state of the running gateway: who is asking, what their calls hold, the ledger they are charged to."""

    def __init__(self, session: Path, credential: Mapping[str, str], upstream: str, environ: Mapping[str, str]) -> None:
        self.session = session
        self.credential = dict(credential)
        self.upstream = upstream.rstrip("/")
        self.table = price_table(environ)
        self.inflight: dict[str, Inflight] = {}
        self.client: Any = None
        self.not_before = 0.0
        """Monotonic time before which no call goes upstream: the last rate limit's retry-after, for the tree."""

    def agent_of(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get("x-api-key") or ""
        if not value and headers.get("authorization", "").lower().startswith("bearer "):
            value = headers["authorization"][7:]
        if not value:
            return None
        with contextlib.suppress(OSError, ValueError, Exception):
            record = read_json(self.session / GATEWAY_DIR / CREDENTIALS_DIR / credential_digest(value))
            agent = record.get("id")
            return agent if isinstance(agent, str) else None
        return None

    def room(self, agent: str) -> float | None:
        """USD the agent may still commit to: its hold less its own spend, its children's holds and its calls in flight."""
        if read_limits(self.session).max_budget_usd is None:
            return None
        ledger = read_ledger(self.session)
        if not ledger.live(agent):
            return None if agent not in ledger.holds else 0.0
        free = ledger.free(agent, 0.0, ledger.spends.get(agent, 0.0))
        return free - self.inflight.get(agent, Inflight()).reserved

    def upstream_headers(self, headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
        drop = {"host", "x-api-key", "authorization", "content-length", "connection", "accept-encoding"}
        out = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.decode("latin-1").lower() not in drop}
        if self.credential.get("ANTHROPIC_API_KEY"):
            out["x-api-key"] = self.credential["ANTHROPIC_API_KEY"]
        elif self.credential.get("ANTHROPIC_AUTH_TOKEN"):
            out["authorization"] = f"Bearer {self.credential['ANTHROPIC_AUTH_TOKEN']}"
        out["accept-encoding"] = "identity"  # the meter reads the bytes as they pass
        return out

    def charge(self, agent: str, model: str, call: Call) -> None:
        usage = call.meter.served()
        line = {
            "id": agent,
            "time": utc_now_iso(),
            "kind": "spend",
            "cost_usd": round_usd(price_usage(model, usage, self.table)) or 0.0,
            "usage": token_usage(usage),
            "model": model,
            "ttfb_s": round(call.ttfb, 3) if call.ttfb is not None else None,
            "duration_s": round(time.monotonic() - call.started, 3),
            "status": call.status,
        }
        append_ledger(self.session, {k: v for k, v in line.items() if v is not None}, [])

    def refuse(self, agent: str, reason: str) -> None:
        append_ledger(self.session, {"id": agent, "time": utc_now_iso(), "kind": "refused", "reason": reason}, [])


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def send_json(send: Any, status: int, payload: Mapping[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


def api_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": f"spawn.py gateway: {message}"}}


def draw_raise(gw: Gateway, agent: str, room: float, whole: float, minimum: float) -> bool:
    """Grow the agent's hold from what `budget` raised that no hold drew yet: by what the whole request needs, else its least."""
    for need in (whole, minimum):
        if need > room and top_up_hold(gw.session, agent, max(0.01, math.ceil((need - room) * 1e6) / 1e6), []) is not None:
            return True
    return False


async def wait_for_room(gw: Gateway, agent: str, need: float, whole: float) -> bool:
    """Under pause: hold the request (no upstream call) until a raise grows the agent's hold to cover it."""
    import asyncio

    paused = Path(gw.session) / "agents" / agent / "paused.json"
    ledger = await asyncio.to_thread(read_ledger, gw.session)
    hold = ledger.holds.get(agent, (None, 0.0))[1]
    room = await asyncio.to_thread(gw.room, agent)
    record = {
        "id": agent,
        "since": utc_now_iso(),
        "reason": "budget: its hold can't pay for its next model request; the gateway holds the request until a raise covers it",
        "spent_usd": round_usd(ledger.spends.get(agent, 0.0)) or 0.0,
        "hold_usd": round_usd(hold) or 0.0,
        "needed_usd": max(0.01, math.ceil((need - (room or 0.0)) * 1e6) / 1e6),
    }
    with contextlib.suppress(OSError):
        write_json_atomic(paused, record)
    try:
        while True:
            room = await asyncio.to_thread(gw.room, agent)
            if room is None or room + 1e-9 >= need:
                return True
            if not await asyncio.to_thread(draw_raise, gw, agent, room, whole, need):
                await asyncio.sleep(GATEWAY_PAUSE_POLL_S)
    finally:
        with contextlib.suppress(OSError):
            paused.unlink()


def on_budget_of(session: Path, agent: str) -> str:
    with contextlib.suppress(OSError, ValueError, Exception):
        value = read_json(session / "agents" / agent / "meta.json").get("on_budget")
        return value if isinstance(value, str) else "fail"
    return "fail"


async def handle(gw: Gateway, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
    """One request: the settle call of a runner, or an agent's call, held to its hold, passed through and charged."""
    import asyncio

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if scope["path"] == "/_spawn/settle":
        await settle(gw, scope, send)
        return
    agent = await asyncio.to_thread(gw.agent_of, headers)
    body = await read_body(receive)
    if agent is None:
        await send_json(send, 401, api_error("authentication_error", "this credential is no agent's of this tree"))
        return
    metered = scope["path"].rstrip("/") == "/v1/messages" and scope["method"] == "POST"
    reserved = 0.0
    if metered:
        held = await hold_request(gw, agent, body, send)
        if held is None:
            return
        body, reserved = held
    call = Call(agent, reserved, time.monotonic())
    inflight = gw.inflight.setdefault(agent, Inflight())
    inflight.count += 1
    inflight.reserved += reserved
    try:
        await forward(gw, scope, body, call, receive=receive, send=send)
    finally:
        inflight.count -= 1
        inflight.reserved -= reserved
        if metered and call.meter.usage:
            model = call.meter.model or str(parse_object(body).get("model") or "")
            await asyncio.to_thread(gw.charge, agent, model, call)


async def settle(gw: Gateway, scope: Mapping[str, Any], send: Any) -> None:
    """A runner's wait for its agent's calls in flight to end and be charged (its CLI has ended)."""
    import asyncio

    query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
    agent = query.get("agent", "")
    limit = time.monotonic() + SETTLE_WAIT_S
    while gw.inflight.get(agent, Inflight()).count and time.monotonic() < limit:
        await asyncio.sleep(0.05)
    await send_json(send, 200, {"settled": not gw.inflight.get(agent, Inflight()).count})


def parse_object(body: bytes) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        parsed = json.loads(body) if body else {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


async def hold_request(gw: Gateway, agent: str, body: bytes, send: Any) -> tuple[bytes, float] | None:
    """(the body to forward, what it holds of the agent's room), or None once refused (the answer is sent)."""
    import asyncio

    room = await asyncio.to_thread(gw.room, agent)
    if room is None:
        return body, 0.0
    request = parse_object(body)
    model = str(request.get("model") or "")
    max_tokens = request.get("max_tokens") if isinstance(request.get("max_tokens"), int) else None
    granted, reserved = hold_plan(room, len(body), model, max_tokens, gw.table)
    if granted is None or (max_tokens is not None and granted < max_tokens):
        # Short of the whole request: a raise not yet drawn pays for it, at once (as under pause).
        _, whole = hold_plan(math.inf, len(body), model, max_tokens, gw.table)
        price_in, price_out = family_prices(model, gw.table)
        # The least hold_plan grants, and a micro-dollar more: so that a room this big surely grants it.
        minimum = input_ceiling(len(body), price_in) + MIN_OUTPUT_TOKENS * price_out / 1e6 + 1e-6
        pause = granted is None and await asyncio.to_thread(on_budget_of, gw.session, agent) == "pause"
        if await asyncio.to_thread(draw_raise, gw, agent, room, whole, minimum) or pause:
            while True:
                room = await asyncio.to_thread(gw.room, agent)
                granted, reserved = hold_plan(math.inf if room is None else room, len(body), model, max_tokens, gw.table)
                if granted is not None or not pause:
                    break
                await wait_for_room(gw, agent, minimum, whole)
    if granted is None:
        left = max(room or 0.0, 0.0)
        why = f"budget: agent {agent}'s hold has ${left:.4f} left, less than its next model request can cost (${reserved:.4f})"
        await asyncio.to_thread(gw.refuse, agent, why)
        await send_json(send, 403, api_error("permission_error", why))
        return None
    if granted != max_tokens:
        request["max_tokens"] = granted
        body = json.dumps(request).encode()
    return body, reserved


@dataclass
class Call:
    """One model call in flight: whose, what it holds, and what its answer has said so far."""

    agent: str
    reserved: float
    started: float
    meter: StreamMeter = field(default_factory=StreamMeter)
    ttfb: float | None = None
    status: str = "error"


async def forward(gw: Gateway, scope: Mapping[str, Any], body: bytes, call: Call, *, receive: Any, send: Any) -> None:
    """Pass the call upstream and its answer back, chunk by chunk as it comes; stop when the caller leaves."""
    import asyncio

    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    response = None
    try:
        response = await send_upstream(gw, scope, body, gone)
        if response is None:
            await send_json(send, 502, api_error("api_error", "upstream unreachable"))
            return
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        dropped = ("content-length", "transfer-encoding", "connection", "content-encoding")
        out_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items() if k.lower() not in dropped]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
        call.status = "cut"
        whole = b""
        async for chunk in response.aiter_raw():
            if call.ttfb is None:
                call.ttfb = time.monotonic() - call.started
            if is_sse:
                call.meter.feed_sse(chunk)
            else:
                whole += chunk
            if gone.is_set():
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            call.status = str(response.status_code)
            await send({"type": "http.response.body", "body": b""})
        if not is_sse and response.status_code == 200:
            call.meter.feed_json(whole)
    finally:
        watcher.cancel()
        if response is not None:
            await response.aclose()


async def send_upstream(gw: Gateway, scope: Mapping[str, Any], body: bytes, gone: Any) -> Any:
    """The upstream response, once it is not a rate limit (429) or an overload (529); None when unreachable.

    Such an answer is the tree's, not the caller's: its retry-after (else a
    backoff) holds every call of the tree, and the call is sent again when it
    passes, so each CLI waits instead of hammering, and none sees a 529 (the
    CLI gives up after its third).
    """
    import asyncio

    path = scope["path"] + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
    headers = gw.upstream_headers(scope["headers"])
    for attempt in range(RATE_RETRIES + 1):
        while (wait := gw.not_before - time.monotonic()) > 0:
            await asyncio.sleep(min(wait, GATEWAY_PAUSE_POLL_S))
        try:
            response = await gw.client.send(
                gw.client.build_request(scope["method"], gw.upstream + path, headers=headers, content=body), stream=True
            )
        except Exception:
            return None
        if response.status_code not in (429, 529) or attempt == RATE_RETRIES or gone.is_set():
            return response
        await response.aclose()
        delay = float_or_none(response.headers.get("retry-after")) or min(RATE_BACKOFF_MAX_S, 2.0**attempt)
        gw.not_before = max(gw.not_before, time.monotonic() + delay)
    return None


async def exit_with_parent(server: Any) -> None:
    """The gateway lives as long as the root's runner: once that is gone (even SIGKILLed), no call is served."""
    import asyncio

    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(GATEWAY_PAUSE_POLL_S)
    server.should_exit = True


def serve_gateway(session: Path) -> int:
    """`spawn.py _gateway SESSION`: read the credential from stdin, listen on loopback, print the URL, serve until SIGTERM."""
    import asyncio
    import socket

    import httpx
    import uvicorn

    handed = json.loads(sys.stdin.readline() or "{}")
    sys.stdin.close()
    gw = Gateway(session, handed.get("credential") or {}, handed.get("upstream") or DEFAULT_UPSTREAM, os.environ)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # before the URL is printed: a caller connects at once, before uvicorn has started
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def app(scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await handle(gw, scope, receive, send)

    async def main() -> None:
        gw.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=httpx.Limits(max_connections=None))
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        folder = session / GATEWAY_DIR
        folder.mkdir(parents=True, exist_ok=True)
        with session_lock(session):
            write_json_atomic(folder / GATEWAY_RECORD, {"url": url, "pid": os.getpid()})
        sys.stdout.write(url + "\n")
        sys.stdout.flush()
        orphaned = asyncio.ensure_future(exit_with_parent(server))
        try:
            await server.serve(sockets=[sock])
        finally:
            with contextlib.suppress(OSError):
                (folder / GATEWAY_RECORD).unlink()
            orphaned.cancel()
            await gw.client.aclose()

    asyncio.run(main())
    return 0

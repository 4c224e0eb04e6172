#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = []
#
# [tool.uv]
# exclude-newer = "2026-11-01T00:00:00Z"
# ///
"""Scripted stand-in for the Anthropic Messages API.

Point the real ``claude`` CLI at this server (``ANTHROPIC_BASE_URL``) and it
runs complete agent loops offline, deterministically and for free: every model
response comes from a script of *steps* instead of a model.

Choosing the script (from the task text = all text of the first user message):

1. Inline: the ``[`` of the first ``MOCK[`` in the task text opens a JSON
   array of steps, conventionally closed by ``]MOCK``, e.g.
   ``MOCK[{"bash": "echo hi"}, {"text": "finished"}]MOCK``.
2. Otherwise a scenario file (``--scenario FILE``)::

       {"rules": [{"match": "<python regex>", "steps": [...]}, ...],
        "default": [...]}

   The first rule whose regex ``re.search``-es the task text wins, then
   ``default``, then the single step ``{"text": "ok"}``.

The step answered is the number of assistant messages already in the request,
so the server keeps no conversation state. Past the last step it answers
``"done"``. Step kinds (one model response each):

- ``{"text": "..."}``: a text reply, stop_reason ``end_turn``.
- ``{"tool": "Name", "input": {...}}``: one tool_use (optionally preceded by a
  ``"text"`` block), stop_reason ``tool_use``.
- ``{"bash": "cmd"}``: shorthand for the ``Bash`` tool (optional ``"timeout"``
  in ms).
- ``{"structured": {...}}``: shorthand for the ``StructuredOutput`` tool that
  the CLI offers under ``--json-schema``.
- ``{"error": 529}``: an HTTP error with the API's error body; with
  ``"times": N`` only the first N attempts fail and later ones fall through
  to the rest of the step. ``"retry_after": S`` adds a ``retry-after`` header.
- Modifiers on any step: ``"sleep": SECONDS`` (delay before answering; alone
  it answers ``"slept"``), ``"usage": {"input_tokens": N,
  "output_tokens": M}``, ``"filler": N`` (N tokens of filler text after the
  step's text: heavy output that is really sent) and ``"stream_s": SECONDS``
  (a streamed answer's events spread evenly over that time, so a client sees
  chunks arrive; a stream its client leaves logs a second record, reply
  ``stream_cut``, whose usage is what was served: the input side, and the
  deltas' bytes sent / 4 as output).
- As the API does, an answer longer than the request's ``max_tokens`` is cut
  there (its text, no tool call, stop_reason ``max_tokens``).

Each log record names the credential the request carried (``credential``:
12 hex digits of the sha256 of its ``x-api-key``, else its bearer token),
never the credential itself.

Attempts of a ``"times"`` step are counted per task and step, where the task
is the text up to the end of its inline script (or up to spawn.py's
``## spawn.py: this agent`` facts): an agent started again for the same task
counts on, whatever id or deadline it was given.

Usage and the prompt cache: ``usage`` reports tokens as bytes / 4, and models
the Messages API's prompt caching (see the "prompt cache" section): the
``cache_control`` breakpoints in tools, system and messages, a prefix cache
per model with the 5-minute or 1-hour TTL, readable once the request that
wrote it starts answering (so a burst of identical requests all miss), and
``cache_creation_input_tokens`` / ``cache_read_input_tokens`` beside
``input_tokens`` (the three add up to the prompt blocks' bytes / 4), in the
non-streamed answer and in the streamed message_start and message_delta.
``--no-cache`` reports no cache reads or writes and counts the whole body
(the shape before caching was modelled); ``--cache-min-tokens N`` models the API's minimum cacheable length
(off by default). The cache's clock is the server's monotonic clock plus an
offset that ``POST /_mock/clock {"advance": SECONDS}`` moves forward
(``Served.advance_clock``), so tests see a TTL expire without waiting.

Observed CLI 2.1.330 behaviour worth knowing when writing scripts:
a StructuredOutput tool_use ends the run at once (no follow-up request);
errors are retried with backoff of about 0.5s, 1s, 2s, 4s... (count set by
``CLAUDE_CODE_MAX_RETRIES``, default 10) but a 529 gives up after 3 attempts
in all; ``retry-after`` is honoured only in whole seconds; and an HTTP 400
makes the CLI retry with features stripped, so a malformed script shows up as
several 400s in the log. Subagents (the Agent tool) run as separate main loops
whose task text is the Agent prompt, and are started in the background.

Run::

    python3 tools/mock_model.py --port 0 --port-file port.txt \\
        --scenario scenario.json --log requests.jsonl

It prints ``mock_model listening on http://127.0.0.1:PORT`` once listening and
exits 0 on SIGTERM/SIGINT. With ``--log`` every request appends one JSON line
(see ``log_record``: sizes, digests of tools and system, the usage answered)
for tests and benchmarks to inspect; ``--log-bodies`` adds each whole body.

From Python (the tests, bench, soak and demo)::

    with mock_model.serve(workdir, scenario) as served:
        env["ANTHROPIC_BASE_URL"] = served.url
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, cast

# ---------------------------------------------------------------- constants

MARKER = "MOCK["
# The header spawn.py puts above an agent's own facts, after its task in the
# first user message (tests check it is spawn.py's): see script_key.
AGENT_FACTS_HEADER = "## spawn.py: this agent"
DEFAULT_STEPS: list[dict[str, Any]] = [{"text": "ok"}]
PAST_END_TEXT = "done"
SLEPT_TEXT = "slept"
SIDE_TEXT = "ok"
STRUCTURED_TOOL = "StructuredOutput"
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
STEP_KEYS = frozenset(
    {
        "text",
        "tool",
        "input",
        "bash",
        "timeout",
        "structured",
        "sleep",
        "error",
        "times",
        "usage",
        "retry_after",
        "stream_s",
        "filler",
    }
)
# Small enough that multi-chunk tool input is exercised on ordinary commands,
# which is how the real API streams input_json_delta.
JSON_CHUNK = 40
# A long text streams in pieces of this many bytes, as the API's deltas come (a
# few tokens each on the API; bigger here so that 20k tokens stay a few hundred events).
TEXT_CHUNK = 400
SLEEP_POLL = 0.1
MAX_BODY = 64 * 1024 * 1024


# ---------------------------------------------------------------- records


class ScriptError(ValueError):
    """A script, step or scenario is malformed (reported as HTTP 400)."""


@dataclass(frozen=True)
class Step:
    """One normalised scripted model response."""

    text: str | None = None
    tool: str | None = None
    tool_input: dict[str, Any] = field(default_factory=dict)
    sleep: float = 0.0
    error: int | None = None
    times: int | None = None
    retry_after: float | None = None
    usage: dict[str, int] | None = None
    stream_s: float = 0.0
    """A streamed answer's events are spread evenly over this many seconds (0: written at once)."""
    filler: int = 0
    """Output tokens of filler text after the step's text (BYTES_PER_TOKEN bytes each): heavy output that is really sent."""


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    steps: list[dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    rules: tuple[Rule, ...] = ()
    default: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Reply:
    """What the server decided to send for one /v1/messages request."""

    status: int
    body: dict[str, Any]
    summary: str
    headers: tuple[tuple[str, str], ...] = ()
    cache_writes: tuple[tuple[str, float], ...] = ()
    """(prefix key, TTL seconds) the prompt cache stores once the answer starts."""
    stream_s: float = 0.0
    """A streamed answer's events are spread over this many seconds."""


# ---------------------------------------------------------------- pure core


def task_text(messages: Sequence[Any]) -> str:
    """All text of the first user message; the CLI's system-reminder blocks
    ride along, which is harmless because scripts are found by marker/regex."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        parts: list[str] = []
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
        return "\n".join(parts)
    return ""


def task_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def script_key(text: str) -> str:
    """What scripted errors count their attempts by: the task, without what differs between its runs.

    spawn.py follows the task with the agent's own facts (its id, deadline,
    time left, budget), so an agent started again for the same task (a dag
    retry) sends other text. The key is the text up to the end of its inline
    script, or else up to the facts' header, so the run after a failure
    counts on from the run before, as ``"times"`` means.
    """
    start = text.find(MARKER)
    if start >= 0:
        with contextlib.suppress(json.JSONDecodeError):
            _, end = json.JSONDecoder().raw_decode(text, start + len(MARKER) - 1)
            return task_digest(text[:end])
    facts = text.find(AGENT_FACTS_HEADER)
    return task_digest(text if facts < 0 else text[:facts].rstrip())


def extract_inline_script(text: str) -> list[dict[str, Any]] | None:
    """Steps from the first ``MOCK[`` marker, or None when there is none.

    raw_decode stops at the end of the array, so quoted JSON (and even a
    literal ``]MOCK``) inside step strings cannot end the script early.
    """
    start = text.find(MARKER)
    if start < 0:
        return None
    array_at = start + len(MARKER) - 1
    try:
        value, _ = json.JSONDecoder().raw_decode(text, array_at)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"inline MOCK script is not valid JSON: {exc}") from exc
    return _check_steps(value, "inline MOCK script")


def _check_steps(value: object, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise ScriptError(f"{where} must be a JSON array of objects")
    return cast(list[dict[str, Any]], value)


def parse_scenario(data: object) -> Scenario:
    if not isinstance(data, dict):
        raise ScriptError("scenario must be a JSON object")
    unknown = set(data) - {"rules", "default"}
    if unknown:
        raise ScriptError(f"scenario has unknown keys: {sorted(unknown)}")
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        raise ScriptError("scenario 'rules' must be a list")
    rules: list[Rule] = []
    for i, raw in enumerate(raw_rules):
        if not isinstance(raw, dict) or not isinstance(raw.get("match"), str):
            raise ScriptError(f"rule {i} needs a string 'match'")
        try:
            pattern = re.compile(raw["match"])
        except re.error as exc:
            raise ScriptError(f"rule {i} has a bad regex: {exc}") from exc
        rules.append(Rule(pattern, _check_steps(raw.get("steps"), f"rule {i} steps")))
    default = data.get("default")
    if default is not None:
        default = _check_steps(default, "scenario default")
    return Scenario(tuple(rules), default)


def select_script(text: str, scenario: Scenario) -> list[dict[str, Any]]:
    inline = extract_inline_script(text)
    if inline is not None:
        return inline
    for rule in scenario.rules:
        if rule.pattern.search(text):
            return rule.steps
    return scenario.default if scenario.default is not None else DEFAULT_STEPS


def step_index(messages: Sequence[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def is_main_request(request: dict[str, Any]) -> bool:
    """Whether a /v1/messages request is the agent's own loop.

    Observed with CLI 2.1.330: main-loop requests (top level and subagents,
    with or without tools, thinking on or off) always carry
    ``context_management`` and usually a non-empty ``tools``. The helper
    queries (e.g. the session-title request the SDK's streaming mode makes
    concurrently with the first turn) send ``tools: []``, no
    ``context_management`` and ask for JSON via ``output_config.format``,
    which the main loop never uses (``--json-schema`` goes through the
    StructuredOutput tool instead).
    """
    if response_schema(request) is not None:
        return False
    return bool(request.get("tools")) or "context_management" in request


def response_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request demands via ``output_config.format``."""
    config = request.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return schema if isinstance(schema, dict) else {}
    return None


def schema_example(schema: object) -> object:
    """A minimal value satisfying simple schemas, so side queries that parse
    their JSON reply (the session title) get something well-formed."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = required if isinstance(required, list) else list(props)
        return {str(n): schema_example(props.get(n, {"type": "string"})) for n in names}
    examples: dict[str, object] = {
        "string": "mock",
        "integer": 0,
        "number": 0,
        "boolean": False,
        "array": [],
    }
    return examples.get(str(kind))


def side_text(request: dict[str, Any]) -> str:
    schema = response_schema(request)
    return SIDE_TEXT if schema is None else json.dumps(schema_example(schema))


def _number(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ScriptError(f"step key {key!r} must be a non-negative number")
    return float(value)


def normalise_step(raw: dict[str, Any]) -> Step:
    unknown = set(raw) - STEP_KEYS
    if unknown:
        raise ScriptError(f"step has unknown keys {sorted(unknown)}: {raw}")
    text = raw.get("text")
    if text is not None and not isinstance(text, str):
        raise ScriptError("step 'text' must be a string")
    tool: str | None = None
    tool_input: dict[str, Any] = {}
    kinds = [k for k in ("tool", "bash", "structured") if k in raw]
    if len(kinds) > 1:
        raise ScriptError(f"step mixes {kinds}; use one tool per step")
    if "tool" in raw:
        tool = raw["tool"]
        tool_input = raw.get("input", {})
        if not isinstance(tool, str) or not isinstance(tool_input, dict):
            raise ScriptError("'tool' must be a string and 'input' an object")
    elif "bash" in raw:
        if not isinstance(raw["bash"], str):
            raise ScriptError("'bash' must be a command string")
        tool = "Bash"
        tool_input = {"command": raw["bash"], "description": "scripted"}
        timeout = _number(raw, "timeout")
        if timeout is not None:
            tool_input["timeout"] = int(timeout)
    elif "structured" in raw:
        if not isinstance(raw["structured"], dict):
            raise ScriptError("'structured' must be an object")
        tool = STRUCTURED_TOOL
        tool_input = raw["structured"]
    error = raw.get("error")
    if error is not None and (isinstance(error, bool) or not isinstance(error, int)):
        raise ScriptError("'error' must be an HTTP status code")
    times = _number(raw, "times")
    usage = raw.get("usage")
    if usage is not None and not (isinstance(usage, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in usage.values())):
        raise ScriptError("'usage' must map names to integers")
    return Step(
        text=text,
        tool=tool,
        tool_input=tool_input,
        sleep=_number(raw, "sleep") or 0.0,
        error=error,
        times=None if times is None else int(times),
        retry_after=_number(raw, "retry_after"),
        usage=cast("dict[str, int] | None", usage),
        stream_s=_number(raw, "stream_s") or 0.0,
        filler=int(_number(raw, "filler") or 0),
    )


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def estimate_tokens(size: int) -> int:
    return max(1, size // BYTES_PER_TOKEN)


# ---------------------------------------------------------------- prompt cache
# The Messages API's prompt caching, as its documentation describes it. A
# request is one sequence of blocks: its tools, then its system blocks, then
# its messages' content blocks. A block carrying ``cache_control`` (at most
# four; a top-level ``cache_control`` marks the last block) is a breakpoint:
# the prefix up to and including it is stored, per model, for its TTL
# ("5m", the default, or "1h"), refreshed by every read. At each breakpoint
# the API looks for the longest stored prefix ending there or up to 20 blocks
# before; what it finds is read, what lies between it and the last breakpoint
# is written, and what follows the last breakpoint is plain input. A prefix
# becomes readable once the request that wrote it starts answering, so a
# burst of identical requests all miss. Token counts are bytes / 4 of the
# prompt's blocks (each as compact JSON), split into read, written and plain
# input; the request's envelope (model, metadata, max_tokens...) is not
# prompt, and the API does not count it. With caching off, input_tokens is
# the whole body's bytes / 4, as before caching was modelled.
# The API's minimum cacheable length (1,024 to 4,096 tokens by model) is not
# modelled unless --cache-min-tokens asks for it: scripted prompts are short.

BYTES_PER_TOKEN = 4
INPUT_USAGE_KEYS = frozenset({"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"})
CACHE_TTL_S: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4  # the API answers 400 to a fifth cache_control
LOOKBACK_BLOCKS = 20  # how far before a breakpoint the API looks for a stored prefix
CLOCK_ROUTE = "/_mock/clock"  # tests move the cache's clock: POST {"advance": seconds}


@dataclass(frozen=True)
class PrefixBlock:
    """One block of a request's cacheable sequence (tools, system, messages)."""

    key: str
    """Digest of the model and every block up to and including this one."""
    end: int
    """Bytes of the prefix through this block."""
    ttl: float | None
    """Seconds this prefix is kept, when the block is a breakpoint."""


@dataclass(frozen=True)
class CachePlan:
    """What one request reads from and writes to the prompt cache, in bytes."""

    read: int = 0
    written: dict[str, int] = field(default_factory=dict)
    """Bytes written per TTL name ("5m", "1h")."""
    writes: tuple[tuple[str, float], ...] = ()
    """(prefix key, TTL seconds) to store once the answer starts."""
    cached_end: int = 0
    """Bytes up to the last breakpoint (read + written)."""
    read_key: str | None = None
    """The stored prefix read, which the read keeps alive."""
    prompt: int = 0
    """Bytes of all the prompt's blocks; 0: count the whole request body (caching off)."""


NO_CACHE = CachePlan()


def cache_ttl(control: object) -> float | None:
    """The TTL a ``cache_control`` value asks for, None when there is none."""
    if control is None:
        return None
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise ScriptError(f"cache_control must be {{'type': 'ephemeral'}}, got {control!r}")
    ttl = control.get("ttl", "5m")
    if ttl not in CACHE_TTL_S:
        raise ScriptError(f"cache_control ttl must be one of {sorted(CACHE_TTL_S)}, got {ttl!r}")
    return CACHE_TTL_S[str(ttl)]


def _cacheable_blocks(request: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(place, block) for every block of the cached sequence, in the API's order."""
    blocks: list[tuple[str, dict[str, Any]]] = []
    tools = request.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            blocks.append(("tool", tool))
    system = request.get("system")
    if isinstance(system, str):
        blocks.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        blocks += [("system", b) for b in system if isinstance(b, dict)]
    messages = request.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        # The place names the message, so moving a block across a turn boundary changes the prefix.
        place = f"message {i} {message.get('role')}"
        if isinstance(content, str):
            blocks.append((place, {"type": "text", "text": content}))
        elif isinstance(content, list):
            blocks += [(place, b) for b in content if isinstance(b, dict)]
    return blocks


def _compact(block: Mapping[str, Any]) -> bytes:
    """A block as the cache counts and compares it: compact JSON, without its marker
    (the same block with or without cache_control is the same prefix)."""
    content = {k: v for k, v in block.items() if k != "cache_control"}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def prefix_blocks(request: Mapping[str, Any]) -> list[PrefixBlock]:
    """The request's cacheable sequence with each prefix's key, size and TTL."""
    found = _cacheable_blocks(request)
    automatic = cache_ttl(request.get("cache_control"))
    chain = hashlib.sha256(str(request.get("model", "")).encode())
    out: list[PrefixBlock] = []
    end = 0
    for n, (place, block) in enumerate(found):
        raw = _compact(block)
        chain.update(place.encode() + b"\0" + raw + b"\0")
        end += len(raw)
        ttl = cache_ttl(block.get("cache_control"))
        if ttl is None and automatic is not None and n == len(found) - 1:
            ttl = automatic
        out.append(PrefixBlock(chain.hexdigest()[:32], end, ttl))
    return out


def plan_cache(blocks: Sequence[PrefixBlock], readable: Callable[[str], bool], min_tokens: int = 0) -> CachePlan:
    """What a request with these blocks reads and writes, given what the cache holds."""
    points = [i for i, b in enumerate(blocks) if b.ttl is not None]
    if len(points) > MAX_BREAKPOINTS:
        raise ScriptError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(points)}.")
    hit = -1
    for point in points:
        for i in range(point, max(-1, point - LOOKBACK_BLOCKS - 1), -1):
            if i <= hit:
                break
            if readable(blocks[i].key):
                hit = i
                break
    read = blocks[hit].end if hit >= 0 else 0
    written: dict[str, int] = {}
    writes: list[tuple[str, float]] = []
    start = read
    for point in points:
        block = blocks[point]
        if point <= hit or block.end // BYTES_PER_TOKEN < min_tokens:
            continue
        ttl = block.ttl or CACHE_TTL_S["5m"]
        name = next(k for k, v in CACHE_TTL_S.items() if v == ttl)
        written[name] = written.get(name, 0) + block.end - start
        writes.append((block.key, ttl))
        start = block.end
    return CachePlan(read, written, tuple(writes), start, blocks[hit].key if hit >= 0 else None, blocks[-1].end if blocks else 0)


def cache_usage(request_bytes: int, plan: CachePlan) -> dict[str, Any]:
    """The input half of ``usage``: plain, written and read tokens (bytes / 4 each)."""
    written = {k: v // BYTES_PER_TOKEN for k, v in plan.written.items()}
    return {
        "input_tokens": estimate_tokens(max(0, (plan.prompt or request_bytes) - plan.cached_end)),
        "cache_creation_input_tokens": sum(written.values()),
        "cache_read_input_tokens": plan.read // BYTES_PER_TOKEN,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written.get("5m", 0),
            "ephemeral_1h_input_tokens": written.get("1h", 0),
        },
    }


class PromptCache:
    """Stored prefixes per model (the key holds the model), on a clock tests can move."""

    def __init__(self, min_tokens: int = 0) -> None:
        self.min_tokens = min_tokens
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[float, float]] = {}
        """key -> (expiry on this clock, TTL seconds)."""
        self.offset = 0.0

    def now(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> float:
        with self.lock:
            self.offset += seconds
            return self.offset

    def plan(self, request: Mapping[str, Any]) -> CachePlan:
        """Look the request up; a hit refreshes the prefix it read."""
        blocks = prefix_blocks(request)
        with self.lock:
            now = self.now()
            plan = plan_cache(blocks, lambda key: self.entries.get(key, (0.0, 0.0))[0] > now, self.min_tokens)
            if plan.read_key is not None:
                ttl = self.entries[plan.read_key][1]
                self.entries[plan.read_key] = (now + ttl, ttl)
            return plan

    def store(self, writes: Sequence[tuple[str, float]]) -> None:
        """Make the writes readable: called when their request starts answering."""
        with self.lock:
            now = self.now()
            for key, ttl in writes:
                self.entries[key] = (now + ttl, ttl)


def filler_text(tokens: int) -> str:
    """tokens * BYTES_PER_TOKEN bytes of prose-like text (words, spaces, a newline now and then)."""
    unit = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor\n"
    size = tokens * BYTES_PER_TOKEN
    return (unit * (size // len(unit) + 1))[:size]


def build_message(
    step: Step,
    model: str,
    message_id: str,
    tool_id: str,
    request_bytes: int,
    *,
    cache: CachePlan | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The non-streaming Messages API response for a (non-error) step.

    As the API does, an answer longer than the request's max_tokens is cut
    there: its text to max_tokens' bytes, no tool call, stop_reason max_tokens.
    """
    content: list[dict[str, Any]] = []
    text = step.text
    if step.filler:
        text = filler_text(step.filler) if text is None else f"{text}\n{filler_text(step.filler)}"
    if text is None and step.tool is None:
        text = SLEPT_TEXT if step.sleep else PAST_END_TEXT
    if text is not None:
        content.append({"type": "text", "text": text})
    if step.tool is not None:
        content.append(
            {
                "type": "tool_use",
                "id": tool_id,
                "name": step.tool,
                "input": step.tool_input,
            }
        )
    output_chars = len(text or "") + (len(json.dumps(step.tool_input)) if step.tool is not None else 0)
    scripted = step.usage or {}
    usage: dict[str, Any] = cache_usage(request_bytes, cache or NO_CACHE)
    if set(scripted) & INPUT_USAGE_KEYS:
        # A step that scripts any input count scripts the whole input side:
        # {"input_tokens": N} costs N input tokens, whatever the cache did.
        usage = cache_usage(0, NO_CACHE) | {"input_tokens": 0}
    usage["output_tokens"] = estimate_tokens(output_chars)
    usage.update(scripted)
    stop_reason = "tool_use" if step.tool is not None else "end_turn"
    if max_tokens is not None and usage.get("output_tokens", 0) > max_tokens:
        kept = max(0, max_tokens * BYTES_PER_TOKEN)
        content = [{"type": "text", "text": (text or "")[:kept]}]
        usage["output_tokens"], stop_reason = max_tokens, "max_tokens"
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


DELTA_USAGE_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


def sse_frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def sse_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The event sequence the real API streams for ``message``."""
    usage = message["usage"]
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = dict(usage, output_tokens=1)
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            text = block["text"]
            pieces = [text[i : i + TEXT_CHUNK] for i in range(0, len(text), TEXT_CHUNK)] or [""]
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
        else:
            opening = dict(block, input={})
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": raw[i : i + JSON_CHUNK]} for i in range(0, len(raw), JSON_CHUNK)]
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": opening,
                },
            )
        )
        events.extend(
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            for delta in deltas
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                # Cumulative counts, as the API sends them (the input side is known at the start).
                "usage": {k: usage[k] for k in DELTA_USAGE_KEYS if k in usage},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def sse_body(message: dict[str, Any]) -> bytes:
    return b"".join(sse_frame(event, data) for event, data in sse_events(message))


def log_record(
    *,
    path: str,
    method: str,
    body_bytes: int,
    request: dict[str, Any],
    kind: str,
    digest: str | None,
    index: int | None,
    status: int,
    reply: str,
    user_agent: str | None = None,
    headers: Mapping[str, str] | None = None,
    usage: Mapping[str, Any] | None = None,
    body: Mapping[str, Any] | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    tools = request.get("tools")
    headers = headers or {}  # names in lower case
    retry = headers.get("x-stainless-retry-count")
    system = request.get("system")
    messages = request.get("messages")
    return {
        "time": round(time.time(), 6),
        "path": path,
        "method": method,
        "bytes": body_bytes,
        "model": request.get("model"),
        "stream": bool(request.get("stream")),
        "tools": [t.get("name") for t in tools if isinstance(t, dict)] if isinstance(tools, list) else [],
        "system_bytes": len(json.dumps(system).encode()) if system is not None else 0,
        "tools_bytes": len(json.dumps(tools).encode()) if tools is not None else 0,
        "messages_bytes": len(json.dumps(messages).encode()) if messages is not None else 0,
        "n_messages": len(messages) if isinstance(messages, list) else 0,
        "kind": kind,
        "task_digest": digest,
        "step_index": index,
        "status": status,
        "first": kind == "main" and index == 0,
        "reply": reply,
        "user_agent": user_agent,  # who is asking: the CLI names its version and the SDK app
        # Which CLI process asked, and whether this is its retry of a request
        # it sent before: a step asked twice by one session is a retry, by two
        # sessions an agent that ran twice.
        "session": headers.get("x-claude-code-session-id"),
        "retry": int(retry) if retry is not None and retry.isdigit() else None,
        # What reached the model after the task: a message sent mid-run shows here.
        "later_texts": later_texts(messages if isinstance(messages, list) else []),
        # Whether two requests share their cacheable head, without logging it whole.
        "tools_digest": _digest(tools),
        "system_digest": _digest(system),
        # Tokens of tools and system (the head siblings can share), as the cache counts them.
        "head_tokens": sum(len(_compact(b)) for place, b in _cacheable_blocks(request) if place in ("tool", "system")) // BYTES_PER_TOKEN,
        "usage": dict(usage) if usage is not None else None,
        # Which answer: a stream cut short logs a second record of the same id, with what was served.
        "message_id": message_id,
        # Which credential asked, as a short hash: a test tells the real one from an agent's without logging either.
        "credential": credential_hash(headers),
    } | ({"body": dict(body)} if body is not None else {})


def credential_hash(headers: Mapping[str, str]) -> str | None:
    """The first 12 hex digits of sha256 of the request's x-api-key, else of its bearer token (None: neither)."""
    value = headers.get("x-api-key")
    if not value:
        auth = headers.get("authorization", "")
        value = auth[7:] if auth.lower().startswith("bearer ") else None
    return hashlib.sha256(value.encode()).hexdigest()[:12] if value else None


def served_usage(usage: Mapping[str, Any], events: Sequence[tuple[str, dict[str, Any]]], sent: int) -> dict[str, Any]:
    """What the first `sent` events of a stream served: its input side once message_start went,
    and the output bytes of the deltas sent at BYTES_PER_TOKEN (the scripted model's own rule)."""
    if sent <= 0:
        return {k: 0 for k in DELTA_USAGE_KEYS}
    out = 0
    for _, data in events[:sent]:
        delta = data.get("delta") if data.get("type") == "content_block_delta" else None
        if isinstance(delta, dict):
            out += len(str(delta.get("text") or delta.get("partial_json") or "").encode())
    return dict(usage, output_tokens=out // BYTES_PER_TOKEN)


def _digest(value: object) -> str | None:
    if value is None:
        return None
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


LATER_TEXT_CHARS = 300  # of each text block after the first message, in the log
LATER_TEXTS_MAX = 20  # the log's last blocks: a long conversation keeps its newest


def later_texts(messages: Sequence[Any]) -> list[str]:
    """The text blocks (and plain-text contents) of every message after the first, clipped, newest last."""
    texts: list[str] = []
    for message in messages[1:]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content[:LATER_TEXT_CHARS])
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "text":
                texts.append(str(block.get("text", ""))[:LATER_TEXT_CHARS])
    return texts[-LATER_TEXTS_MAX:]


# ---------------------------------------------------------------- server


class MockState:
    """Everything the handlers share; counters are per server process."""

    def __init__(self, scenario: Scenario, log_path: Path | None, *, cache: PromptCache | None = None, log_bodies: bool = False) -> None:
        self.scenario = scenario
        self.cache = cache
        """None: caching off, every usage reports no cache reads or writes."""
        self.log_bodies = log_bodies
        self.lock = threading.Lock()
        self.attempts: dict[tuple[str, int], int] = {}
        self.ids = itertools.count(1)
        self.stopping = threading.Event()
        self.log_fd: int | None = None
        if log_path is not None:
            # O_APPEND makes each single write() land whole even when several
            # servers or threads share one log file.
            self.log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def next_id(self) -> int:
        with self.lock:
            return next(self.ids)

    def attempt(self, key: tuple[str, int]) -> int:
        """1-based attempt number for this (script key, step)."""
        with self.lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            return self.attempts[key]

    def cache_plan(self, request: Mapping[str, Any]) -> CachePlan:
        return NO_CACHE if self.cache is None else self.cache.plan(request)

    def answering(self, reply: Reply) -> None:
        """The reply starts: what it wrote to the prompt cache becomes readable."""
        if self.cache is not None and reply.cache_writes:
            self.cache.store(reply.cache_writes)

    def log(self, record: dict[str, Any]) -> None:
        if self.log_fd is not None:
            os.write(self.log_fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None

    def decide(self, request: dict[str, Any], body_bytes: int) -> tuple[Reply, str, str, int | None, float]:
        """(reply, kind, digest, step index, sleep seconds) for /v1/messages."""
        messages = request.get("messages")
        messages = messages if isinstance(messages, list) else []
        text = task_text(messages)
        digest = task_digest(text)
        model = str(request.get("model", "mock-model"))
        n = self.next_id()
        message_id, tool_id = f"msg_mock{n:08d}", f"toolu_mock{n:08d}"
        if not is_main_request(request):
            step = Step(text=side_text(request))
            try:
                plan = self.cache_plan(request)
            except ScriptError as exc:
                return Reply(400, error_body(400, f"mock_model: {exc}"), "cache_error"), "side", digest, None, 0.0
            message = build_message(step, model, message_id, tool_id, body_bytes, cache=plan)
            return Reply(200, message, "side", cache_writes=plan.writes), "side", digest, None, 0.0
        index = step_index(messages)
        try:
            steps = select_script(text, self.scenario)
            if index >= len(steps):
                step, summary = Step(text=PAST_END_TEXT), "done"
            else:
                step = normalise_step(steps[index])
                summary = ""
        except ScriptError as exc:
            return (
                Reply(400, error_body(400, f"mock_model: {exc}"), "script_error"),
                "main",
                digest,
                index,
                0.0,
            )
        if step.error is not None:
            attempt = self.attempt((script_key(text), index))
            if step.times is None or attempt <= step.times:
                headers: tuple[tuple[str, str], ...] = ()
                if step.retry_after is not None:
                    headers = (("retry-after", f"{step.retry_after:g}"),)
                body = error_body(step.error, f"mock_model scripted error {step.error}")
                return (
                    Reply(step.error, body, f"error:{step.error}", headers),
                    "main",
                    digest,
                    index,
                    step.sleep,
                )
        try:
            plan = self.cache_plan(request)
        except ScriptError as exc:
            return Reply(400, error_body(400, f"mock_model: {exc}"), "cache_error"), "main", digest, index, 0.0
        max_tokens = request.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None
        message = build_message(step, model, message_id, tool_id, body_bytes, cache=plan, max_tokens=max_tokens)
        if not summary:
            summary = f"tool:{step.tool}" if step.tool is not None else "text"
        if message["stop_reason"] == "max_tokens":
            summary = "max_tokens"
        return Reply(200, message, summary, cache_writes=plan.writes, stream_s=step.stream_s), "main", digest, index, step.sleep


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the API's front ends stream: with Nagle's algorithm a stream's first event,
    # written just after the headers, waits for their ACK, which a reused connection's peer
    # delays (about 40 ms): a client that keeps connections (a gateway's pool) would pay it and
    # a fresh one would not.
    disable_nagle_algorithm = True
    server_version = "mock_model/1"
    state: MockState  # set on the subclass built by make_server

    def log_message(self, format: str, *args: Any) -> None:
        # The JSON log replaces stderr chatter, which would interleave with
        # the single "listening" line callers parse.
        return

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("request-id", f"req_mock{self.state.next_id():08d}")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(
        self,
        status: int,
        payload: dict[str, Any],
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, MAX_BODY)) if length > 0 else b""

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True
        return peeked == b""

    def _sleep(self, seconds: float) -> bool:
        """Sleep without holding other requests; False if the client left."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.state.stopping.is_set() or self._client_gone():
                return False
            time.sleep(min(SLEEP_POLL, left))
        return True

    def _lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _other(self, body_bytes: int) -> None:
        status = 404
        self.state.log(
            log_record(
                user_agent=self.headers.get("User-Agent"),
                headers=self._lower_headers(),
                path=self.path,
                method=self.command,
                body_bytes=body_bytes,
                request={},
                kind="side",
                digest=None,
                index=None,
                status=status,
                reply="not_found",
            )
        )
        self._send_json(status, error_body(status, f"mock_model: no route {self.path}"))

    def do_GET(self) -> None:
        self._other(0)

    def _clock(self, raw: bytes) -> None:
        """Moves the prompt cache's clock, so tests see TTLs expire without waiting."""
        try:
            advance = json.loads(raw or b"{}").get("advance", 0)
        except (json.JSONDecodeError, AttributeError):
            advance = None
        if isinstance(advance, bool) or not isinstance(advance, (int, float)) or advance < 0:
            self._send_json(400, error_body(400, 'mock_model: POST {"advance": SECONDS} (>= 0)'))
        elif self.state.cache is None:
            self._send_json(409, error_body(409, "mock_model: caching is off (--no-cache)"))
        else:
            self._send_json(200, {"offset": self.state.cache.advance(float(advance))})

    def do_POST(self) -> None:
        raw = self._read_body()
        route = self.path.split("?", 1)[0].rstrip("/")
        if route == CLOCK_ROUTE:
            self._clock(raw)
            return
        if route not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._other(len(raw))
            return
        try:
            parsed = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            self._send_json(400, error_body(400, "mock_model: body is not a JSON object"))
            return
        request = cast(dict[str, Any], parsed)
        if route.endswith("count_tokens"):
            self.state.log(
                log_record(
                    user_agent=self.headers.get("User-Agent"),
                    headers=self._lower_headers(),
                    path=self.path,
                    method="POST",
                    body_bytes=len(raw),
                    request=request,
                    kind="side",
                    digest=None,
                    index=None,
                    status=200,
                    reply="count_tokens",
                )
            )
            self._send_json(200, {"input_tokens": estimate_tokens(len(raw))})
            return
        reply, kind, digest, index, sleep = self.state.decide(request, len(raw))

        def log(status: int, summary: str, usage: Mapping[str, Any] | None = None) -> None:
            record = log_record(
                path=self.path, method="POST", body_bytes=len(raw), request=request,
                kind=kind, digest=digest, index=index, status=status, reply=summary,
                user_agent=self.headers.get("User-Agent"),
                headers=self._lower_headers(),
                usage=usage if usage is not None else (reply.body.get("usage") if status == 200 else None),
                body=request if self.state.log_bodies else None,
                message_id=reply.body.get("id") if reply.status == 200 else None,
            )  # fmt: skip
            self.state.log(record)

        if sleep and not self._sleep(sleep):
            self.close_connection = True
            log(499, "client_gone")
            return
        # Logged before it is sent: whoever has read the answer finds it in the log.
        log(reply.status, reply.summary)
        self.state.answering(reply)
        if reply.status == 200 and request.get("stream") and reply.stream_s > 0:
            sent = self._stream_spread(reply)
            events = sse_events(reply.body)
            if sent < len(events):
                log(499, "stream_cut", served_usage(reply.body["usage"], events, sent))
        elif reply.status == 200 and request.get("stream"):
            self._send(200, sse_body(reply.body), "text/event-stream", reply.headers)
        else:
            self._send_json(reply.status, reply.body, reply.headers)

    def _stream_spread(self, reply: Reply) -> int:
        """Write a streamed answer's events evenly over reply.stream_s; how many went before the client left."""
        frames = [sse_frame(event, data) for event, data in sse_events(reply.body)]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(sum(map(len, frames))))
        self.send_header("request-id", f"req_mock{self.state.next_id():08d}")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        gap = reply.stream_s / max(1, len(frames) - 1)
        start = time.monotonic()
        for n, frame in enumerate(frames):
            if n and not self._sleep(start + n * gap - time.monotonic()):
                self.close_connection = True
                return n
            try:
                self.wfile.write(frame)
                self.wfile.flush()
            except ConnectionError:
                self.close_connection = True
                return n
        return len(frames)

    def do_HEAD(self) -> None:
        # A HEAD answer must carry no body, or the next response on this
        # keep-alive connection would be corrupted (the CLI HEADs /api/hello).
        self.state.log(
            log_record(
                user_agent=self.headers.get("User-Agent"),
                headers=self._lower_headers(),
                path=self.path,
                method="HEAD",
                body_bytes=0,
                request={},
                kind="side",
                digest=None,
                index=None,
                status=404,
                reply="not_found",
            )
        )
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_POST
    do_DELETE = do_GET


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a killed CLI) is normal here, not a traceback."""

    daemon_threads = True
    # socketserver's default backlog (5) resets connections when a fan-out's
    # requests arrive together (16 streams at once, say).
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)


def make_server(host: str, port: int, state: MockState) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    return QuietServer((host, port), handler)


# ---------------------------------------------------------------- for tests and dev tools
# The tests, bench, soak and demo import this module (tools/ on sys.path) for
# one way to start the server and to write scripts for spawn.py trees.

# What an agent's Bash runs to start a child, as spawn.py's briefing says: the
# interpreter the root resolved, so nested levels skip uv's resolution.
SPAWN_IN_BASH = '"$SPAWN_PYTHON" "$SPAWN_PY"'
# Reads the id from a background spawn's JSON line, in the agent's own Python.
READ_ID = '"$SPAWN_PYTHON" -c "import json,sys; print(json.load(sys.stdin)[\'id\'])"'
START_TIMEOUT_S = 30.0  # a loaded machine starts Python slowly; a hang is still bounded
STOP_TIMEOUT_S = 5.0


def mock_task(text: str, steps: Sequence[Mapping[str, Any]]) -> str:
    """A task whose inline script tells the scripted model what to answer."""
    return f"{text} MOCK{json.dumps(list(steps))}MOCK"


def spawn_in_bash(*args: str) -> str:
    """The command an agent's Bash runs to start a child with these arguments."""
    return " ".join([SPAWN_IN_BASH, *(shlex.quote(a) for a in args)])


class ServeError(RuntimeError):
    """The scripted model did not start."""


@dataclass
class Served:
    """A scripted model server that serve() started, in its own process."""

    url: str
    """Base URL for ANTHROPIC_BASE_URL, on a free loopback port."""
    process: subprocess.Popen[bytes]
    log: Path
    """One JSON line per request (see log_record)."""
    stderr_log: Path
    """The server's stderr: a file, so nothing blocks on a full pipe."""
    offset: int = 0

    def requests(self) -> list[dict[str, Any]]:
        """Every request logged so far."""
        return self._records(0)[0]

    def new_requests(self) -> list[dict[str, Any]]:
        """Requests logged since the last call (for runs one after another)."""
        records, self.offset = self._records(self.offset)
        return records

    def _records(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        if not self.log.exists():
            return [], offset
        with self.log.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # only whole lines: the server may be mid-write
        return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()], offset + end

    def advance_clock(self, seconds: float) -> float:
        """Moves the prompt cache's clock forward; returns the total offset."""
        request = urllib.request.Request(self.url + CLOCK_ROUTE, data=json.dumps({"advance": seconds}).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return float(json.load(answer)["offset"])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def serve(workdir: Path, scenario: Mapping[str, Any] | None = None, *, flags: Sequence[str] = ()) -> Iterator[Served]:
    """Run the scripted model on a free loopback port until the block ends.

    It runs as its own process, as the CLI's real API would: a test that
    kills process groups, or a busy harness, can't stall it. Its files go in
    a fresh folder under workdir, so two servers may share one workdir.
    """
    home = Path(tempfile.mkdtemp(prefix="mock-model-", dir=workdir))
    port_file, log, stderr_log = home / "port", home / "requests.jsonl", home / "stderr.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "--port", "0", "--port-file", str(port_file), "--log", str(log), *flags]
    if scenario is not None:
        (home / "scenario.json").write_text(json.dumps(scenario, indent=2))
        argv += ["--scenario", str(home / "scenario.json")]
    with stderr_log.open("wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    served = Served("", proc, log, stderr_log)
    try:
        limit = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():  # written whole, by rename
            if proc.poll() is not None or time.monotonic() > limit:
                raise ServeError(f"the scripted model did not start: {stderr_log.read_text(errors='replace')[-800:]!r}")
            time.sleep(0.02)
        served.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        yield served
    finally:
        served.stop()


# ---------------------------------------------------------------- CLI / main


def write_port_file(path: Path, port: int) -> None:
    # Write-then-rename so a poller never reads a half-written port.
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mock_model", description="Scripted Anthropic Messages API server.")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="write the bound port here")
    parser.add_argument("--scenario", type=Path, help="JSON scenario file")
    parser.add_argument("--log", type=Path, help="append one JSON line per request")
    parser.add_argument("--log-bodies", action="store_true", help="log each request's whole body too (large)")
    parser.add_argument("--no-cache", action="store_true", help="model no prompt caching: usage reports no cache reads or writes")
    parser.add_argument(
        "--cache-min-tokens", type=int, default=0, metavar="N", help="shortest prefix the cache stores, in tokens (default 0: any)"
    )
    return parser.parse_args(argv)


def fail(message: str) -> int:
    print(f"mock_model: error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        return fail(f"refusing to bind non-loopback host {args.host!r}")
    scenario = Scenario()
    if args.scenario is not None:
        try:
            scenario = parse_scenario(json.loads(args.scenario.read_text()))
        except (OSError, ValueError) as exc:
            return fail(f"cannot load scenario {args.scenario}: {exc}")
    try:
        cache = None if args.no_cache else PromptCache(args.cache_min_tokens)
        state = MockState(scenario, args.log, cache=cache, log_bodies=args.log_bodies)
        server = make_server(args.host, args.port, state)
    except OSError as exc:
        return fail(str(exc))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    port = int(server.server_address[1])
    # serve_forever runs in a thread because shutdown() deadlocks when called
    # from the serving thread (where a signal handler would run).
    thread = threading.Thread(target=server.serve_forever, args=(0.1,), name="mock_model", daemon=True)
    thread.start()
    try:
        if args.port_file is not None:
            write_port_file(args.port_file, port)
        print(f"mock_model listening on http://{args.host}:{port}", flush=True)
        while not stop.wait(0.5):
            pass
    except OSError as exc:
        return fail(str(exc))
    finally:
        state.stopping.set()
        server.shutdown()
        server.server_close()
        state.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

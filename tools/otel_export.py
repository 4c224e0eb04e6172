#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = [
#     "opentelemetry-sdk>=1.30,<2",
#     "opentelemetry-exporter-otlp-proto-http>=1.30,<2",
# ]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""Export a session's agent tree as OpenTelemetry spans: ``uv run tools/otel_export.py SESSION``.

One span per agent, with the ids spawn.py already gave it (meta.json): the
tree's trace id, the agent's span id, and its parent agent's span as parent
(the root's parent is the TRACEPARENT it joined, if any). Attributes: depth,
agent id and name, model, tools, status, cost, tokens and turns. Denied tool
calls and asks are span events. Each model call the tree's gateway metered
(the ledger's spend lines) is a child span of its agent's, named and
described by OpenTelemetry's GenAI semantic conventions (``chat MODEL``,
``gen_ai.*``), with spawn.py's own figures beside them (``spawn.*``).

Spans go to OTLP/HTTP (protobuf) at ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), through the official exporter, which
also reads ``OTEL_EXPORTER_OTLP_HEADERS``. spawn.py runs this once per tree,
when its root ends and the variable is set; nothing below the root pays for
it. Exit 0 when exported, 1 when the collector refused, 2 on bad input.

A sibling of spawn.py: it reads the session directory only, never imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from session_files import iter_jsonl, model_calls, native_subagents, parse_time, read_json

SERVICE_NAME = "spawn.py"
PROVIDER = "anthropic"  # the gateway speaks the Anthropic API only (docs/cost.md)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def nanos(value: Any) -> int | None:
    seconds = parse_time(value)
    return None if seconds is None else int(seconds * 1e9)


def context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def permission_events(agent_dir: Path) -> list[Event]:
    """Denied calls and asks, from the transcript's PermissionDecision lines."""
    events = []
    for record in iter_jsonl(agent_dir / "transcript.jsonl", b'"PermissionDecision"'):
        message = record.get("message") or {}
        at = nanos(record.get("time"))
        if not isinstance(message, dict) or at is None:
            continue
        by = str(message.get("by"))
        asked = by in ("approve", "deny", "timeout", "terminal")
        if not asked and message.get("verdict") != "deny":
            continue
        attributes = {k: str(message.get(k)) for k in ("tool", "input", "rule", "verdict", "by")}
        events.append(Event("spawn.ask" if asked else "spawn.denied", attributes, at))
    return events


def agent_span(agent_dir: Path, resource: Resource) -> ReadableSpan | None:
    meta = read_json(agent_dir / "meta.json")
    if meta is None or not meta.get("trace_id") or not meta.get("span_id"):
        return None
    outcome = read_json(agent_dir / "outcome.json") or {}
    start = nanos(meta.get("started_at")) or 0
    end = nanos(outcome.get("ended_at")) or start
    usage: dict[str, Any] = outcome["usage"] if isinstance(outcome.get("usage"), dict) else {}
    attributes: dict[str, Any] = {
        "spawn.agent.id": meta["id"],
        "spawn.agent.name": meta.get("agent") or "default",
        "spawn.depth": int(meta.get("depth", 0)),
        "spawn.model": str(meta.get("model", "")),
        "spawn.tools": [str(t) for t in meta.get("tools", [])],
        "spawn.status": str(outcome.get("status", "running")),
        "spawn.session": str(meta.get("session", "")),
    }
    if meta.get("parent_id"):
        attributes["spawn.parent.id"] = meta["parent_id"]
    placement = meta.get("placement")
    if isinstance(placement, dict) and isinstance(placement.get("backend"), str):
        attributes["spawn.placement"] = placement["backend"]  # inprocess: a subagent inside its host's CLI
    if isinstance(outcome.get("cost_usd"), int | float):
        attributes["spawn.cost_usd"] = float(outcome["cost_usd"])
    if isinstance(outcome.get("turns"), int):
        attributes["spawn.turns"] = outcome["turns"]
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        if isinstance(usage.get(key), int):
            attributes[f"spawn.usage.{key}"] = usage[key]
    status = outcome.get("status")
    span_status = Status(StatusCode.OK) if status == "done" else Status(StatusCode.ERROR, str(outcome.get("reason", "no outcome")))
    parent = meta.get("parent_span_id")
    return ReadableSpan(
        name=f"agent {meta['id']}",
        context=context(meta["trace_id"], meta["span_id"]),
        parent=context(meta["trace_id"], parent) if parent else None,
        resource=resource,
        attributes=attributes,
        events=permission_events(agent_dir),
        kind=SpanKind.INTERNAL,
        start_time=start,
        end_time=max(start, end),
        status=span_status,
    )


def native_spans(agent_dir: Path, parent: ReadableSpan, resource: Resource) -> list[ReadableSpan]:
    """Claude Code's own subagents of an agent (native.jsonl), as child spans."""
    assert parent.context is not None
    trace_id = f"{parent.context.trace_id:032x}"
    spans = []
    for native_id, node in native_subagents(agent_dir).items():
        first, stop = node.get("start") or node.get("stop") or {}, node.get("stop")
        start = nanos(first.get("time")) or parent.start_time or 0
        end = (nanos(stop.get("time")) if stop else None) or parent.end_time or start
        attributes = {"spawn.agent.id": f"n-{native_id}", "spawn.kind": "native", "spawn.agent.name": str(first.get("agent_type", ""))}
        attributes["spawn.status"] = "done" if stop else "killed"
        spans.append(
            ReadableSpan(
                name=f"native {native_id}",
                # A span id of its own, derived from the CLI's id so a re-export gives the same one.
                context=context(trace_id, hashlib.sha256(native_id.encode()).hexdigest()[:16]),
                parent=parent.context,
                resource=resource,
                attributes=attributes,
                kind=SpanKind.INTERNAL,
                start_time=start,
                end_time=max(start, end),
                status=Status(StatusCode.OK) if stop else Status(StatusCode.ERROR, "ended with its parent"),
            )
        )
    return spans


def call_attributes(agent_id: str, call: dict[str, Any]) -> dict[str, Any]:
    """A model call's attributes: the GenAI semantic conventions' where they fit, spawn.py's for the rest."""
    usage: dict[str, int] = call["usage"]
    model = call["model"]
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # the name before gen_ai.provider.name, which many backends still read
        # The ledger records the model that answered (the request's when none did): both are that.
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        # The conventions count cache reads and writes inside the input; the API's input_tokens excludes them.
        "gen_ai.usage.input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"],
        "gen_ai.usage.output_tokens": usage["output_tokens"],
        "gen_ai.usage.cache_read.input_tokens": usage["cache_read_input_tokens"],
        "gen_ai.usage.cache_creation.input_tokens": usage["cache_creation_input_tokens"],
        "spawn.agent.id": agent_id,
        "spawn.cost_usd": call["cost_usd"],
        "spawn.status": call["status"],
    }
    attributes.update({f"spawn.usage.{key}": count for key, count in usage.items()})  # as the API counts them
    if "ttfb_s" in call:
        attributes["spawn.ttfb_s"] = call["ttfb_s"]
    if "duration_s" in call:
        attributes["spawn.duration_s"] = call["duration_s"]
    if call["status"] != "200":
        attributes["error.type"] = call["status"] or "_OTHER"
    return attributes


def call_spans(parent: ReadableSpan, agent_id: str, calls: list[dict[str, Any]], resource: Resource) -> list[ReadableSpan]:
    """An agent's model calls (the ledger's spend lines), as child spans of its own: from time - duration_s to time."""
    assert parent.context is not None
    trace_id = f"{parent.context.trace_id:032x}"
    spans = []
    for n, call in enumerate(calls):
        end = nanos(call["time"])
        if end is None:
            continue
        start = end - int(call.get("duration_s", 0.0) * 1e9)
        # A span id of its own, from its agent's and its place among its calls: a re-export gives the same one.
        span_id = hashlib.sha256(f"{parent.context.span_id:016x}/call/{n}".encode()).hexdigest()[:16]
        ok = call["status"] == "200"
        spans.append(
            ReadableSpan(
                name=f"chat {call['model']}".rstrip(),
                context=context(trace_id, span_id),
                parent=parent.context,
                resource=resource,
                attributes=call_attributes(agent_id, call),
                kind=SpanKind.CLIENT,
                start_time=start,
                end_time=end,
                status=Status(StatusCode.OK) if ok else Status(StatusCode.ERROR, f"model call ended {call['status'] or 'unknown'}"),
            )
        )
    return spans


def session_spans(session: Path) -> list[ReadableSpan]:
    resource = Resource.create({"service.name": SERVICE_NAME, "spawn.session": session.name})
    calls = model_calls(session)
    spans = []
    for agent_dir in sorted((session / "agents").iterdir()):
        span = agent_span(agent_dir, resource) if agent_dir.is_dir() else None
        if span is not None:
            agent_id = str((span.attributes or {})["spawn.agent.id"])
            spans += [span, *native_spans(agent_dir, span, resource), *call_spans(span, agent_id, calls.get(agent_id, []), resource)]
    return spans


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="otel_export.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("session", metavar="SESSION", help="a session directory")
    args = parser.parse_args(argv)
    session = Path(args.session)
    if not (session / "agents").is_dir():
        print(f"otel_export: error: {session} is not a session directory (no agents/)", file=sys.stderr)
        return EXIT_USAGE
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        print("otel_export: error: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318)", file=sys.stderr)
        return EXIT_USAGE
    spans = session_spans(session)
    exporter = OTLPSpanExporter()
    try:
        result = exporter.export(spans)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]  # untyped in opentelemetry-exporter 1.45
    if result is not SpanExportResult.SUCCESS:
        print(f"otel_export: error: the collector did not accept {len(spans)} spans", file=sys.stderr)
        return EXIT_FAILED
    print(f"otel_export: exported {len(spans)} spans", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

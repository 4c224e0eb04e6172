"""OpenTelemetry: a real depth-3 tree's spans, received by a loopback OTLP/HTTP collector."""

from __future__ import annotations

import datetime as dt
import gzip
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import load, metas, mock_task, run_spawn, spawn_in_bash

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason="opentelemetry-proto is installed by the nox tests session"
)

EXTERNAL_TRACE = "0af7651916cd43dd8448eb211c80319c"
EXTERNAL_SPAN = "b7ad6b7169203331"


class Collector:
    """An OTLP/HTTP receiver: decodes every ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[Any] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    collector.resources.append(resource_spans.resource)
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans.extend(scope_spans.spans)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    thread = threading.Thread(target=c.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        found[kv.key] = [v.string_value for v in value.values] if kind == "array_value" else value
    return found


def test_depth3_tree_is_one_trace_with_one_span_per_agent(
    env: dict[str, str], session_root: Path, tmp_path: Path, collector: Collector
) -> None:
    native = {"description": "look", "prompt": mock_task("Native looks", [{"text": "native done"}]), "subagent_type": "general-purpose"}
    leaf = mock_task(
        "Leaf checks",
        [
            # Echoed, not written to a file: the leaf's Bash is sandboxed (--sandbox auto), so
            # it can write only in its cwd and its own agent directory.
            {"bash": 'echo "seen-traceparent=$TRACEPARENT"'},
            {"bash": "rm -f x"},
            {"tool": "Agent", "input": native},
            {"text": "leaf done"},
        ],
    )
    middle = mock_task("Middle", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Bash,Agent")}, {"text": "middle done"}])
    child = mock_task("Child", [{"bash": spawn_in_bash("--task", middle, "--tools", "Bash,Agent")}, {"text": "child done"}])
    root = mock_task("Root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash,Agent")}, {"text": "root done"}])
    otel_env = {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "TRACEPARENT": f"00-{EXTERNAL_TRACE}-{EXTERNAL_SPAN}-01",
        # The exporter's dependencies come from uv's cache, not the test's private HOME.
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
    }
    proc = run_spawn(["--task", root, "--tools", "Bash,Agent", "--max-depth", "3", "--deny", "Bash(rm:*)"], otel_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "OpenTelemetry export failed" not in proc.stderr

    by_id = metas(session_root)
    assert sorted(m["depth"] for m in by_id.values()) == [0, 1, 2, 3]
    spans = {s.span_id.hex(): s for s in collector.spans}
    assert len(collector.spans) == len(spans) == 5  # four agents and the leaf's native subagent
    for meta in by_id.values():
        span = spans.pop(meta["span_id"])
        assert span.trace_id.hex() == EXTERNAL_TRACE == meta["trace_id"]
        parent = by_id[meta["parent_id"]]["span_id"] if "parent_id" in meta else EXTERNAL_SPAN
        assert span.parent_span_id.hex() == parent
        attrs = attributes(span)
        assert attrs["spawn.depth"] == meta["depth"] and attrs["spawn.agent.id"] == meta["id"]
        assert attrs["spawn.status"] == "done" and attrs["spawn.model"] == meta["model"]
        assert attrs["spawn.tools"] == meta["tools"] and attrs["spawn.turns"] >= 1
        assert attrs["spawn.cost_usd"] == load(Path(meta["session"]) / "agents" / meta["id"] / "outcome.json")["cost_usd"]
        assert attrs["spawn.usage.input_tokens"] > 0
        # Cache writes and reads beside them (the scripted model prices caching): each agent
        # writes its prompt's head; one with a second turn reads it back.
        assert attrs["spawn.usage.cache_creation_input_tokens"] > 0
        assert attrs["spawn.usage.cache_read_input_tokens"] > 0 or attrs["spawn.turns"] == 1
    leaf_meta = next(m for m in by_id.values() if m["depth"] == 3)
    leaf_span = next(s for s in collector.spans if s.span_id.hex() == leaf_meta["span_id"])
    events = [(e.name, {kv.key: kv.value.string_value for kv in e.attributes}) for e in leaf_span.events]
    assert [(name, a["tool"], a["verdict"]) for name, a in events] == [("spawn.denied", "Bash", "deny")]
    (native_span,) = [s for s in collector.spans if attributes(s).get("spawn.kind") == "native"]
    assert native_span.parent_span_id.hex() == leaf_meta["span_id"] and native_span.trace_id.hex() == EXTERNAL_TRACE
    assert attributes(native_span)["spawn.agent.name"] == "general-purpose" and attributes(native_span)["spawn.status"] == "done"
    # The leaf's CLI (and so its Bash) had the agent's own trace context.
    transcript = (Path(leaf_meta["session"]) / "agents" / leaf_meta["id"] / "transcript.jsonl").read_text()
    assert f"seen-traceparent={leaf_meta['traceparent']}" in transcript


def iso_nanos(iso: str) -> int:
    return round(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1e9)


def test_in_process_agents_are_spans_of_the_tree(env: dict[str, str], session_root: Path, collector: Collector) -> None:
    """Three agents in one CLI, with the gateway on (SPAWN_GATEWAY=1): each agent's model calls are GenAI
    spans under its own span, not its host's."""

    def delegate(name: str, child: str) -> str:
        call = {"description": name, "prompt": child, "subagent_type": "general-purpose", "run_in_background": False}
        return mock_task(name, [{"tool": "Agent", "input": call}, {"text": f"{name} done"}])

    root = delegate("Root", delegate("Middle", mock_task("Leaf", [{"text": "leaf done"}])))
    otel_env = {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
        "SPAWN_GATEWAY": "1",
    }
    proc = run_spawn(["--task", root, "--tools", "Agent,Read", "--placement", "inprocess"], otel_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "OpenTelemetry export failed" not in proc.stderr
    by_span = {m["span_id"]: m for m in metas(session_root).values()}
    spans = {s.span_id.hex(): s for s in collector.spans if s.name.startswith("agent ")}
    assert spans.keys() == by_span.keys() and len(spans) == 3
    for span_id, meta in by_span.items():
        attrs = attributes(spans[span_id])
        assert attrs["spawn.placement"] == ("local" if meta["depth"] == 0 else "inprocess")
        assert attrs["spawn.status"] == "done" and spans[span_id].parent_span_id.hex() == meta.get("parent_span_id", "")

    (ledger,) = session_root.glob("*/ledger.jsonl")
    spends = [line for line in map(json.loads, ledger.read_text().splitlines()) if line.get("kind") == "spend"]
    calls = [s for s in collector.spans if not s.name.startswith("agent ")]
    assert len(calls) == len(spends) >= 5  # the root and the middle ask twice (their Agent call, their answer), the leaf once
    assert len({s.span_id for s in collector.spans}) == len(collector.spans)
    for meta in by_span.values():
        mine = [line for line in spends if line["id"] == meta["id"]]
        # Under its agent's span, in the ledger's order (spans sorted by start, as a backend shows them).
        under = sorted((s for s in calls if s.parent_span_id.hex() == meta["span_id"]), key=lambda s: s.start_time_unix_nano)
        assert len(under) == len(mine) >= 1, meta["id"]
        for span, line in zip(under, sorted(mine, key=lambda c: iso_nanos(c["time"]) - c["duration_s"] * 1e9), strict=True):
            attrs = attributes(span)
            usage = line["usage"]
            assert span.name == f"chat {line['model']}" and span.kind == span.SPAN_KIND_CLIENT
            assert span.trace_id.hex() == meta["trace_id"]
            assert attrs["gen_ai.operation.name"] == "chat"
            assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "anthropic"
            assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == line["model"]
            assert attrs["gen_ai.usage.input_tokens"] == (
                usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
            )
            assert attrs["gen_ai.usage.output_tokens"] == usage["output_tokens"] > 0
            assert attrs["gen_ai.usage.cache_read.input_tokens"] == usage["cache_read_input_tokens"]
            assert attrs["gen_ai.usage.cache_creation.input_tokens"] == usage["cache_creation_input_tokens"]
            assert {k: v for k, v in attrs.items() if k.startswith("spawn.usage.")} == {f"spawn.usage.{k}": v for k, v in usage.items()}
            assert attrs["spawn.agent.id"] == meta["id"] and attrs["spawn.status"] == line["status"] == "200"
            assert attrs["spawn.cost_usd"] == line["cost_usd"] > 0 and attrs["spawn.ttfb_s"] == line["ttfb_s"]
            # From time - duration_s to time, to the millisecond the ledger keeps.
            assert abs(span.end_time_unix_nano - iso_nanos(line["time"])) < 1_000_000
            assert abs(span.end_time_unix_nano - span.start_time_unix_nano - line["duration_s"] * 1e9) < 1_000_000

"""The timeline page (tools/view.py), in a real headless Chromium.

A real tree runs through spawn.py and the bundled CLI against the scripted
model; a synthetic session of 1,000 agents checks the scale. The browser loads
the page, its script runs, and the DOM it leaves behind is counted. Screenshots
go to $SPAWN_ARTIFACTS (default .nox/artifacts/), which CI keeps.
"""

from __future__ import annotations

import datetime as dt
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, agent_dirs, load, mock_task, run_spawn, spawn_in_bash, validate_records

VIEW = ROOT / "tools" / "view.py"


def load_view() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("view", VIEW)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["view"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def artifacts_dir() -> Path:
    path = Path(os.environ.get("SPAWN_ARTIFACTS") or ROOT / ".nox" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it on CI)")
    return found


def chromium(url: str, tmp_path: Path, *how: str) -> str:
    """Run headless Chromium on a local page, with nothing that reaches the network."""
    command = [
        chromium_binary(),
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *how,
        url,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def page_url(page: Path, query: str = "", fragment: str = "") -> str:
    return page.as_uri() + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")


def dump_dom(page: Path, tmp_path: Path, fragment: str = "", size: str = "1280,800", query: str = "") -> str:
    return chromium(page_url(page, query, fragment), tmp_path, "--dump-dom", f"--window-size={size}")


def screenshot(page: Path, tmp_path: Path, name: str, size: str, fragment: str = "") -> Path:
    shot = artifacts_dir() / name
    shot.unlink(missing_ok=True)
    chromium(page_url(page, fragment=fragment), tmp_path, f"--screenshot={shot}", f"--window-size={size}")
    assert shot.stat().st_size > 1000
    return shot


def body_data(dom: str, name: str) -> int:
    found = re.search(rf'<body[^>]*\bdata-{name}="(\d+)"', dom)
    assert found, f"the page's script did not set data-{name}"
    return int(found.group(1))


def page_layout(dom: str) -> dict[str, Any]:
    """What the page's script measured after laying itself out (body data-layout)."""
    found = re.search(r'<body[^>]*\bdata-layout="([^"]*)"', dom)
    assert found, "the page's script did not set data-layout"
    layout: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return layout


def assert_fits_window(page: Path, tmp_path: Path, size: str) -> None:
    """At zoom 1 the whole tree's time span fits the window; zoomed in, every bar is reachable by scrolling.

    Boxes are [left, top, right, bottom] in window pixels, as getBoundingClientRect gives them.
    """
    width, height = (int(n) for n in size.split(","))
    for zoom in (1, 8):
        layout = page_layout(dump_dom(page, tmp_path, size=size, query=f"zoom={zoom}"))
        assert layout["zoom"] == zoom and layout["window"][0] == width and layout["window"][1] <= height
        chart = layout["chart"]
        left, top, right, _ = chart["box"]
        plot_x, plot_w = layout["plot"]
        bars = layout["bars"]
        assert bars, "no bar was laid out"
        for bar in bars:
            # Inside the scrolled content: reachable by the chart's own scroll bars.
            assert left + plot_x - 1 <= bar[0] + chart["scrollLeft"] and bar[2] + chart["scrollLeft"] <= left + chart["scrollWidth"], bar
            assert top <= bar[1] + chart["scrollTop"] and bar[3] + chart["scrollTop"] <= top + chart["scrollHeight"], bar
        # The first start and the last end are the plot's two edges.
        assert min(b[0] for b in bars) == left + plot_x
        assert max(b[2] for b in bars) >= left + plot_x + plot_w - 1
        if zoom == 1:
            # Nothing to scroll sideways, and every bar is in the visible part of the chart.
            assert chart["scrollWidth"] <= chart["clientWidth"] and right <= width
            assert all(b[2] <= left + chart["clientWidth"] for b in bars)
        else:
            assert chart["scrollWidth"] > 2 * chart["clientWidth"]
        # The time axis takes the chart's width beside the label and cost columns, times the zoom.
        assert abs(plot_w - zoom * (chart["clientWidth"] - plot_x - 20)) <= 1
        # The legend and the zoom buttons are whole and inside the window; the legend stays clear of the bars.
        for box in (layout["legend"], layout["zoomControls"]):
            assert box[0] >= 0 and box[1] >= 0 and box[2] <= width and box[3] <= layout["window"][1], box
        assert layout["legend"][2] <= left + plot_x


def drawn_calls(dom: str) -> dict[str, int]:
    """How many segments the page's script drew of each part of the model calls (waiting, answering, cut/error)."""
    drawn: dict[str, int] = {}
    for part, d in re.findall(r'<path class="call" data-part="([^"]+)"[^>]*\bd="([^"]*)"', dom):
        drawn[part] = drawn.get(part, 0) + d.count("M")
    return drawn


def spend_lines(session: Path) -> list[dict[str, Any]]:
    lines = (session / "ledger.jsonl").read_text().splitlines() if (session / "ledger.jsonl").exists() else []
    return [line for line in map(json.loads, lines) if line.get("kind") == "spend"]


def run_view(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(VIEW), *args], capture_output=True, text=True, timeout=120, check=False)


def test_timeline_of_a_real_tree_in_chromium(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    grandchild = mock_task("Go deeper", [{"text": "never runs: refused at the depth limit"}])
    child = mock_task("Child explores", [{"bash": spawn_in_bash("--task", grandchild, "--tools", "Bash")}, {"text": "child finished"}])
    root = mock_task(
        "Root plans",
        [
            {"bash": spawn_in_bash("--task", child, "--tools", "Bash")},
            {"bash": "rm -f nothing-here"},  # denied by --deny
            {"bash": "git push origin nowhere"},  # asked; nobody answers within 1 s
            {"text": "root finished"},
        ],
    )
    proc = run_spawn(
        ["--task", root, "--tools", "Bash", "--max-depth", "1", "--deny", "Bash(rm:*)", "--ask", "Bash(git push:*)"],
        # SPAWN_GATEWAY=1: the tree's gateway records each model call in the ledger, for the page to draw.
        {**env, "SPAWN_ASK_TIMEOUT_S": "1", "SPAWN_GATEWAY": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    dirs = agent_dirs(session_root)
    statuses = sorted(load(d / "outcome.json")["status"] for d in dirs)
    assert statuses == ["done", "done", "refused"]
    validate_records(session_root)
    session = dirs[0].parent.parent
    child_id = next(d.name for d in dirs if d.name.startswith("a1-") and load(d / "outcome.json")["status"] == "done")

    page = tmp_path / "timeline.html"
    made = run_view(str(session), "-o", str(page))
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    # Self-contained: nothing for the browser to fetch.
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\((?!#)", text)
    assert text.count('class="mark denied"') == 1 and text.count('class="mark ask"') == 1

    dom = dump_dom(page, tmp_path, child_id)
    assert body_data(dom, "bars") == body_data(dom, "agents") == len(dirs) == 3
    # The #ID selects that agent, as a click does: its detail panel is built.
    detail = dom[dom.index('id="detail"') :]
    assert f'data-agent="{child_id}"' in dom
    assert "child finished" in detail and "last transcript lines" in detail
    # Every moment in the panel is ISO 8601, never Unix seconds.
    assert re.search(r"<td>start</td><td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z</td>", detail)
    assert re.search(r"<td>end</td><td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z</td>", detail)
    assert not re.search(r"<td>\d{10}(\.\d+)?</td>", detail)
    # Each model call is drawn on its agent's row (waiting for its first byte, then answering),
    # and the selected agent's are listed in the panel, each ending when the ledger says it did.
    calls = spend_lines(session)
    child_calls = [c for c in calls if c["id"] == child_id]
    ran = {d.name for d in dirs if load(d / "outcome.json")["status"] != "refused"}
    assert len(child_calls) >= 2 and {c["id"] for c in calls} == ran
    assert body_data(dom, "calls") == len(calls)
    ok = [c for c in calls if c["status"] == "200"]
    assert drawn_calls(dom) == {"waiting": len(ok), "answering": len(ok), "cut/error": len(calls) - len(ok)}
    rows = re.findall(r'<tr class="call"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>\$([^<]*)</td>', detail)
    assert [(end, status) for end, status, *_ in rows] == [(c["time"], c["status"]) for c in child_calls]
    expected = [(f"{c['ttfb_s']:.3f} s", f"{c['duration_s']:.3f} s") for c in child_calls]
    assert [(ttfb, duration) for _, _, ttfb, duration, _ in rows] == expected
    assert all(abs(float(cost) - c["cost_usd"]) <= 0.00005 + 1e-9 for (*_, cost), c in zip(rows, child_calls, strict=True))
    assert f"model calls ({len(child_calls)})" in detail
    for size in ("1280,800", "1920,1080"):
        assert_fits_window(page, tmp_path, size)
        screenshot(page, tmp_path, f"timeline-{size.replace(',', 'x')}.png", size, child_id)

    picture = tmp_path / "timeline.svg"
    assert run_view(str(session), "--svg", "-o", str(picture)).returncode == 0
    bars = [e for e in ET.parse(picture).getroot().iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "bar"]
    assert sorted(str(b.get("data-status")) for b in bars) == statuses
    # The static picture draws the calls itself, as the page's script does.
    assert drawn_calls(picture.read_text()) == drawn_calls(dom)


def synthetic_session(root: Path, count: int, calls: int = 0) -> Path:
    """A finished tree of `count` agents with schema-valid records: fan-out 10 (depth 3 at 1,000).

    calls: model calls per agent that ran, as the tree's gateway writes them to the ledger, one
    after another through the agent's run; every fifth agent's last one cut mid-answer.
    """
    session = root / "20261123-0900-synthetic"
    (session / "agents").mkdir(parents=True)
    t0 = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.UTC)
    statuses = ["done"] * 7 + ["failed", "timeout", "refused"]
    ids: list[str] = []
    depths: list[int] = []
    spends: list[dict[str, Any]] = []
    for i in range(count):
        # A 10-ary tree in breadth-first order: agent i's parent is (i - 1) // 10.
        parent_index = None if i == 0 else (i - 1) // 10
        depth = 0 if parent_index is None else depths[parent_index] + 1
        agent_id = f"a{depth}-{i:06x}"
        ids.append(agent_id)
        depths.append(depth)
        parent = None if parent_index is None else ids[parent_index]
        start = t0 + dt.timedelta(seconds=i * 0.5)
        meta: dict[str, Any] = {
            "id": agent_id,
            "depth": depth,
            "max_depth": 3,
            "pid": 100000 + i,
            "create_time": start.timestamp(),
            "pgid": 100000 + i,
            "trace_id": "0" * 31 + "1",
            "span_id": f"{i + 1:016x}",
            "traceparent": f"00-{'0' * 31}1-{i + 1:016x}-01",
            "task": f"Synthetic task number {i}",
            "tools": ["Read"],
            "disallowed_tools": [],
            "model": "sonnet",
            "cwd": str(root),
            "started_at": start.isoformat().replace("+00:00", "Z"),
            "deadline": start.timestamp() + 600,
            "session": str(session),
            "system_prompt": "synthetic",
            "protocol": 1,
            "permissions": {"allow": [], "deny": [], "ask": []},
            "permission_mode": "dontAsk",
        }
        if parent is not None:
            meta["parent_id"] = parent
        status = "done" if i == 0 else statuses[i % len(statuses)]
        duration = 0.0 if status == "refused" else 5.0 + (i % 7)
        outcome: dict[str, Any] = {
            "id": agent_id,
            "status": status,
            "reason": "synthetic",
            "exit_code": {"done": 0, "failed": 1, "timeout": 124, "refused": 4}[status],
            "ended_at": (start + dt.timedelta(seconds=duration)).isoformat().replace("+00:00", "Z"),
            "duration_s": duration,
            "validation_errors": [],
            "warnings": [],
            "committed_by": "self",
            "protocol": 1,
        }
        if status != "refused":
            outcome.update(cost_usd=0.001, usage={"input_tokens": 1000, "output_tokens": 100}, turns=2, output=f"result {i}")
        agent_dir = session / "agents" / agent_id
        agent_dir.mkdir()
        (agent_dir / "meta.json").write_text(json.dumps(meta))
        (agent_dir / "outcome.json").write_text(json.dumps(outcome))
        (agent_dir / (".done" if status == "done" else ".fail")).write_text(status)
        if status != "refused" and calls:
            spends += [synthetic_call(agent_id, start, duration, n, cut=i % 5 == 0 and n == calls - 1) for n in range(calls)]
    if spends:
        (session / "ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in spends))
    return session


def synthetic_call(agent_id: str, start: dt.datetime, duration: float, n: int, *, cut: bool) -> dict[str, Any]:
    """The n-th model call of an agent, a second long, n + 0.5 s into its run: a gateway's spend line."""
    line: dict[str, Any] = {
        "id": agent_id,
        "time": (start + dt.timedelta(seconds=min(duration, n + 1.5))).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "kind": "spend",
        "cost_usd": 0.0003,
        "usage": {"input_tokens": 300, "output_tokens": 30, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 0},
        "model": "claude-sonnet-4-5-20250929",
        "duration_s": 1.0,
        "status": "cut" if cut else "200",
    }
    if not cut:
        line["ttfb_s"] = 0.4
    return line


def test_timeline_of_1000_agents_in_chromium(tmp_path: Path) -> None:
    session = synthetic_session(tmp_path / "sessions", 1000, calls=3)
    calls = spend_lines(session)
    assert len(calls) == 2700  # 900 agents ran, 100 were refused
    assert validate_records(tmp_path / "sessions") == 2000 + len(calls)
    page = tmp_path / "timeline.html"
    made = run_view(str(session), "-o", str(page))
    assert made.returncode == 0, made.stderr
    # Light: an agent's calls are three paths, however many, drawn by the script from one compact array.
    assert page.stat().st_size < 2_000_000, page.stat().st_size
    dom = dump_dom(page, tmp_path, "a3-0003e7")
    assert body_data(dom, "bars") == body_data(dom, "agents") == 1000
    assert body_data(dom, "calls") == len(calls) and dom.count('<g class="calls"') == 900
    cut = sum(c["status"] == "cut" for c in calls)
    assert drawn_calls(dom) == {"waiting": len(calls) - cut, "answering": len(calls) - cut, "cut/error": cut}
    # The panel lists the selected agent's calls alone: none for this refused one, three for its sibling.
    assert 'data-agent="a3-0003e7"' in dom and '<tr class="call">' not in dom
    sibling = dump_dom(page, tmp_path, "a3-0003e6")
    assert 'data-agent="a3-0003e6"' in sibling and sibling.count('<tr class="call">') == 3 and "model calls (3)" in sibling
    # meta.json holds the deadline as Unix seconds; the panel shows it as ISO, as every other moment.
    deadline = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.UTC) + dt.timedelta(seconds=999 * 0.5 + 600)
    assert f"<td>deadline</td><td>{deadline.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}</td>" in dom
    for size in ("1280,800", "1920,1080"):
        assert_fits_window(page, tmp_path, size)
        screenshot(page, tmp_path, f"timeline-1000-agents-{size.replace(',', 'x')}.png", size, "a3-0003e7")


def test_subtree_totals_and_unknown_cost(tmp_path: Path) -> None:
    view = load_view()
    session = synthetic_session(tmp_path / "sessions", 12)
    # The first child (a1-000001) ends without a cost: its ancestors' totals become lower bounds.
    outcome_path = session / "agents" / "a1-000001" / "outcome.json"
    outcome = load(outcome_path)
    del outcome["cost_usd"]
    outcome_path.write_text(json.dumps(outcome))
    # The second child read most of its prompt from the cache: the panel splits its tokens by kind.
    cached_path = session / "agents" / "a1-000002" / "outcome.json"
    cached = load(cached_path)
    cached["usage"] = {"input_tokens": 100, "output_tokens": 100, "cache_read_input_tokens": 2600, "cache_creation_input_tokens": 300}
    cached_path.write_text(json.dumps(cached))
    timeline = view.load_timeline(session)
    by_id = {a.id: a for a in timeline.agents}
    root = timeline.agents[0]
    assert root.id == "a0-000000" and [a.level for a in timeline.agents[:2]] == [0, 1]
    priced = sum(1 for a in timeline.agents if a.status != "refused")
    assert root.subtree_tokens == 1100 * (priced - 1) + 3100
    assert root.subtree_usage == {"input": 1000 * (priced - 1) + 100, "output": 100 * priced, "cache read": 2600, "cache write": 300}
    assert view.agent_detail(by_id["a1-000002"])["usage"] == "input 100, output 100, cache read 2.6k, cache write 300"
    assert not root.subtree_cost_known and by_id["a1-000002"].subtree_cost_known
    assert view.format_cost(root.subtree_cost_usd, root.subtree_cost_known).startswith(">=$")


def test_not_a_session_is_a_usage_error(tmp_path: Path) -> None:
    made = run_view(str(tmp_path), "-o", str(tmp_path / "t.html"))
    assert made.returncode == 2
    assert made.stderr.startswith("view: error: ") and "not a session directory" in made.stderr
    assert not (tmp_path / "t.html").exists()


def test_junk_records_cost_their_mark_not_the_page_from_any_directory(tmp_path: Path) -> None:
    """Anything with Bash can write a session file: one nested past 64 levels or a FIFO is skipped, never a crash or a hang.

    Run from another working directory: view.py finds tools/session_files.py beside itself.
    """
    session = synthetic_session(tmp_path / "sessions", 3)
    (session / "asks").mkdir(exist_ok=True)
    (session / "asks" / "q-0000ff.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(session / "agents" / "a1-000001" / "native.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    made = subprocess.run(
        [sys.executable, str(VIEW), str(session), "-o", "t.html"], cwd=elsewhere, capture_output=True, text=True, timeout=60, check=False
    )
    assert made.returncode == 0, made.stderr
    page = (elsewhere / "t.html").read_text()
    assert all(f'"id": "{agent}"' in page for agent in ("a0-000000", "a1-000001", "a1-000002"))

"""status's cache of finished agents' rows (STATUS_CACHE): never a different answer.

`status` keeps the rows of finished agents in SESSION/.status-cache.json, keyed
by the identity of their records. These tests run the real spawn.py verb over
sessions written as spawn.py writes them, and check that what users see is the
same with the cache, without it, after records change, and with a damaged cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, patch_name

import spawn

AGENTS = spawn.STATUS_CACHE_MIN_ROWS + 20  # enough finished agents for status to keep a cache


def write_session(root: Path, count: int, *, settle: bool = True) -> Path:
    """A session of one root and count-1 finished children, settled in the past
    (backdated, so that the index written at commit no longer matches; unless not settle)."""
    session = root / "session"
    agents = session / spawn.AGENTS_DIR
    agents.mkdir(parents=True)
    ids = ["a0-000000", *(f"a1-{i:06x}" for i in range(1, count))]
    now = spawn.utc_now_iso()
    for n, agent_id in enumerate(ids):
        d = agents / agent_id
        d.mkdir()
        meta = spawn.AgentMeta(
            id=agent_id,
            parent_id=None if n == 0 else ids[0],
            depth=0 if n == 0 else 1,
            max_depth=3,
            pid=os.getpid(),
            create_time=0.0,
            pgid=os.getpid(),
            trace_id="1" * 32,
            span_id="2" * 16,
            traceparent=f"00-{'1' * 32}-{'2' * 16}-01",
            task=f"task number {n}",
            tools=["Read"],
            disallowed_tools=[],
            model="sonnet",
            cwd=str(root),
            started_at=now,
            session=str(session),
            system_prompt="",
        )
        spawn.write_meta(d, meta, [])
        status = "done" if n % 3 else "failed"
        outcome = spawn.Outcome(
            id=agent_id, status=status, reason="", exit_code=0 if status == "done" else 1, ended_at=now, duration_s=1.5, cost_usd=0.001 * n
        )
        spawn.commit_outcome(d, outcome, [])
    if settle:
        backdate(agents)
    return session


def backdate(agents: Path) -> None:
    """Records written long enough ago for status to trust their mtime (STATUS_CACHE_SETTLE_S)."""
    past = time.time() - 60
    for d in agents.iterdir():
        for f in d.iterdir():
            os.utime(f, (past, past))
        os.utime(d, (past, past))


def status(session: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "spawn.py"), "status", *flags, str(session)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    return proc


def rows(session: Path) -> list[dict[str, Any]]:
    agents: list[dict[str, Any]] = json.loads(status(session, "--json").stdout)["agents"]
    return agents


def uncached(session: Path) -> list[dict[str, Any]]:
    """What status says when it has only the records to go by: no cache, no index (both put back after)."""
    saved = {name: (session / name).read_bytes() for name in (spawn.STATUS_CACHE, spawn.STATUS_INDEX) if (session / name).is_file()}
    for name in (spawn.STATUS_CACHE, spawn.STATUS_INDEX):
        (session / name).unlink(missing_ok=True)
    found = rows(session)
    (session / spawn.STATUS_CACHE).unlink(missing_ok=True)
    for name, data in saved.items():
        (session / name).write_bytes(data)
    return found


def test_status_keeps_a_cache_and_answers_the_same_with_it(tmp_path: Path) -> None:
    session = write_session(tmp_path, AGENTS)
    first = rows(session)
    assert (session / spawn.STATUS_CACHE).exists()
    assert rows(session) == first
    assert status(session).stdout == status(session).stdout
    assert len(first) == AGENTS
    assert [r["state"] for r in first[:4]] == ["failed", "done", "done", "failed"]


def test_a_record_changed_after_caching_is_read_again(tmp_path: Path) -> None:
    session = write_session(tmp_path, AGENTS)
    rows(session)
    agents = session / spawn.AGENTS_DIR
    # Damaged in place: same directory entry, new content.
    (agents / "a1-000004" / spawn.META).write_text("{not json")
    outcome = json.loads((agents / "a1-000005" / spawn.OUTCOME).read_text())
    outcome["cost_usd"] = 7.25
    (agents / "a1-000005" / spawn.OUTCOME).write_text(json.dumps(outcome))
    found = {r["id"]: r for r in rows(session)}
    assert found["a1-000004"]["state"] == spawn.Status.CORRUPT
    assert found["a1-000005"]["cost_usd"] == 7.25
    assert list(found.values()) == uncached(session)


def test_agents_added_and_removed_after_caching(tmp_path: Path) -> None:
    session = write_session(tmp_path, AGENTS)
    rows(session)
    gone = session / spawn.AGENTS_DIR / "a1-000007"
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    (session / spawn.AGENTS_DIR / "a1-000009" / spawn.OUTCOME).unlink()  # as if it had never finished
    (session / spawn.AGENTS_DIR / "a1-000009" / spawn.DONE_MARKER).unlink(missing_ok=True)
    (session / spawn.AGENTS_DIR / "a1-000009" / spawn.FAIL_MARKER).unlink(missing_ok=True)
    found = {r["id"]: r for r in rows(session)}
    assert "a1-000007" not in found
    assert found["a1-000009"]["state"] == spawn.Status.LOST  # no outcome, its process gone
    truth = uncached(session)
    for row in (found["a1-000009"], truth[8]):
        row.pop("duration_s")  # still counting for an agent without an outcome
    assert list(found.values()) == truth


@pytest.mark.parametrize(
    "cache",
    [
        b"\x00\xff garbage",
        b"[]",
        b'{"protocol": 1, "agents": {}}',
        "forged rows",
        "wrong types",
    ],
    ids=["binary", "a-list", "no-script-key", "forged-rows", "wrong-types"],
)
def test_a_damaged_or_forged_cache_never_changes_the_answer(tmp_path: Path, cache: bytes | str) -> None:
    session = write_session(tmp_path, AGENTS)
    truth = uncached(session)
    rows(session)
    path = session / spawn.STATUS_CACHE
    if isinstance(cache, bytes):
        path.write_bytes(cache)
    else:
        data = json.loads(path.read_text())
        for name, (_keys, row) in data["agents"].items():
            if cache == "forged rows" and name != "a0-000000":
                # Another agent's row: a row only ever stands for its own records.
                data["agents"][name][1] = dict(data["agents"]["a0-000000"][1])
                continue
            if cache == "wrong types":
                row["depth"], row["cost_known"] = "deep", "yes"
        path.write_text(json.dumps(data))
    assert rows(session) == truth


def test_a_small_session_keeps_no_cache(tmp_path: Path) -> None:
    session = write_session(tmp_path, 5)
    rows(session)
    assert not (session / spawn.STATUS_CACHE).exists()


def test_records_written_just_now_are_not_cached(tmp_path: Path) -> None:
    # A record changed twice within one mtime tick would look unchanged:
    # until it has settled, status reads it every time.
    session = write_session(tmp_path, AGENTS)
    # Ahead of the clock: still "just now" however long a loaded machine takes to start status.
    now = time.time() + 10 * spawn.STATUS_CACHE_SETTLE_S
    for d in (session / spawn.AGENTS_DIR).iterdir():
        os.utime(d / spawn.OUTCOME, (now, now))
    rows(session)
    assert not (session / spawn.STATUS_CACHE).exists()


# ------------------------------------------------------------------- index --
# Each committer appends its agent's finished row to STATUS_INDEX, so that the
# first status of a session reads one file instead of every record. A hint:
# checked as the cache is, and never a different answer.


def indexed_session(root: Path, count: int = AGENTS) -> Path:
    """A session as its committers left it (index and all), once its records have settled."""
    session = write_session(root, count, settle=False)
    wait_until_settled(session)
    return session


def wait_until_settled(session: Path) -> None:
    newest = max(f.stat().st_mtime for f in (session / spawn.AGENTS_DIR).glob(f"*/{spawn.OUTCOME}"))
    time.sleep(max(0.0, newest + spawn.STATUS_CACHE_SETTLE_S + 0.2 - time.time()))


def records_read(session: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[str]]:
    """tree_rows in-process, and the agent directories whose records it read."""
    read: list[str] = []
    real = spawn.read_agent_rows

    def counting(agents: str, names: Any, **kwargs: Any) -> Any:
        read.extend(names)
        return real(agents, names, **kwargs)

    patch_name(monkeypatch, "read_agent_rows", counting)
    patch_name(monkeypatch, "STATUS_PARALLEL_MIN", 10**9)
    return spawn.tree_rows(session), read


def test_the_first_status_takes_finished_rows_from_the_index_and_reads_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = indexed_session(tmp_path)
    index = session / spawn.STATUS_INDEX
    assert len(index.read_text().splitlines()) == AGENTS  # one line per commit
    truth = uncached(session)
    found, read = records_read(session, monkeypatch)
    assert (found, read) == (truth, [])
    assert rows(session) == truth  # the real verb, now with the cache
    # The cache remembers how much of the index it took in; agents committed
    # later come from the lines after that.
    assert json.loads((session / spawn.STATUS_CACHE).read_text())["index"] == [index.stat().st_ino, index.stat().st_size]
    commit_child(session, "a1-00ff01")
    commit_child(session, "a1-00ff02", "failed")
    wait_until_settled(session)
    found, read = records_read(session, monkeypatch)
    assert read == []
    assert found == uncached(session)
    assert [r["state"] for r in found if r["id"].startswith("a1-00ff")] == ["done", "failed"]


def commit_child(session: Path, name: str, status: str = "done") -> Path:
    """One more finished child of the session's root, committed as a runner commits it."""
    d = session / spawn.AGENTS_DIR / name
    d.mkdir()
    root = spawn.load_meta(session / spawn.AGENTS_DIR / "a0-000000")
    spawn.write_meta(d, dataclasses.replace(root, id=name, parent_id=root.id, depth=1, task=f"later {name}"), [])
    now = spawn.utc_now_iso()
    spawn.commit_outcome(d, spawn.Outcome(id=name, status=status, reason="", exit_code=0, ended_at=now, duration_s=2.0, cost_usd=0.5), [])
    return d


# status reads the records it has no cached row for in forked workers, one
# per CPU, once there are STATUS_PARALLEL_MIN of them. These call tree_rows
# in-process with a low threshold, so that a small session takes that path.


@pytest.fixture
def damaged_session(tmp_path: Path) -> Path:
    """Finished agents, plus one of each kind a worker must read as the serial path does."""
    session = write_session(tmp_path, 40)
    agents = session / spawn.AGENTS_DIR
    (agents / "a1-000004" / spawn.META).write_text("{not json")
    (agents / "a1-000011" / spawn.OUTCOME).write_bytes(b"\xff\x00")
    for name in (spawn.OUTCOME, spawn.DONE_MARKER, spawn.FAIL_MARKER):
        (agents / "a1-00001e" / name).unlink(missing_ok=True)  # no outcome, and its process gone
    (agents / "a1-000020" / spawn.DONE_MARKER).unlink(missing_ok=True)  # a crash before the marker
    (agents / "a1-000020" / spawn.FAIL_MARKER).unlink(missing_ok=True)
    (agents / "a1-0000ff").mkdir()  # a launch before its meta.json
    return session


def read_rows(session: Path, monkeypatch: pytest.MonkeyPatch, *, parallel: bool) -> list[dict[str, Any]]:
    patch_name(monkeypatch, "STATUS_PARALLEL_MIN", 8 if parallel else 10**9)
    (session / spawn.STATUS_CACHE).unlink(missing_ok=True)
    (session / spawn.STATUS_INDEX).unlink(missing_ok=True)
    found = spawn.tree_rows(session)
    for row in found:
        if row["id"] == "a1-00001e":
            row.pop("duration_s")  # still counting for an agent without an outcome
    return found


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids forked meanwhile, on four CPUs, as if pytest had no other thread."""
    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    patch_name(monkeypatch, "usable_cpus", lambda: 4)  # whatever this machine's CPUs and cgroup quota
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    return forked


def test_records_read_in_parallel_give_the_same_rows(damaged_session: Path, monkeypatch: pytest.MonkeyPatch, forks: list[int]) -> None:
    serial = read_rows(damaged_session, monkeypatch, parallel=False)
    assert not forks
    parallel = read_rows(damaged_session, monkeypatch, parallel=True)
    assert len(forks) == 3  # four slices: one here, three in workers
    assert parallel == serial
    states = {r["id"]: r["state"] for r in parallel}
    assert states["a1-000004"] == states["a1-000011"] == spawn.Status.CORRUPT
    assert states["a1-00001e"] == spawn.Status.LOST
    assert "a1-0000ff" not in states
    assert (damaged_session / spawn.AGENTS_DIR / "a1-000020" / spawn.DONE_MARKER).exists()  # a worker wrote it
    for pid in forks:  # every worker reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_worker_that_dies_costs_only_speed(damaged_session: Path, monkeypatch: pytest.MonkeyPatch, forks: list[int]) -> None:
    serial = read_rows(damaged_session, monkeypatch, parallel=False)
    counting_fork = os.fork

    def dying_fork() -> int:
        pid = counting_fork()
        if pid == 0:
            os._exit(3)  # as a worker killed before it answers
        return pid

    monkeypatch.setattr(os, "fork", dying_fork)
    assert read_rows(damaged_session, monkeypatch, parallel=True) == serial
    assert len(forks) == 3


def test_no_fork_to_be_had_reads_here(damaged_session: Path, monkeypatch: pytest.MonkeyPatch, forks: list[int]) -> None:
    serial = read_rows(damaged_session, monkeypatch, parallel=False)

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")  # EAGAIN: a pids limit

    monkeypatch.setattr(os, "fork", no_fork)
    assert read_rows(damaged_session, monkeypatch, parallel=True) == serial


def test_a_process_with_threads_never_forks(damaged_session: Path, monkeypatch: pytest.MonkeyPatch, forks: list[int]) -> None:
    serial = read_rows(damaged_session, monkeypatch, parallel=False)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # status --watch's, an agent's runner
    assert read_rows(damaged_session, monkeypatch, parallel=True) == serial
    assert not forks


def test_a_fifo_or_a_directory_where_a_record_belongs_is_corrupt_not_a_hang(tmp_path: Path) -> None:
    # Anything with Bash can put one there; status, and wait, must still answer.
    session = write_session(tmp_path, 6)
    agents = session / spawn.AGENTS_DIR
    for name, record, kind in [
        ("a1-000001", spawn.META, "fifo"),
        ("a1-000002", spawn.OUTCOME, "fifo"),
        ("a1-000004", spawn.OUTCOME, "dir"),
        ("a1-000005", spawn.NATIVE_LOG, "fifo"),  # read by status too, for native subagents' rows
    ]:
        path = agents / name / record
        path.unlink(missing_ok=True)
        os.mkfifo(path) if kind == "fifo" else path.mkdir()
    states = {r["id"]: r["state"] for r in rows(session)}
    assert states["a1-000001"] == states["a1-000002"] == states["a1-000004"] == spawn.Status.CORRUPT
    assert states["a1-000005"] == spawn.Status.DONE
    waited = subprocess.run(
        [sys.executable, str(ROOT / "spawn.py"), "wait", "--session", str(session), "a1-000002", "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert waited.returncode == spawn.ExitCode.STATE
    assert waited.stderr.startswith("spawn: error: corrupt record") and "not a regular file" in waited.stderr


def test_a_record_that_comes_in_short_reads_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A network file system may answer a read with less than was asked for.
    path = tmp_path / "record.json"
    record = {"text": "x" * 5000, "cost_usd": 0.25}
    path.write_text(json.dumps(record))
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 700)))
    data, keys = spawn.read_record(path)
    assert data == record
    assert keys[1] == path.stat().st_size


SMALL = 30  # below STATUS_CACHE_MIN_ROWS: no cache to hide what the index does


@pytest.fixture(scope="module")
def small_indexed_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], bytes]:
    """One settled session for every damage below (each puts the index back): the session, its truth, its index."""
    session = indexed_session(tmp_path_factory.mktemp("indexed"), SMALL)
    return session, uncached(session), (session / spawn.STATUS_INDEX).read_bytes()


@pytest.mark.parametrize("damage", ["junk", "torn-line", "forged-rows", "wrong-keys", "wrong-types", "fifo", "link", "oversized"])
def test_a_damaged_or_forged_index_never_changes_the_answer(
    small_indexed_session: tuple[Path, list[dict[str, Any]], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    session, truth, original = small_indexed_session
    index = session / spawn.STATUS_INDEX
    lines = [json.loads(line) for line in original.decode().splitlines()]
    if damage == "junk":
        index.write_bytes(b"\x00\xff junk\n[1, 2]\n" + original[:200] + b'\n{}\n"a"\n')
    elif damage == "torn-line":
        index.write_bytes(original + b'{"name": "a1-000003", "keys": [1, 2')
    elif damage == "forged-rows":
        # Another agent's row, under this agent's name and keys: a row stands only for its own records.
        root_row = lines[0]["row"]
        index.write_text("".join(json.dumps({**e, "row": root_row}) + "\n" for e in lines))
    elif damage == "wrong-keys":
        index.write_text("".join(json.dumps({**e, "keys": [k + 1 for k in e["keys"]]}) + "\n" for e in lines))
    elif damage == "wrong-types":
        index.write_text("".join(json.dumps({**e, "row": {**e["row"], "depth": "deep"}}) + "\n" for e in lines))
    elif damage == "fifo":
        index.unlink()
        os.mkfifo(index)  # opened, it would block a reader that waits for a writer
    elif damage == "link":
        elsewhere = tmp_path / "elsewhere.jsonl"
        elsewhere.write_bytes(original)
        index.unlink()
        index.symlink_to(elsewhere)
    elif damage == "oversized":
        patch_name(monkeypatch, "STATUS_INDEX_MAX_BYTES", len(original) - 1)
    try:
        if damage != "oversized":  # (a limit set here, in-process only)
            assert rows(session) == truth  # the real verb: nothing hangs, nothing differs
        found, read = records_read(session, monkeypatch)
        assert found == truth
        if damage == "torn-line":
            assert read == []  # the whole lines before it are used; the torn one waits for its end
        else:
            assert len(read) >= SMALL - 1  # nothing usable (but the root's own row, forged-rows): read from the records
    finally:
        index.unlink()
        index.write_bytes(original)
    assert not (session / spawn.STATUS_CACHE).exists()


def test_a_record_replaced_after_its_commit_is_read_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = indexed_session(tmp_path)
    d = session / spawn.AGENTS_DIR / "a1-000005"
    outcome = json.loads((d / spawn.OUTCOME).read_text())
    tmp = d / "outcome.new"
    tmp.write_text(json.dumps({**outcome, "cost_usd": 9.5}))
    os.replace(tmp, d / spawn.OUTCOME)
    past = time.time() - 60
    os.utime(d / spawn.OUTCOME, (past, past))
    found, read = records_read(session, monkeypatch)
    assert read == ["a1-000005"]
    assert {r["id"]: r["cost_usd"] for r in found}["a1-000005"] == 9.5
    assert found == uncached(session)


@pytest.mark.parametrize("planted", ["link", "fifo", "directory"])
def test_a_commit_never_writes_through_what_is_planted_at_the_index(tmp_path: Path, planted: str) -> None:
    session = write_session(tmp_path, 2, settle=False)
    index = session / spawn.STATUS_INDEX
    index.unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    if planted == "link":
        index.symlink_to(victim)
    elif planted == "fifo":
        os.mkfifo(index)
    else:
        index.mkdir()
    d = commit_child(session, "a1-00ff01")  # returns: a FIFO is never waited on
    assert (d / spawn.DONE_MARKER).exists()
    assert spawn.read_outcome(d) is not None
    assert victim.read_text() == "untouched\n"
    assert index.is_symlink() == (planted == "link")
    assert [r["id"] for r in rows(session)] == ["a0-000000", "a1-000001", "a1-00ff01"]

"""spawn.py --resume: a new agent that continues a finished agent's conversation."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import MockModel, load, metas, mock_task, run_spawn, start_spawn, stdout_json, validate_records, wait_for_path

import spawn


def test_resume_continues_the_conversation_as_a_new_agent(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    # The scripted model picks its reply by how many assistant turns the request holds,
    # so "second answer" proves the resumed request carried the earlier turns.
    first = stdout_json(run_spawn(["--task", mock_task("remember 42", [{"text": "first answer"}, {"text": "second answer"}])], env))
    assert first["output"] == "first answer"
    resumed = run_spawn(["--resume", first["id"], "--task", "what did I ask you to remember?", "--tools", "Read,Bash"], env)
    out = stdout_json(resumed)
    assert out["status"] == "done", resumed.stderr
    assert out["output"] == "second answer"
    assert out["id"] != first["id"]

    tree = metas(session_root)
    assert len({m["session"] for m in tree.values()}) == 1  # same session
    meta = tree[out["id"]]
    assert meta["resumed_from"] == first["id"]
    assert "parent_id" not in meta  # beside the original, a root like it
    assert meta["depth"] == 0
    assert meta["tools"] == ["Read"]  # Bash was not the original's: narrowed away, and said so
    assert any("Bash" in w for w in meta["warnings"])

    last = mock_model.requests()[-1]
    assert last["n_messages"] >= 3, last  # the original's task and answer, then the follow-up
    assert load(Path(meta["session"]) / "agents" / out["id"] / "outcome.json")["status"] == "done"

    status = run_spawn(["status", meta["session"]], env)
    assert f"{out['id']} ⟲ {first['id']}" in status.stdout
    validate_records(session_root)


def test_resume_refuses_unknown_running_and_sessionless(env: dict[str, str], session_root: Path) -> None:
    unknown = run_spawn(["--resume", "a0-nosuch", "--task", "more"], env)
    assert unknown.returncode == spawn.ExitCode.USAGE
    assert "a0-nosuch" in unknown.stderr
    assert not session_root.exists() or not list(session_root.glob("*/agents/*"))

    running = start_spawn(["--background", "--tools", "Bash", "--task", mock_task("wait", [{"bash": "echo busy; sleep 30"}])], env)
    started = stdout_json_text(running.communicate(timeout=60)[0])
    wait_for_path(Path(str(started["agent_dir"])) / "meta.json")
    busy = run_spawn(["--resume", str(started["id"]), "--task", "more"], env)
    assert busy.returncode == spawn.ExitCode.USAGE
    assert "still running" in busy.stderr
    assert len(list(session_root.glob("*/agents/*"))) == 1  # nothing written

    assert run_spawn(["kill", str(started["id"])], env).returncode == spawn.ExitCode.OK

    # Refused, it never ran: its outcome has no SDK session to continue. (A killed agent may
    # or may not have one: the CLI can report its session as it is stopped.)
    refused = run_spawn(["--task", "anything"], {**env, "SPAWN_DEPTH": "2", "SPAWN_MAX_DEPTH": "2"})
    assert refused.returncode == spawn.ExitCode.REFUSED, refused.stderr
    refused_id = str(json.loads(refused.stdout)["id"])
    nosession = run_spawn(["--resume", refused_id, "--task", "more"], env)
    assert nosession.returncode == spawn.ExitCode.USAGE, nosession.stderr
    assert "no SDK session" in nosession.stderr and "status refused" in nosession.stderr
    assert len(list(session_root.glob("*/agents/*"))) == 2  # the two above, nothing more


def stdout_json_text(text: str) -> dict[str, object]:
    data = json.loads(text.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data

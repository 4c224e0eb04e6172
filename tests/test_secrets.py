"""Secrets stay out of every record, whatever their shape and wherever they appear."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import FAKE_API_KEY, load, mock_task, run_spawn

import spawn

# Quotes and backslashes: the JSON encoder escapes them, so redacting the
# encoded text would miss this value.
AWKWARD_SECRET = 'Quux"Zebra\\Kestrel-9917'


def test_redaction_happens_before_serialising() -> None:
    record = {"task": f"use {AWKWARD_SECRET}", "nested": [{"k": AWKWARD_SECRET}], AWKWARD_SECRET: 1, "n": 3}
    text = json.dumps(spawn.redact_values(record, [AWKWARD_SECRET]))
    assert "Zebra" not in text
    assert json.loads(text) == {"task": "use [REDACTED]", "nested": [{"k": "[REDACTED]"}], "[REDACTED]": 1, "n": 3}
    assert "Zebra" not in spawn.redacted_json(record, [AWKWARD_SECRET], indent=2)


def test_secret_in_the_task_reaches_no_name_and_no_record(env: dict[str, str], session_root: Path) -> None:
    env = {**env, "MY_SERVICE_TOKEN": AWKWARD_SECRET}
    task = mock_task(f"Deploy with token {AWKWARD_SECRET} and key {FAKE_API_KEY} now", [{"text": "deployed"}])
    proc = run_spawn(["--task", task], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (session,) = session_root.iterdir()
    names = [p.name.lower() for p in [session, *session.rglob("*")]]
    files = [p for p in session.rglob("*") if p.is_file()]
    assert files
    # Neither the value nor any lowercased, slugified or JSON-escaped piece of
    # it. Its digits count only outside a uuid: records hold dozens of them,
    # and a uuid has 9917 in it about once in 2,000.
    piece = re.compile(r"zebra|kestrel|(?<![0-9a-f-])9917(?![0-9a-f-])|do-not-leak|0123456789")
    for name in names:
        assert not piece.search(name), name
    for path in files:
        text = path.read_text(errors="replace").lower()
        assert not piece.search(text), (path, piece.search(text))
    assert load(session / "session.json")["topic"].startswith("deploy-with-token-redacted")
    assert not piece.search(proc.stdout.lower())

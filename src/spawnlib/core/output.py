"""What spawn.py says: data on stdout (a parent agent's Bash reads it), notes on stderr.

Low in the layers because every layer above reports progress through note().
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any


def stdout_json_text(value: Any) -> str:
    """JSON for stdout: indented for a person at a terminal; one line when piped,
    as a parent agent's Bash and CI read it."""
    return json.dumps(value, ensure_ascii=False, default=str, indent=2 if sys.stdout.isatty() else None)


def emit(data: Mapping[str, Any]) -> None:
    sys.stdout.write(stdout_json_text(data) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    print(f"spawn: {message}", file=sys.stderr, flush=True)

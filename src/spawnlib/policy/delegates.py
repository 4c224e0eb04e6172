from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

from ..core.embedded import builtin_files
from .agents import BUILTIN_AGENTS, agent_dirs_for, load_definitions

# ------------------------------------------------- definitions in a briefing --

# An agent that may spawn is told which definitions it can delegate to, by
# name and description, in the briefing its CLI starts with. Reading them
# means YAML: its import and eight frontmatters took about 30 ms of CPU at the
# root, before its CLI could start, and again at every level that may spawn.
# The built-in definitions spell both fields in one plain form, which these
# patterns read exactly as YAML does (test_delegates holds the two reads to
# the same answer); anything else, and every file of the user's or the
# project's, is read by load_definitions.
BUILTIN_NAME = re.compile(r"^name: ([a-z][a-z0-9-]*)$", re.MULTILINE)
BUILTIN_DESCRIPTION = re.compile(r'^description: "([^"\\\n]+)"$', re.MULTILINE)
# Plain scalars YAML 1.1 reads as something other than a string.
YAML_NOT_STRINGS = frozenset(("y", "n", "yes", "no", "true", "false", "on", "off", "null"))


def delegates_in(cwd: Path, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, description) of every definition load_definitions finds from cwd, in its order."""
    if not any(any(folder.rglob("*.md")) for folder, _ in agent_dirs_for(cwd, environ)):
        fast = builtin_delegates()
        if fast is not None:
            return list(fast)
    definitions, _ = load_definitions(cwd, environ)
    return [(d.name, d.description) for d in definitions.values()]


@functools.cache
def builtin_delegates() -> tuple[tuple[str, str], ...] | None:
    """The built-in definitions' names and descriptions, without YAML; None if one isn't in the plain form."""
    found: list[tuple[str, str]] = []
    for file_name, text in builtin_files(BUILTIN_AGENTS).items():
        lines = text.splitlines()
        # Where parse_definition finds the frontmatter: the first line that strips to '---' closes it.
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if lines[0] != "---" or end is None:
            return None
        frontmatter = "\n".join(lines[1:end])
        names, descriptions = BUILTIN_NAME.findall(frontmatter), BUILTIN_DESCRIPTION.findall(frontmatter)
        if len(names) != 1 or len(descriptions) != 1 or names[0] != Path(file_name).stem or names[0] in YAML_NOT_STRINGS:
            return None
        if any(name == names[0] for name, _ in found):
            return None
        found.append((names[0], descriptions[0]))
    return tuple(found)

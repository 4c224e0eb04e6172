from __future__ import annotations

# --------------------------------------------------------- built-in files --

# spawn.py copied alone into a project must still run README's commands, so it
# carries the default output schemas (schemas/*.json but RECORD_SCHEMAS), agent
# definitions (.claude/agents/*.md) and workflows (workflows/*.yaml). A file of
# the project's own wins: schemas/ beside the script, .claude/agents upward
# from the working directory or in HOME, workflows/ beside the script.


def builtin_files(folder: str) -> dict[str, str]:
    """The built-in files of folder (schemas, .claude/agents, workflows): file name -> text."""
    prefix = folder.rstrip("/") + "/"
    return {path.removeprefix(prefix): text for path, text in BUILTIN_FILES.items() if path.startswith(prefix)}


def builtin_label(path: str) -> str:
    """How messages and records name a built-in file: what to create to override it."""
    return f"built-in {path}"


# Repository path -> text. tools/bundle.py writes it into spawn.py from the
# files themselves, which stay the only copy to edit; in the package, which
# is never run, it stays empty. This assignment must stay the module's last.
BUILTIN_FILES: dict[str, str] = {}

"""`uv` in a sandboxed agent's Bash: `uv run [options] PATH/spawn.py ARGS` runs the tree's own spawn.py.

uv can't open its cache in a sandbox: the cache is read-only there, as it
must be (an agent that could write it would run its code outside the
sandbox at the next `uv run`). Yet `uv run spawn.py ...` is how users and
agents start a child, and what uv would run is the environment the tree
already runs: $SPAWN_PYTHON on $SPAWN_PY. Anything else goes to the next
uv on PATH, which says for itself what it can't do. Run as `python -I -S`
from its folder's `uv` (a two-line sh): builtin modules only.
"""

import os
import sys

# `uv run` options that come before the script: those that take a value
# (uv run --help), and those that don't. Any other option is left to uv.
VALUED = (
    "--python", "-p", "--with", "--with-editable", "--with-requirements", "--directory", "--project", "--cache-dir",
    "--env-file", "--index", "--default-index", "--index-url", "--extra-index-url", "--find-links", "-f", "--exclude-newer",
    "--config-file", "--color", "--python-preference", "--index-strategy", "--resolution", "--prerelease", "--link-mode",
)  # fmt: skip
FLAGS = (
    "--script", "-s", "-q", "--quiet", "-v", "--verbose", "--no-project", "--frozen", "--locked", "--offline", "--no-sync",
    "--isolated", "--no-config", "--no-progress", "--native-tls", "--no-cache", "-n", "--active", "--no-env-file",
    "--exact", "--all-extras", "--no-dev", "--compile-bytecode", "--refresh", "--managed-python", "--no-managed-python",
)  # fmt: skip
SCRIPT_NAME = "spawn.py"


def spawn_arguments(argv: "list[str]") -> "list[str] | None":
    """The arguments after spawn.py when argv is `run [options] [--] PATH/spawn.py ARGS`; None for anything else."""
    if argv[:1] != ["run"]:
        return None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break
        if word in VALUED:
            i += 2
        elif word in FLAGS or (word.startswith("--") and "=" in word and word.split("=", 1)[0] in VALUED):
            i += 1
        else:
            return None
    if i < len(argv) and os.path.basename(argv[i]) == SCRIPT_NAME:
        return argv[i + 1 :]
    return None


def real_uv(here: str) -> "str | None":
    """The next uv on PATH after this one's folder."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or os.path.realpath(folder) == here:
            continue
        candidate = os.path.join(folder, "uv")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def main() -> None:
    argv = sys.argv[1:]
    here = os.path.realpath(os.path.dirname(os.path.abspath(sys.argv[0])))
    rest = spawn_arguments(argv)
    python, script = os.environ.get("SPAWN_PYTHON"), os.environ.get("SPAWN_PY")
    if rest is not None and python and script:
        os.execv(python, [python, script, *rest])
    uv = real_uv(here)
    if uv is None:
        sys.stderr.write("uv: command not found\n")
        sys.exit(127)
    os.execv(uv, [uv, *argv])


if __name__ == "__main__":
    main()

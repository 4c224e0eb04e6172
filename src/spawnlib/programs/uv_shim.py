"""`uv` in an agent's Bash: `uv run [options] PATH/spawn.py ARGS` without uv, where uv adds nothing.

`uv run spawn.py ...` is how users, skills and scripts start a child. uv
would resolve the script's environment again at every level (0.15 to 0.3 s),
and find the one the tree already runs: $SPAWN_PYTHON.

- Outside a sandbox, when the script has the very bytes the tree's spawn.py
  has (the checked hash in $SPAWN_PY's header, PEP 552: the same PEP 723
  block, so the same environment) and no option but INERT ones is given,
  the tree's interpreter runs that script. Anything else is uv's.
- Inside a sandbox uv can't open its cache: the cache is read-only there, as
  it must be (an agent that could write it would run its code outside the
  sandbox at the next `uv run`). So `uv run [options] PATH/spawn.py` runs the
  tree's own spawn.py, $SPAWN_PY, whatever the options.

Anything else goes to the next uv on PATH, which says for itself what it
can't do. Run as `python -I -S` from its folder's `uv` (a two-line sh):
builtin modules only.
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
# Options that change nothing about what runs, nor where: with any other,
# outside a sandbox, uv runs it.
INERT = ("--script", "-s", "-q", "--quiet", "--no-progress", "--offline", "--frozen", "--no-project")
SCRIPT_NAME = "spawn.py"
PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # fast_start_hook's: a hash-based pyc, checked against its source


def spawn_run(argv: "list[str]") -> "tuple[list[str], str, list[str]] | None":
    """(uv's options, PATH/spawn.py, the arguments after it) when argv is
    `run [options] [--] PATH/spawn.py ARGS`; None for anything else."""
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
        return [w for w in argv[1:i] if w != "--"], argv[i], argv[i + 1 :]
    return None


def same_bytes(script: str, copy: str) -> bool:
    """Whether script holds the bytes the tree's spawn.py has: copy's, or those its header's checked hash was taken of."""
    import _frozen_importlib_external as bootstrap
    import _imp

    try:
        with open(script, "rb") as fh:
            source = fh.read()
        with open(copy, "rb") as fh:
            header = fh.read(16) if copy.endswith(".pyc") else fh.read()
    except OSError:
        return False
    if not copy.endswith(".pyc"):  # the tree runs its source: no copy was made
        return header == source
    magic = bootstrap.MAGIC_NUMBER
    return header == magic + PYC_CHECKED_HASH + _imp.source_hash(int.from_bytes(magic, "little"), source)


def inside_sandbox() -> bool:
    """bwrap is pid 1 of a sandbox's own pid namespace (processes.inside_sandbox)."""
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            return os.path.basename(fh.read().split(b"\0")[0]) == b"bwrap"
    except OSError:
        return False


def tree_command(argv: "list[str]", environ: "dict[str, str] | os._Environ[str]", sandboxed: bool) -> "list[str] | None":
    """What runs `uv argv` with the tree's interpreter instead; None: uv's to run."""
    found = spawn_run(argv)
    python, copy = environ.get("SPAWN_PYTHON"), environ.get("SPAWN_PY")
    if found is None or not python or not copy:
        return None
    options, script, rest = found
    if sandboxed:
        return [python, copy, *rest]
    if all(option in INERT for option in options) and same_bytes(script, copy):
        return [python, script, *rest]  # its own path: schemas/ beside it, its own compiled copy
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
    command = tree_command(argv, os.environ, inside_sandbox())
    if command is not None:
        os.execv(command[0], command)
    uv = real_uv(here)
    if uv is None:
        sys.stderr.write("uv: command not found\n")
        sys.exit(127)
    os.execv(uv, [uv, *argv])


if __name__ == "__main__":
    main()

"""The compiled copy of spawn.py that children start from, and the .pth hook that finds the stand-in."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..core.constants import SCRIPT_PATH
from ..core.errors import SpawnError
from ..programs import program_text
from ..programs.fast_start_hook import (
    COMPILED_DIR,
    COMPILED_HASH_KEY,
    COMPILED_MODE_FORBIDDEN,
    ENV_NO_FAST_START,
    FAST_START_MODULE,
    compiled_name,
    copy_is_trusted,
)
from ..session.protocol import cache_dir, read_regular_file, write_file_atomic

# 1: install the hook into the virtual environment running spawn.py even when
# it is the user's own (a `uv venv` that `uv pip install .` filled); by
# default only an environment that lives in a tool's cache gets it.
ENV_FAST_START = "SPAWN_FAST_START"

# ------------------------------------------------------------- fast start --

# A script run as `python spawn.py` is compiled on every start (only imported
# modules get cached bytecode): ~200 ms of this 9,000-line file, at every
# level. So the first spawn.py of a tree compiles it once into the per-user
# cache, and children, guards and runners run that copy. Where the copies go,
# their names and when one is trusted: programs/fast_start_hook.py, which
# both spawn.py and the hook run.
# `uv run spawn.py`, as users and agents write it, would still compile the
# source at every level. So a run from source puts a start-up hook into the
# virtual environment running it (uv's own, for `uv run`): a .pth line that
# site runs at every interpreter start there. When the script named on the
# command line has a compiled copy, the hook runs that copy, with the same
# argv and pid, in the same interpreter once site has finished; anything
# else starts as usual.
FAST_START_HOOK = program_text("fast_start_hook")
# `uv` on a sandboxed agent's PATH (programs/uv_shim.py says why): the
# program, and the sh that runs it with the tree's Python, in a folder of
# the cache named by their hash. The cache is read-only in every sandbox.
UV_SHIM = program_text("uv_shim")
# The sh hands a command naming a spawn.py to the program, and any other
# straight to the next uv on PATH, with no interpreter's start (~25 ms) for
# an agent's other uv commands.
UV_SHIM_SH = """#!/bin/sh
for word; do
    case $word in *spawn.py) exec "${SPAWN_PYTHON:-python3}" -I -S "${0%/uv}/uv_shim.py" "$@" ;; esac
done
set -f
IFS=:
for folder in $PATH; do
    [ -n "$folder" ] && [ "$folder" != "${0%/uv}" ] && [ -x "$folder/uv" ] && [ ! -d "$folder/uv" ] && exec "$folder/uv" "$@"
done
echo "uv: command not found" >&2
exit 127
"""


def copy_fingerprint(path: Path) -> tuple[int, ...]:
    """What changes when a file is written or replaced: a write moves its
    ctime, which no user can set back; a rename brings another inode."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def compile_copy(folder: Path, target: Path) -> None:
    """Compile this spawn.py into target: under a fresh name first (py_compile
    renames its own temporary file onto it), made writable by the user alone
    whatever the source's mode, then renamed over whatever is at target, a
    link included, which is replaced and never followed."""
    import py_compile

    fresh = folder / f".{target.name}.{os.getpid()}.tmp"
    try:
        py_compile.compile(
            str(SCRIPT_PATH),
            cfile=str(fresh),
            dfile=str(SCRIPT_PATH),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        os.chmod(fresh, 0o644)
        os.replace(fresh, target)
    except py_compile.PyCompileError as exc:
        raise OSError(str(exc)) from None
    finally:
        with contextlib.suppress(OSError):
            fresh.unlink()


@functools.cache
def verified_copy() -> tuple[Path, tuple[int, ...]] | None:
    """The compiled copy to hand out and its fingerprint when checked, or None for the source.

    A process already running a compiled copy hands on that same copy, so a
    whole tree runs one version even if the source is edited meanwhile. Any
    other copy is checked (copy_is_trusted), and one that fails is compiled
    afresh. Any failure (a read-only cache, inside a sandbox) falls back to
    the source.
    """
    try:
        if Path(__file__).suffix == ".pyc":
            own = Path(__file__).resolve()
            return own, copy_fingerprint(own)
        source = SCRIPT_PATH.read_bytes()
        folder = cache_dir(os.environ) / COMPILED_DIR
        target = folder / compiled_name(SCRIPT_PATH, source)
        if not copy_is_trusted(folder, target, source):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(folder)
            if st.st_uid == os.getuid() and st.st_mode & COMPILED_MODE_FORBIDDEN:
                # Made by an older spawn.py under a umask of 002: every copy in it is checked one by one.
                os.chmod(folder, st.st_mode & ~COMPILED_MODE_FORBIDDEN)
            compile_copy(folder, target)
            if not copy_is_trusted(folder, target, source):
                return None
        return target, copy_fingerprint(target)
    except OSError:
        return None


def compiled_script() -> Path:
    """The file to execute for this spawn.py: its compiled copy, else its source.

    Every call hands it out afresh (to a runner, a guard, the CLI's
    environment, a briefing): a copy changed since it was checked is checked
    again, and compiled again if it fails, rather than handed on.
    """
    found = verified_copy()
    if found is None:
        return SCRIPT_PATH
    with contextlib.suppress(OSError):
        if copy_fingerprint(found[0]) == found[1]:
            return found[0]
    if Path(__file__).suffix == ".pyc":
        return SCRIPT_PATH  # the copy this process runs changed under it: never hand that on
    verified_copy.cache_clear()
    found = verified_copy()
    return found[0] if found is not None else SCRIPT_PATH


def uv_shim_folder(environ: Mapping[str, str]) -> Path | None:
    """The cache's folder holding the `uv` shim, written if absent or not ours as it should be; None where it can't be."""
    import _imp  # builtin: every agent's start writes or checks the shim, and hashlib's import is ~4 ms of it

    files = {"uv_shim.py": (UV_SHIM.encode(), 0o644), "uv": (UV_SHIM_SH.encode(), 0o755)}
    digest = _imp.source_hash(COMPILED_HASH_KEY, UV_SHIM.encode() + UV_SHIM_SH.encode()).hex()
    folder = cache_dir(environ) / f"uv-shim-{digest}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, (body, mode) in files.items():
            path = folder / name
            with contextlib.suppress(OSError, SpawnError):
                st = os.lstat(path)
                ours = st.st_uid == os.getuid() and not st.st_mode & COMPILED_MODE_FORBIDDEN and st.st_mode & 0o777 == mode
                if ours and read_regular_file(path, len(body) + 1)[0] == body:
                    continue
            write_file_atomic(path, body)
            os.chmod(path, mode)
        st = os.lstat(folder)
        return folder if st.st_uid == os.getuid() and not st.st_mode & COMPILED_MODE_FORBIDDEN else None
    except OSError:
        return None


def in_a_cache(prefix: Path) -> bool:
    """Does this environment live in a tool's cache, as `uv run spawn.py`'s does (uv's
    environments-v2)? Cache roots carry a CACHEDIR.TAG (uv's does); a user's own
    virtualenv doesn't sit in one, and nothing is written into it uninvited."""
    # The tag stands at the cache's root, one or two folders above an environment it
    # made (uv: CACHE/environments-v2/NAME, nox: .nox/SESSION); a virtualenv deeper
    # down (a project's checkout inside a cache's temp folder) is a user's own.
    return any((folder / "CACHEDIR.TAG").is_file() for folder in prefix.parents[:2])


def fast_start_site(environ: Mapping[str, str] | None = None) -> Path | None:
    """The site-packages to install the hook into: the virtual environment running us when it is
    uv's own for the script, or any one when SPAWN_FAST_START=1; None for a base interpreter."""
    if sys.prefix == sys.base_prefix:
        return None
    if environ is not None and environ.get(ENV_FAST_START) != "1" and not in_a_cache(Path(sys.prefix).resolve()):
        return None
    import sysconfig

    site = Path(sysconfig.get_path("purelib"))
    return site if site.is_relative_to(sys.prefix) else None


def install_fast_start(environ: Mapping[str, str]) -> None:
    """Put the start-up hook (FAST_START_HOOK) into the virtual environment running this source.

    Never into a base interpreter's site-packages, which every program on
    the machine shares, nor, unless SPAWN_FAST_START=1 asks, into a user's own
    virtualenv (fast_start_site). The module goes first: a .pth line naming a missing
    module would print an error at every start. Best effort: a read-only
    environment (inside a sandbox) just keeps compiling.
    """
    if environ.get(ENV_NO_FAST_START) == "1" or Path(__file__).suffix != ".py":
        return  # and a compiled copy never pays for the sysconfig import below
    site = fast_start_site(environ)
    if site is None:
        return
    files = ((f"{FAST_START_MODULE}.py", FAST_START_HOOK), (f"{FAST_START_MODULE}.pth", f"import {FAST_START_MODULE}\n"))
    for name, text in files:
        path = site / name
        # read_regular_file and write_file_atomic: a FIFO or a link planted
        # at either name is neither waited on nor followed.
        with contextlib.suppress(OSError, SpawnError):
            if read_regular_file(path)[0] == text.encode():
                continue
        try:
            write_file_atomic(path, text.encode())
        except OSError:
            return

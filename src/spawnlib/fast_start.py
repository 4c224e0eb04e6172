from __future__ import annotations
import __future__

import contextlib
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .constants import ENV_SESSION, SCRIPT_PATH
from .errors import SpawnError
from .protocol import cache_dir, read_regular_file, write_file_atomic
from .standin import ENV_NO_FORKSERVER, FORKSERVER_SOCKET

# ------------------------------------------------------------- fast start --

# A script run as `python spawn.py` is compiled on every start (only imported
# modules get cached bytecode): ~200 ms of this 9,000-line file, at every
# level. So the first spawn.py of a tree compiles it once into the per-user
# cache, and children, guards and runners run that copy. A copy is named by
# the source's path and bytes: the path because the code finds schemas/ and
# sessions/ beside the file it was compiled from, so two projects' identical
# copies must not share one.
COMPILED_DIR = "compiled"
COMPILED_HASH_KEY = 0x7370_6177_6E  # any fixed key: the name carries the cache tag too
# A copy is run or handed out only when copy_is_trusted: the cache folder and
# the copy are the user's and nobody else's to replace, the copy is a regular
# file, and its header says it was compiled from the source's own bytes (a
# checked-hash pyc, PEP 552): the name alone is no proof, as any file can be
# put at a name. The header is no signature either: what keeps a forged copy
# out is that no contained agent can write the cache (README: "Guarantees").
COMPILED_MODE_FORBIDDEN = 0o022  # group- or other-writable: another user's to replace
PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # PEP 552 flags: hash-based, checked against the source
# `uv run spawn.py`, as users and agents write it, would still compile the
# source at every level. So a run from source puts a start-up hook into the
# virtual environment running it (uv's own, for `uv run`): a .pth line that
# site runs at every interpreter start there. When the script named on the
# command line has a compiled copy, the hook execs the same interpreter on
# that copy, with the same argv and pid; anything else starts as usual.
ENV_NO_FAST_START = "SPAWN_NO_FAST_START"  # 1: neither install nor use the hook
FAST_START_MODULE = "_spawn_fast_start"
# For a nested spawn, the hook also runs the stand-in (the first section of
# this file) itself, from the script's own bytes: when the session's fork
# server takes the spawn, no second interpreter starts to load the copy
# (~20 ms a level). The section runs from its banner up to the line that
# calls it, and only if that line calls it as the hook does (another
# version's may not); test_fast_start checks both are found, once each.
STAND_IN_START = "\n# " + "-" * 51 + " fork server: stand-in --\n"
STAND_IN_END = '\nif __name__ == "__main__" and (_served := forkserver_stand_in(sys.argv[1:], os.environ)) is not None:\n'
ANNOTATIONS_FLAG = __future__.annotations.compiler_flag  # the section's own `from __future__ import annotations`
# The hook's own code, written beside the .pth. It repeats cache_dir and
# compiled_name (test_fast_start checks they agree): it runs before any of
# this file is read. Builtin modules only; for every other program it costs
# a look at sys.argv, or for a .py file one read and a few stats.
FAST_START_HOOK = f'''"""Written by spawn.py (README: "Fast start"); SPAWN_NO_FAST_START=1 turns it off.

Runs at every interpreter start in this environment, from {FAST_START_MODULE}.pth.
If the script on the command line has a compiled copy in spawn.py's cache,
exec the same interpreter on that copy instead of compiling the source.
Remove {FAST_START_MODULE}.pth to remove it.
"""

import os
import stat
import sys


def cache_dir(environ):
    if environ.get("SPAWN_CACHE_DIR"):
        return os.path.expanduser(environ["SPAWN_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(base), "spawn")


def compiled_name(path, source):
    import _imp

    digest = _imp.source_hash({COMPILED_HASH_KEY:#x}, os.fsencode(path) + b"\\0" + source).hex()
    return "spawn-" + digest + "." + sys.implementation.cache_tag + ".pyc"


def copy_is_trusted(folder, copy, source):
    """Ours, a regular file (not a link), nobody else's to replace, and compiled from source."""
    import _frozen_importlib_external as bootstrap
    import _imp

    try:
        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for st in (os.stat(folder), os.fstat(fd)):
            if st.st_uid != os.getuid() or st.st_mode & {COMPILED_MODE_FORBIDDEN:#o}:
                return False
        header = os.read(fd, 16) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    expected = bootstrap.MAGIC_NUMBER + {PYC_CHECKED_HASH!r} + _imp.source_hash(bootstrap._RAW_MAGIC_NUMBER, source)
    return header == expected


def compiled_copy(script, environ):
    """The compiled copy to run for script, and the script's bytes; or None."""
    if not script.endswith(".py") or environ.get("{ENV_NO_FAST_START}") == "1" or sys.flags.optimize:
        return None
    try:
        path = os.path.realpath(script)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO's bytes are the script's: Python must read them, not us
        with open(path, "rb") as fh:
            source = fh.read()
        folder = os.path.join(cache_dir(environ), "{COMPILED_DIR}")
        copy = os.path.join(folder, compiled_name(path, source))
    except (OSError, ValueError):
        return None
    # A planted or stale copy is never run: the source runs instead.
    return (copy, source) if copy_is_trusted(folder, copy, source) else None


def stand_in(copy, source):
    """Hand this spawn to its session's fork server from here, as the copy's
    first lines would: the same code, compiled from the script's own bytes
    (its stand-in section), minus an interpreter's start. Returns only if
    the server doesn't take it (none, a refusal, a verb it doesn't run):
    then the copy runs, and asks again itself.
    """
    start = source.find({STAND_IN_START.encode()!r})
    end = source.find({STAND_IN_END.encode()!r}, start)
    if start < 0 or end < 0:
        return
    try:
        # The file's own future import, and its own line numbers in a traceback.
        code = compile(b"\\n" * source.count(b"\\n", 0, start) + source[start:end], sys.argv[0], "exec", {ANNOTATIONS_FLAG:#x}, True)
        scope = {{"__name__": "{FAST_START_MODULE}.stand_in", "__file__": copy}}
        exec(code, scope)
        ask = scope["forkserver_stand_in"]
    except Exception:
        return
    try:
        served = ask(sys.argv[1:], os.environ)
    except BaseException:
        # As an error in the copy's first lines ends it: never a second try
        # at a spawn that may already be running.
        import traceback

        traceback.print_exc()
        os._exit(1)
    if served is not None:
        os._exit(served)


def main():
    argv = list(getattr(sys, "orig_argv", ()))
    at = len(argv) - len(sys.argv)
    # Only where exec keeps the pid: the process is its parent's child and an agent's stand-in.
    if os.name != "posix" or not sys.argv or at < 1 or argv[at] != sys.argv[0] or not sys.executable:
        return
    found = compiled_copy(sys.argv[0], os.environ)
    if found is None:
        return
    copy, source = found
    session = os.environ.get("{ENV_SESSION}")  # a nested spawn's; compile nothing for a root or a session with no server
    if session and os.environ.get("{ENV_NO_FORKSERVER}") != "1" and os.path.exists(os.path.join(session, "{FORKSERVER_SOCKET}")):
        stand_in(copy, source)
    import _signal

    # Python ignores these at start; the new interpreter does it again, and a
    # failed exec puts them back as they were.
    saved = [(n, _signal.signal(n, _signal.SIG_DFL)) for n in (_signal.SIGPIPE, _signal.SIGXFSZ)]
    try:
        os.execv(sys.executable, argv[:at] + [copy] + argv[at + 1 :])
    except OSError:
        for n, handler in saved:
            _signal.signal(n, handler)


main()
'''


def compiled_name(source_path: Path, source: bytes) -> str:
    """The file name of the compiled copy of the spawn.py at source_path (resolved) with these bytes."""
    import _imp

    digest = _imp.source_hash(COMPILED_HASH_KEY, os.fsencode(source_path) + b"\0" + source).hex()
    return f"spawn-{digest}.{sys.implementation.cache_tag}.pyc"


def copy_is_trusted(folder: Path, copy: Path, source: bytes) -> bool:
    """Whether copy (in folder) may run for a spawn.py with these bytes: the
    hook's check of the same name, line for line (test_fast_start compares
    them). The copy is opened without following a link, and its owner and
    mode are read from that open file, so what is checked is what was read."""
    import _imp
    import importlib.util
    import stat

    try:
        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for st in (os.stat(folder), os.fstat(fd)):
            if st.st_uid != os.getuid() or st.st_mode & COMPILED_MODE_FORBIDDEN:
                return False
        header = os.read(fd, 16) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    raw_magic = int.from_bytes(importlib.util.MAGIC_NUMBER, "little")
    return header == importlib.util.MAGIC_NUMBER + PYC_CHECKED_HASH + _imp.source_hash(raw_magic, source)


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


def fast_start_site() -> Path | None:
    """The site-packages of the virtual environment running us, or None for a base interpreter."""
    if sys.prefix == sys.base_prefix:
        return None
    import sysconfig

    site = Path(sysconfig.get_path("purelib"))
    return site if site.is_relative_to(sys.prefix) else None


def install_fast_start(environ: Mapping[str, str]) -> None:
    """Put the start-up hook (FAST_START_HOOK) into the virtual environment running this source.

    Never into a base interpreter's site-packages, which every program on
    the machine shares. The module goes first: a .pth line naming a missing
    module would print an error at every start. Best effort: a read-only
    environment (inside a sandbox) just keeps compiling.
    """
    if environ.get(ENV_NO_FAST_START) == "1" or Path(__file__).suffix != ".py":
        return  # and a compiled copy never pays for the sysconfig import below
    site = fast_start_site()
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

"""Written by spawn.py (docs/benchmarks.md: "Fast start"); SPAWN_NO_FAST_START=1 turns it off.

Runs at every interpreter start in this environment, from _spawn_fast_start.pth.
If the script on the command line has a compiled copy in spawn.py's cache,
run that copy instead of compiling the source: in this interpreter once site
has finished, else by exec'ing the same interpreter on it.
Remove _spawn_fast_start.pth to remove it.
"""

# spawn.py runs this module's code too (bundled, as src/spawnlib/programs/fast_start_hook.py):
# the cache's place, a copy's name and the trust in a copy are defined here
# alone. Builtin modules only: for every other program in the environment it
# costs a look at sys.argv, or for a .py file one read and a few stats.

import os
import stat
import sys

FAST_START_MODULE = "_spawn_fast_start"  # this file's name in site-packages, and its .pth's
ENV_NO_FAST_START = "SPAWN_NO_FAST_START"  # 1: neither install nor use the hook
# A copy is named by the source's path and bytes: the path because the code
# finds schemas/ and sessions/ beside the file it was compiled from, so two
# projects' identical copies must not share one.
COMPILED_DIR = "compiled"
COMPILED_HASH_KEY = 0x7370_6177_6E  # any fixed key: the name carries the cache tag too
# A copy is run or handed out only when copy_is_trusted: the cache folder and
# the copy are the user's and nobody else's to replace, the copy is a regular
# file, and its header says it was compiled from the source's own bytes (a
# checked-hash pyc, PEP 552): the name alone is no proof, as any file can be
# put at a name. The header is no signature either: what keeps a forged copy
# out is that no contained agent can write the cache (docs/guarantees.md).
COMPILED_MODE_FORBIDDEN = 0o022  # group- or other-writable: another user's to replace
PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # PEP 552 flags: hash-based, checked against the source
# spawn.py's own names for these, which this file can't import when it runs
# as the hook (test_fast_start checks they agree).
HOOK_ENV_CACHE_DIR = "SPAWN_CACHE_DIR"  # ENV_CACHE_DIR
HOOK_ENV_SESSION = "SPAWN_SESSION"  # ENV_SESSION
HOOK_ENV_NO_FORKSERVER = "SPAWN_NO_FORKSERVER"  # ENV_NO_FORKSERVER
HOOK_FORKSERVER_SOCKET = "forkserver.sock"  # FORKSERVER_SOCKET
# For a nested spawn, the hook runs spawn.py's stand-in itself, from the
# script's own bytes: when the session's fork server takes the spawn, no second
# interpreter starts to load the copy (~20 ms a level). tools/bundle.py writes
# these two lines around the stand-in's code, which defines
# forkserver_stand_in(argv, environ) -> exit code or None; a spawn.py without
# them (another version's) is run as a copy only. A later version that changes
# the contract changes the markers.
STAND_IN_BEGIN = b"\n# >>> stand-in: the fast-start hook runs from here to the end marker >>>\n"
STAND_IN_END = b"\n# <<< end of the stand-in: forkserver_stand_in(argv, environ) -> int | None <<<\n"
ANNOTATIONS_FLAG = 0x1000000  # __future__.annotations.compiler_flag: the stand-in's own future import


def cache_folder(environ: "dict[str, str] | os._Environ[str]") -> str:
    """The per-user cache: $SPAWN_CACHE_DIR, else $XDG_CACHE_HOME/spawn, else ~/.cache/spawn."""
    if environ.get(HOOK_ENV_CACHE_DIR):
        return os.path.expanduser(environ[HOOK_ENV_CACHE_DIR])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(base), "spawn")


def compiled_name(path: "str | os.PathLike[str]", source: bytes) -> str:
    """The file name of the compiled copy of the spawn.py at path (resolved) with these bytes."""
    import _imp

    digest = _imp.source_hash(COMPILED_HASH_KEY, os.fsencode(path) + b"\0" + source).hex()
    return "spawn-" + digest + "." + str(sys.implementation.cache_tag) + ".pyc"


def pyc_header(source: bytes) -> bytes:
    """The 16-byte header of a copy compiled from source: magic, checked-hash flags, the source's hash."""
    import _frozen_importlib_external as bootstrap
    import _imp

    magic = bootstrap.MAGIC_NUMBER
    return magic + PYC_CHECKED_HASH + _imp.source_hash(int.from_bytes(magic, "little"), source)


def copy_is_trusted(folder: "str | os.PathLike[str]", copy: "str | os.PathLike[str]", source: bytes) -> bool:
    """Ours, a regular file (not a link), nobody else's to replace, and compiled from source.

    The copy is opened without following a link, and its owner and mode are
    read from that open file, so what is checked is what was read."""
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
    return header == pyc_header(source)


def compiled_copy(script: str, environ: "dict[str, str] | os._Environ[str]") -> "tuple[str, bytes] | None":
    """The compiled copy to run for script, and the script's bytes; or None."""
    if not script.endswith(".py") or environ.get(ENV_NO_FAST_START) == "1" or sys.flags.optimize:
        return None
    try:
        path = os.path.realpath(script)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO's bytes are the script's: Python must read them, not us
        with open(path, "rb") as fh:
            source = fh.read()
        folder = os.path.join(cache_folder(environ), COMPILED_DIR)
        copy = os.path.join(folder, compiled_name(path, source))
    except (OSError, ValueError):
        return None
    # A planted or stale copy is never run: the source runs instead.
    return (copy, source) if copy_is_trusted(folder, copy, source) else None


def hook_stand_in(copy: str, source: bytes) -> None:
    """Hand this spawn to its session's fork server from here, as the copy's
    first lines would: the same code, compiled from the script's own bytes
    (its stand-in, between the markers), minus an interpreter's start.
    Returns only if the server doesn't take it (none, a refusal, a verb it
    doesn't run): then the copy runs, and asks again itself.
    """
    start = source.find(STAND_IN_BEGIN)
    end = source.find(STAND_IN_END, start)
    if start < 0 or end < 0:
        return
    try:
        # The file's own future import, and its own line numbers in a traceback.
        code = compile(b"\n" * source.count(b"\n", 0, start) + source[start:end], sys.argv[0], "exec", ANNOTATIONS_FLAG, True)
        scope: dict[str, object] = {"__name__": FAST_START_MODULE + ".stand_in", "__file__": copy}
        exec(code, scope)
        ask = scope["forkserver_stand_in"]
    except Exception:
        return
    if not callable(ask):
        return
    try:
        served = ask(sys.argv[1:], os.environ)
    except BaseException:
        # As an error in the copy's first lines ends it: never a second try
        # at a spawn that may already be running.
        import traceback

        traceback.print_exc()
        os._exit(1)
    if isinstance(served, int):
        os._exit(served)


def run_at_file_start(copy: str, source: bytes) -> bool:
    """Have this interpreter run the copy where it would run the script; False
    where that can't be arranged, and the caller execs the copy instead.

    Python raises the audit event cpython.run_file once it has started up
    (site done: every .pth file, sitecustomize) and holds no import lock: the
    hook runs the copy there and exits, so no second interpreter starts (~20
    ms a spawn). Not for -i, which wants the interpreter after the script.
    """
    if sys.flags.inspect or sys.flags.interactive or "__main__" not in sys.modules:
        return False
    header = pyc_header(source)
    pending = [copy]

    def at_event(event: str, args: tuple[object, ...]) -> None:
        if event == "cpython.run_file" and pending:
            run_copy(pending.pop(), header)  # returns only if the copy changed since: the script runs instead

    sys.addaudithook(at_event)  # for the process's life, as every audit hook: one comparison an event
    return True


def run_copy(copy: str, header: bytes) -> None:
    """Run the copy as `python COPY ARGS` would, then exit as it would: never
    returns, unless the copy's header is no longer the one that was trusted."""
    import marshal

    try:
        with open(copy, "rb") as fh:
            data = fh.read()
        if data[:16] != header:
            return
        code = marshal.loads(memoryview(data)[16:])
    except (OSError, ValueError, EOFError, TypeError):
        return
    sys.argv[0] = copy
    if not sys.flags.safe_path and sys.path:
        # The copy's folder, as `python COPY` has it, not the script's: a
        # project's own mcp/ or anyio/ beside spawn.py never shadows a dependency.
        sys.path[0] = os.path.dirname(copy)
    import _frozen_importlib_external as bootstrap

    scope = sys.modules["__main__"].__dict__
    scope.update(__file__=copy, __cached__=None, __loader__=bootstrap.SourcelessFileLoader("__main__", copy))
    status, interrupted = 0, False
    try:
        exec(code, scope)
    except SystemExit as exc:
        status = exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    finish(status, interrupted)


def exit_status(code: object) -> int:
    """SystemExit's code as Python's exit status: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def finish(status: int, interrupted: bool) -> None:
    """End as the interpreter would after the script: threads joined, atexit
    run, streams flushed; a KeyboardInterrupt's end is by SIGINT."""
    import atexit

    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue
    if interrupted:  # as Python ends on an uncaught one: by SIGINT
        import _signal  # type: ignore[import-not-found,unused-ignore]

        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    os._exit(status & 0xFF)


def hook_main() -> None:
    argv = list(getattr(sys, "orig_argv", ()))
    at = len(argv) - len(sys.argv)
    # Only where exec keeps the pid: the process is its parent's child and an agent's stand-in.
    if os.name != "posix" or not sys.argv or at < 1 or argv[at] != sys.argv[0] or not sys.executable:
        return
    found = compiled_copy(sys.argv[0], os.environ)
    if found is None:
        return
    copy, source = found
    session = os.environ.get(HOOK_ENV_SESSION)  # a nested spawn's; compile nothing for a root or a session with no server
    if session and os.environ.get(HOOK_ENV_NO_FORKSERVER) != "1" and os.path.exists(os.path.join(session, HOOK_FORKSERVER_SOCKET)):
        hook_stand_in(copy, source)
    if run_at_file_start(copy, source):
        return
    import _signal  # type: ignore[import-not-found,unused-ignore]  # signal's C half: builtin (spawn.py's stand-in imports it too)

    # Python ignores these at start; the new interpreter does it again, and a
    # failed exec puts them back as they were.
    saved = [(n, _signal.signal(n, _signal.SIG_DFL)) for n in (_signal.SIGPIPE, _signal.SIGXFSZ)]
    try:
        os.execv(sys.executable, [*argv[:at], copy, *argv[at + 1 :]])
    except OSError:
        for n, handler in saved:
            _signal.signal(n, handler)


if __name__ == FAST_START_MODULE:  # as the hook; spawn.py only uses the functions above
    hook_main()

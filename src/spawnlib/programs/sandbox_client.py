"""The spawn.py inside a sandboxed spawner: hand a spawn, a kill, a wait or a send to its runner's broker.

spawn.py's stand-in runs this before spawn.py's own imports, so a brokered
spawn costs its sandbox an interpreter, json and this file, not the ~100-200
ms that loading all of spawn.py takes; spawn.py's main() runs it too, where
no stand-in ran (the Python API). Unlike the other programs it runs in-process,
after site: it imports json (and ctypes, for inotify) from the stdlib.

sandbox_client(argv, environ) returns None where this spawn.py runs as
usual: outside a sandbox, in one without a request box (a leaf's), for
--help and --version, a dry run, and every first word but kill, wait, send
and a flag (spawn.py's main() refuses the verbs that write the session, and
names a mistyped one). Otherwise it
files the request in the box (docs/sandbox.md, "The broker"), prints the
output its runner streams back and the reply, and returns the reply's exit
code. Errors end here as a `spawn: error:` line and an exit code, as main()
would print them: this is the entry point for what it runs.
"""

import os
import sys

# spawn.py's names for these, which this program can't import when the
# stand-in runs it (test_broker checks they agree).
CLIENT_BROKERED_VERBS = ("kill", "wait", "send")  # BROKERED_VERBS
# The files read here and passed inline (the runner must never read a path for
# the agent: it may read what the sandbox hides). The one list: BROKER_FLAGS
# takes what they become, never them.
CLIENT_INLINED_FILES = {"--task-file": "--task", "--system-prompt-file": "--system-prompt"}
CLIENT_ENV_CALL = "SPAWN_CALL"  # ENV_CALL
CLIENT_REQUESTS_DIR = "requests"  # REQUESTS_DIR
CLIENT_AGENTS_DIR = "agents"  # AGENTS_DIR
CLIENT_SCRATCH_DIR = "scratch"  # SCRATCH_DIR
CLIENT_META = "meta.json"  # META
CLIENT_OUTCOME = "outcome.json"  # OUTCOME
CLIENT_REPLY_SUFFIX = ".reply.json"  # REPLY_SUFFIX
CLIENT_STREAMS = ("stdout", "stderr")  # STREAMS
CLIENT_REPLY_MAX_BYTES = 8 * 1024 * 1024  # BROKER_STDOUT_MAX_BYTES * 8
CLIENT_STDERR_MAX_BYTES = 64 * 1024  # BROKER_STDERR_MAX_BYTES
CLIENT_POLL_S = 0.05  # BROKER_CLIENT_POLL_S
CLIENT_IDLE_S = 1.0  # BROKER_CLIENT_IDLE_S
CLIENT_EXIT_STATE = 3  # ExitCode.STATE
CLIENT_EXIT_REFUSED = 4  # ExitCode.REFUSED
CLIENT_EXIT_INTERRUPTED = 130  # ExitCode.INTERRUPTED
# inotify (Linux): the reply's rename into the box, and the output its runner
# appends as it comes, wake us, never a poll.
IN_MODIFY = 0x02
IN_MOVED_TO = 0x80
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000


class ClientError(Exception):
    """A brokered request that can't go on: its line, and the exit code it ends with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def bwrap_owner() -> "str | None":
    """The agent whose sandbox this process runs in, from that sandbox's bwrap (pid 1 here, which nothing inside can replace).

    bwrap binds what the sandboxed agent may write, its agent directory's
    scratch/ among them; that agent's meta.json is not writable inside.
    """
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if os.path.basename(args[0]) != "bwrap":
        return None
    for i in range(len(args) - 1):
        flag, candidate = args[i], args[i + 1].rstrip("/")
        if flag == "--bind" and os.path.basename(candidate) == CLIENT_SCRATCH_DIR:
            candidate = os.path.dirname(candidate)
        parent = os.path.dirname(candidate)
        if flag == "--bind" and os.path.basename(parent) == CLIENT_AGENTS_DIR and os.path.isfile(os.path.join(candidate, CLIENT_META)):
            return candidate
    return None


def broker_box(owner: str) -> "str | None":
    """The owner's request box, if it has one we may write (a spawner's; a leaf has none)."""
    import json

    try:
        with open(os.path.join(owner, CLIENT_META), "rb") as fh:
            session = json.loads(fh.read(1 << 20)).get("session")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(session, str):
        return None
    box = os.path.join(session, CLIENT_REQUESTS_DIR, os.path.basename(owner))
    return box if os.access(box, os.W_OK) else None


def split_flag(word: str) -> "tuple[str, str | None]":
    name, eq, value = word.partition("=")
    return name, (value if eq else None)


def read_argument_file(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def inlined_argv(argv: "list[str]") -> "list[str]":
    """argv with the files it names read here, in the sandbox, and passed inline (--task-file, --system-prompt-file, --schema PATH).

    The runner must never read a path for the agent: it may read what the sandbox hides.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name in (*CLIENT_INLINED_FILES, "--schema") and value is None and i + 1 < len(argv):
            i += 1
            value = argv[i]
        if name in CLIENT_INLINED_FILES and value is not None:
            try:
                text = read_argument_file(value)
            except (OSError, UnicodeDecodeError) as exc:
                raise ClientError(f"can't read {name} {value}: {exc}; check the path", CLIENT_EXIT_REFUSED) from None
            out += [CLIENT_INLINED_FILES[name], text]
        elif name == "--schema" and value is not None and not value.lstrip().startswith("{") and os.path.isfile(value):
            try:
                out += [name, read_argument_file(value)]
            except (OSError, UnicodeDecodeError) as exc:
                raise ClientError(f"can't read --schema {value}: {exc}; check the path", CLIENT_EXIT_REFUSED) from None
        else:
            out += [argv[i]] if value is None or "=" in argv[i] else [name, value]
        i += 1
    return out


def steering_argv(argv: "list[str]") -> "list[str]":
    """A brokered verb's argv as its runner takes it: --session dropped (the runner's is the agent's), send's '-' read here."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name == "--session":
            i += 1 if value is not None else 2
            continue
        out.append(argv[i])
        i += 1
    if out[:1] == ["send"] and "-" in out[2:]:
        out[out.index("-", 2)] = sys.stdin.read()
    return out


class BoxEvents:
    """An inotify fd on the box (IN_MOVED_TO, IN_MODIFY), or none: then the client polls."""

    def __init__(self, box: str) -> None:
        self.fd = self.wd = -1
        if not sys.platform.startswith("linux"):
            return
        try:
            import ctypes

            self.libc = ctypes.CDLL(None, use_errno=True)
            self.fd = int(self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
            if self.fd >= 0:
                self.wd = int(self.libc.inotify_add_watch(self.fd, os.fsencode(box), IN_MOVED_TO | IN_MODIFY | IN_ONLYDIR))
        except (OSError, AttributeError, ImportError):
            self.wd = -1
        if self.wd < 0:
            self.close()

    def wait(self) -> None:
        """Until something happens in the box (or a while passes, for the runner's end); without inotify, a short poll."""
        if self.fd < 0:
            import time

            time.sleep(CLIENT_POLL_S)
            return
        import select

        select.select([self.fd], [], [], CLIENT_IDLE_S)
        try:
            while os.read(self.fd, 65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            # Closing an fd that still watches waits out an RCU grace period
            # (7-17 ms); with its watch removed first, that wait is the kernel's.
            if self.wd >= 0:
                self.libc.inotify_rm_watch(self.fd, self.wd)
            os.close(self.fd)
            self.fd = self.wd = -1


def unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        return  # gone already


def write_out(fd: int, data: bytes) -> None:
    """data to fd as it came, after what the text layer above it holds."""
    stream = sys.stdout if fd == 1 else sys.stderr
    if stream is not None:
        stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class StreamedOutput:
    """The request's output, printed as its runner appends it to <id>.stdout and <id>.stderr (the runner's Relay)."""

    def __init__(self, box: str, request_id: str) -> None:
        self.paths = {name: os.path.join(box, f"{request_id}.{name}") for name in CLIENT_STREAMS}
        self.fds: dict[str, int] = {}
        self.printed = dict.fromkeys(CLIENT_STREAMS, 0)

    def pump(self, upto: "dict[str, int] | None" = None) -> None:
        """Print what each file holds past what was printed; with upto (the reply's streamed), exactly that much of each."""
        for name, path in self.paths.items():
            if name not in self.fds:
                try:
                    self.fds[name] = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    continue  # not there yet
            fd = self.fds.get(name)
            while fd is not None:
                want = 1 << 16 if upto is None else min(1 << 16, int(upto.get(name, 0)) - self.printed[name])
                chunk = os.read(fd, want) if want > 0 else b""
                if not chunk:
                    break
                self.printed[name] += len(chunk)
                write_out(1 if name == "stdout" else 2, chunk)

    def close(self) -> None:
        for name, fd in self.fds.items():
            os.close(fd)
            unlink_if_there(self.paths[name])


def print_reply(reply: "dict[str, object]", output: StreamedOutput) -> None:
    """The reply's output, past what was streamed: each stream the runner streamed is printed to its end from its file;
    one it could not stream is printed from the reply, and a cut stderr goes on with the reply's end of it."""
    output.pump()  # opens what it had not yet: a stream only the reply names is printed from the reply
    told, cut = reply.get("streamed"), reply.get("cut")
    streamed = {k: v for k, v in told.items() if k in output.fds and isinstance(v, int)} if isinstance(told, dict) else {}
    output.pump(streamed)
    cut = cut if isinstance(cut, list) else []
    if "stdout" not in streamed:
        write_out(1, str(reply.get("stdout", "")).encode())
    if "stderr" not in streamed:
        write_out(2, str(reply.get("stderr", "")).encode())
    elif "stderr" in cut:
        note = f"\n[spawn: stderr cut here by the agent's runner; its last {CLIENT_STDERR_MAX_BYTES} bytes follow]\n"
        write_out(2, (note + str(reply.get("stderr", ""))).encode())


def await_reply(box: str, request_id: str, owner: str, output: StreamedOutput, events: "BoxEvents | None") -> int:
    """Print the request's output as it comes and the runner's reply once it is in the box; return its exit code.

    ClientError if the runner ends first.
    """
    import json

    reply_path = os.path.join(box, request_id + CLIENT_REPLY_SUFFIX)
    while True:
        output.pump()
        try:
            with open(reply_path, "rb") as fh:
                data = fh.read(CLIENT_REPLY_MAX_BYTES + 1)
        except FileNotFoundError:
            data = None
        if data is not None:
            try:
                reply = json.loads(data) if len(data) <= CLIENT_REPLY_MAX_BYTES else None
            except (ValueError, RecursionError):
                reply = None
            if not isinstance(reply, dict):
                raise ClientError(f"the reply to request {request_id} is not a JSON object; its runner wrote it wrong", CLIENT_EXIT_STATE)
            unlink_if_there(reply_path)
            print_reply(reply, output)
            code = reply.get("exit_code", CLIENT_EXIT_STATE)
            return code if isinstance(code, int) else CLIENT_EXIT_STATE
        if os.path.exists(os.path.join(owner, CLIENT_OUTCOME)):
            raise ClientError(f"the runner of {os.path.basename(owner)} ended before it answered request {request_id}", CLIENT_EXIT_STATE)
        if events is None:
            import time

            time.sleep(CLIENT_POLL_S)
        else:
            events.wait()


def file_request(box: str, argv: "list[str]", environ: "dict[str, str] | os._Environ[str]") -> int:
    """File the request in the box, then print its output and reply; the reply's exit code."""
    import json

    request_id = os.urandom(8).hex()
    events = BoxEvents(box)  # watched before the request is filed: no event is missed
    try:
        request: dict[str, object] = {
            "argv": steering_argv(argv) if argv[0] in CLIENT_BROKERED_VERBS else inlined_argv(argv),
            "cwd": os.getcwd(),
        }
        if environ.get(CLIENT_ENV_CALL):  # this Bash call's token, when the agent's CLI hosts in-process agents
            request["call"] = environ[CLIENT_ENV_CALL]
        tmp = os.path.join(box, f".{request_id}.tmp")
        with open(tmp, "xb") as fh:
            fh.write(json.dumps(request).encode())
        os.rename(tmp, os.path.join(box, f"{request_id}.json"))
        owner = os.path.join(os.path.dirname(os.path.dirname(box)), CLIENT_AGENTS_DIR, os.path.basename(box))
        output = StreamedOutput(box, request_id)
        try:
            return await_reply(box, request_id, owner, output, events if events.fd >= 0 else None)
        finally:
            output.close()
    finally:
        events.close()


def sandbox_client(argv: "list[str]", environ: "dict[str, str] | os._Environ[str]") -> "int | None":
    """Hand argv to our sandbox's runner and return its exit code; None where spawn.py runs it as usual (the module's docstring)."""
    if not argv or {"-h", "--help", "--version"} & set(argv):
        return None
    if argv[0] not in CLIENT_BROKERED_VERBS and not (argv[0].startswith("-") and "--dry-run" not in argv):
        return None
    owner = bwrap_owner()
    box = None if owner is None else broker_box(owner)
    if box is None:
        return None
    try:
        return file_request(box, argv, environ)
    except ClientError as exc:
        message, code = str(exc), exc.code
    except KeyboardInterrupt:
        message, code = "interrupted", CLIENT_EXIT_INTERRUPTED
    except (OSError, ValueError) as exc:
        message, code = f"{exc}; check the session directory and permissions", CLIENT_EXIT_STATE
    write_out(2, f"spawn: error: {message}\n".encode())
    return code

"""The guard above a root without a cgroup: run by `python -c` in the process the user started.

argv: the script, the pipe's read end, the runner's pid (processes.fork_below_guard
says why). It passes the terminal signals on to the runner and exits as the
runner did; if the runner left no outcome, it becomes `spawn.py _guard --above`.
"""

import os
import signal
import sys

script, pipe, runner = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
passed = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
status: int | None = None
while status is None:
    try:
        while status is None:
            pid, st = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid == runner:
                status = st
    except ChildProcessError:
        break
    if status is None:
        info = signal.sigwaitinfo(passed | {signal.SIGCHLD})
        if info.si_signo in passed and info.si_code != 0x80:  # 0x80, SI_KERNEL: the terminal's
            try:
                os.kill(runner, info.si_signo)
            except OSError:
                pass
code = os.waitstatus_to_exitcode(status) if status is not None else 3  # ExitCode.STATE
os.set_blocking(pipe, False)
said = b""
try:
    while chunk := os.read(pipe, 65536):
        said += chunk
except BlockingIOError:
    pass
agent_dir, entry = [*said.decode(errors="replace").splitlines(), "", ""][:2]
if agent_dir and not os.path.exists(os.path.join(agent_dir, "outcome.json")):
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.execv(sys.executable, [sys.executable, script, "_guard", agent_dir, f"--above={code}"])


def below() -> "list[int]":
    """Every process below us, from /proc."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            parents.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


for _ in range(100):  # orphans re-parent to us as their parents die
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        break
    for pid in below():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    signal.sigtimedwait({signal.SIGCHLD}, 0.05)
if entry:
    try:
        os.unlink(entry)
    except OSError:
        pass
if code < 0 and -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGPIPE):
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
    os.kill(os.getpid(), -code)
os._exit(code if code >= 0 else 128 - code)

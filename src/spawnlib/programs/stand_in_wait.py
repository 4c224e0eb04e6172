"""A stand-in's wait for the agent its fork server forked: run by `python -I -S -c`, or exec'd in-process.

argv: socket fd, agent pid, what was already read (hex), signal numbers. It
passes those signals on to the agent and ends as the agent did: its exit
code, else the last signal it passed on, else SIGKILL.
"""

import _signal  # type: ignore[import-not-found]  # signal's C half: builtin, unlike signal
import posix
import sys


def stand_in_wait(fd: int, pid: int, got: bytes, signals: "list[int]") -> None:
    """Pass signals on to pid until its exit code (a line of JSON) arrives on fd, then end as it did."""
    last = [9]

    def forward(signum: int, frame: object) -> None:
        last[0] = signum
        try:
            posix.kill(pid, signum)
        except OSError:
            pass

    for signum in signals:
        _signal.signal(signum, forward)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
    while b"\n" not in got:
        try:
            chunk = posix.read(fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            break
        got += chunk
    line = got.partition(b"\n")[0].replace(b" ", b"")
    if line.startswith(b'{"exit":') and line.endswith(b"}"):
        try:
            posix._exit(int(line[8:-1]))
        except ValueError:
            pass
    if last[0] != 9:
        _signal.signal(last[0], _signal.SIG_DFL)
    posix.kill(posix.getpid(), last[0])
    posix.kill(posix.getpid(), 9)


if __name__ == "__main__":
    stand_in_wait(int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]), [int(n) for n in sys.argv[4].split(",")])

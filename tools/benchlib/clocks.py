"""When things happened and what they cost: a marker's creation as inotify saw it, psutil's clock
against time.time(), the CPU of reaped children.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path


def psutil_clock_offset() -> float:
    """psutil's create_time minus time.time() for the same instant.

    create_time is the boot time plus the start in clock ticks; that boot time
    drifts from the wall clock (NTP steps, a suspended VM), by most of a second
    on some machines, so a create_time compared with time.time() needs this.
    """
    import psutil

    before = time.time()
    proc = subprocess.Popen(["sleep", "1"])
    after = time.time()
    try:
        return psutil.Process(proc.pid).create_time() - (before + after) / 2
    finally:
        proc.kill()
        proc.wait()


def children_cpu() -> float:
    """CPU seconds of this process's reaped descendants. Every process of a spawn.py tree is
    reaped by its parent or by a subreaper of the tree, so a tree's whole CPU lands here when
    its root is reaped: every CLI, runner, fork server, launcher and guard."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class MarkerClock:
    """When a marker really appeared: a thread blocked on inotify stamps its IN_CREATE.

    A file's mtime comes from the kernel's coarse clock, which lags the real
    time by up to a tick (4.4 ms median measured here), so latencies from the
    mtime carry that lag; this stamp carries only the thread's wake-up delay.
    Linux only; elsewhere `seen_ns` stays None.
    """

    def __init__(self, directory: Path, name: str = ".done") -> None:
        self.name = name.encode()
        self.seen_ns: int | None = None
        self.fd = -1
        if sys.platform.startswith("linux"):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            self.fd = int(libc.inotify_init1(0o2000000))  # blocking, close-on-exec
            if self.fd >= 0 and libc.inotify_add_watch(self.fd, os.fsencode(directory), 0x100 | 0x80) < 0:
                os.close(self.fd)
                self.fd = -1
        self.thread = threading.Thread(target=self._run, daemon=True)
        if self.fd >= 0:
            self.thread.start()

    def _run(self) -> None:
        import struct

        with contextlib.suppress(OSError):
            while self.seen_ns is None:
                data = os.read(self.fd, 65536)
                now = time.time_ns()
                offset = 0
                while offset + 16 <= len(data):
                    length = struct.unpack_from("iIII", data, offset)[3]
                    if data[offset + 16 : offset + 16 + length].rstrip(b"\0") == self.name:
                        self.seen_ns = now
                    offset += 16 + length

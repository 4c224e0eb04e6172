"""The summed memory of process trees, sampled on a thread (P1b, P6, P10)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class TreeMemory:
    """Peak over time of the summed memory of a set of process trees, split by side.

    "python" is spawn.py's side: every Python process (runners, stand-ins, the
    fork server) and the guards, which wait as /bin/sh until they have work;
    "other" the rest (claude CLIs, their shells). PSS counts a
    page shared by n processes as 1/n in each, so pages a fork server shares
    with its children are counted once, as the kernel holds them; RSS counts
    them in every process.
    """

    peak_python_pss: int = 0
    peak_other_pss: int = 0
    peak_total_pss: int = 0
    peak_python_rss: int = 0
    peak_other_rss: int = 0
    samples: int = 0


class MemorySampler:
    """Samples the process trees under `roots` on a thread until stopped."""

    def __init__(self, roots: Callable[[], Sequence[int]], interval: float = 0.25, *, pss: bool = True) -> None:
        self.roots = roots
        self.interval = interval
        self.pss = pss
        """PSS as well as RSS: smaps, a walk of every mapping of every process (the CLIs' are large).
        Without it, RSS alone (statm), far cheaper; but each sample still walks /proc for the tree,
        so P10 samples in runs of their own (chain_run)."""
        self.result = TreeMemory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            procs: dict[int, psutil.Process] = {}
            for pid in self.roots():
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    procs[pid] = root
                    for child in root.children(recursive=True):
                        procs[child.pid] = child
            sums = {"python_pss": 0, "other_pss": 0, "python_rss": 0, "other_rss": 0}
            for proc in procs.values():
                with contextlib.suppress(psutil.Error):
                    side = "python" if proc.name().startswith("python") or "_guard" in proc.cmdline() else "other"
                    info = proc.memory_full_info() if self.pss else proc.memory_info()
                    sums[f"{side}_pss"] += int(getattr(info, "pss", info.rss))
                    sums[f"{side}_rss"] += int(info.rss)
            r = self.result
            r.samples += 1
            r.peak_python_pss = max(r.peak_python_pss, sums["python_pss"])
            r.peak_other_pss = max(r.peak_other_pss, sums["other_pss"])
            r.peak_total_pss = max(r.peak_total_pss, sums["python_pss"] + sums["other_pss"])
            r.peak_python_rss = max(r.peak_python_rss, sums["python_rss"])
            r.peak_other_rss = max(r.peak_other_rss, sums["other_rss"])
            self._stop.wait(self.interval)

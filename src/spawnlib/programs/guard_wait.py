"""An agent's guard where there is no /bin/sh: run by `python -I -S -c`, argv `spawn.py _guard DIR`.

The runner writes SETTLED (processes.GUARD_SETTLED) to our stdin right before
its exit when it left the guard nothing to do; otherwise (EOF: it died) the
full guard runs.
"""

import os
import sys

SETTLED = b"settled\n"  # processes.GUARD_SETTLED: test_forkserver checks they agree

if sys.stdin.buffer.read() == SETTLED:
    os._exit(0)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])

"""`npusim sweep` in a child process, stopped (a signal) once its progress bar shows
that some points are done: what the Ctrl-C, kill and resume tests share."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep_until(argv: list[str], done: int) -> subprocess.Popen:
    """Start `npusim ARGV --progress` and return once its (forced) bar shows at least
    `done` points finished and at least one not; stdout is discarded, stderr stays open."""
    proc = subprocess.Popen([sys.executable, "-m", "npusim", *map(str, argv), "--progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    seen = b""
    while True:
        shown = re.findall(rb" (\d+)/(\d+) points", seen)
        if shown and done <= int(shown[-1][0]) < int(shown[-1][1]):
            return proc
        byte = proc.stderr.read(1)
        assert byte, f"the sweep ended before it was stopped: {seen.decode()}"
        seen += byte

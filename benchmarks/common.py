"""What several benchmark scripts share (they run as `python benchmarks/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: VmHWM of its own memory map (Linux). Not ru_maxrss, which also
    counts the parent's memory the child ran in between fork and exec."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: the best there is

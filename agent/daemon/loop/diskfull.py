"""A full state disk, as one condition of the node rather than an error per attempt: it
starts with the first start refused or write failed for lack of space (ENOSPC, SQLite's
SQLITE_FULL), is logged once then, with no traceback (it is known, not the agent's fault),
counts what it refused while it lasts, and clears once the state dir's filesystem has room
again (`CLEAR_FREE_BYTES` free, and a free inode): logged once more, with the counts.

The loop reports into it and looks whether it cleared (`check`) at each step; the metrics
read `full` and `totals`; Health reads `health`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..exec.shim import AGENT_RESERVE

# What a failure was when the disk was full: the counter's `operation` label.
OPERATIONS = ("start", "write")
# The room that ends the condition: the reserve task output leaves the agent (a few hundred
# starts' records and store pages, not one).
CLEAR_FREE_BYTES = AGENT_RESERVE
RETRY_S = 1.0  # while full, how often the loop looks again

log = logging.getLogger("xhagent")


def has_room(path: Path) -> bool:
    """Whether the filesystem of `path` has CLEAR_FREE_BYTES and an inode for the agent."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    inodes = st.f_files == 0 or st.f_favail > 0  # 0 files: the filesystem counts none
    return st.f_bavail * st.f_frsize >= CLEAR_FREE_BYTES and inodes


class DiskFull:
    def __init__(self, state_dir: Path, room: Callable[[Path], bool] = has_room):
        self.state_dir = Path(state_dir)
        self._room = room
        self._lock = threading.Lock()  # the loop reports; scrapes and Health read
        self._totals = dict.fromkeys(OPERATIONS, 0)
        self._since: float | None = None  # wall-clock time it started; None: not full
        self._first = ""  # what was refused first, one line
        self._counts = dict.fromkeys(OPERATIONS, 0)  # while it lasts

    def failed(self, operation: str, message: str) -> None:
        """`operation` (start, write) was refused for lack of space; `message` says which."""
        with self._lock:
            self._totals[operation] += 1
            self._counts[operation] += 1
            if self._since is not None:
                return
            self._since, self._first = time.time(), " ".join(message.split())[:300]
        log.error(
            "state disk full: %s; starts are refused and writes fail until %s has room",
            self._first,
            self.state_dir,
        )

    def check(self) -> bool:
        """While full, whether the state dir has room again (then the condition clears, and
        is logged with what it refused); True while it stays full."""
        if self._since is None:
            return False
        if not self._room(self.state_dir):
            return True
        with self._lock:
            since, counts = self._since, self._counts
            self._since, self._counts = None, dict.fromkeys(OPERATIONS, 0)
        if since is not None:
            log.warning(
                "state disk has room again after %.1fs full: %d start(s) refused, %d write(s) "
                "failed meanwhile (the first: %s)",
                time.time() - since,
                counts["start"],
                counts["write"],
                self._first,
            )
        return False

    @property
    def full(self) -> bool:
        return self._since is not None

    def totals(self) -> dict[str, int]:
        """Failures for lack of space since the agent started, by operation."""
        with self._lock:
            return dict(self._totals)

    def health(self) -> str | None:
        """None unless full; else one line saying since when and what it refused."""
        with self._lock:
            if self._since is None:
                return None
            when = time.strftime("%H:%M:%S", time.localtime(self._since))
            return (
                f"state disk full since {when}: {self._counts['start']} start(s) refused, "
                f"{self._counts['write']} write(s) failed (the first: {self._first})"
            )
